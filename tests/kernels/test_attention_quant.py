"""The attention output quantized in the attention kernel for the next matmul
(cuda/attention_quant.cuh, through the CUDA backend's attention_matmul, luce/ops/cuda_fused_ops.py)
on a GPU: bitwise the composition (luce.ops.api.FusedOps: attention, then the matmul that
quantizes its x itself) and LUCE_ATTN_QUANT=0, close to luce/ref/norm_quant.py attention_matmul,
at the Qwen2.5-Coder-1.5B (12 / 2 heads, D 128) and 0.5B (14 / 2, D 64) shapes over key counts
that cross chunk boundaries, 1 to 9 decode rows, a padding segment and a tree. The same check on
the CPU: tests/kernels/test_attention_quant_emulated.py."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from luce.models.kv_cache import PagedKV
from luce.models.packer import SegmentSpec, build_batch
from luce.ops.api import FusedOps
from luce.ref import norm_quant as ref_fused
from tests.kernels.test_matmul import assert_rows_close, weights

SHAPES = {"1.5b": (12, 2, 128, Q.Q4_K), "0.5b": (14, 2, 64, Q.Q8_0)}
KEYS = [1, 31, 33, 100, 257, 1100, 4500]   # one chunk, several, partial last ones, 256-key chunks


@pytest.fixture(scope="module")
def cuda():
    from luce.ops import get_backend

    return get_backend("cuda")


@pytest.fixture(autouse=True)
def fused_on(monkeypatch):
    """The fused form is off by default (slower on the H200): these tests turn it on."""
    monkeypatch.setenv("LUCE_ATTN_QUANT", "1")


def decode_batch(key_counts, tree: bool = False):
    """An AR row per key count (slot i, its pages consecutive from page_base), a padding segment
    after the first and (tree) a 3-node tree on the last slot."""
    specs, page = [], 0
    for i, n in enumerate(key_counts):
        pages = -(-n // 16)
        specs.append(SegmentSpec(i, [5], n - 1, list(range(page, page + pages))))
        page += pages
        if i == 0:
            specs.append(SegmentSpec(-1, [0], 0, []))
    if tree:
        specs[-1] = SegmentSpec(len(key_counts) - 1, [5, 6, 7], key_counts[-1] - 1,
                                specs[-1].pages + [page], parents=[-1, 0, 0])
        page += 1
    return build_batch(specs), page


def run_both(cuda, shape, key_counts, tree=False, seed=0):
    hq, hkv, d, qtype = SHAPES[shape]
    batch, n_pages = decode_batch(key_counts, tree)
    rng = np.random.default_rng(seed)
    kv = PagedKV(n_pages + 1, hkv, d, zeros=cuda.zeros)
    k_np = rng.standard_normal(kv.k.shape).astype(np.float32)
    v_np = rng.standard_normal(kv.v.shape).astype(np.float32)
    kv.k, kv.v = cuda.asarray(k_np), cuda.asarray(v_np)
    q = rng.standard_normal((batch.n_rows, hq, d)).astype(np.float32)
    raw, dense = weights(qtype, 96, hq * d, seed)
    w = cuda._upload_weight(raw, int(qtype), (96, hq * d), f"wo{seed}")
    args = (cuda.asarray(q), kv, batch, 1.0 / np.sqrt(d), True, w)
    got = cuda.to_numpy(cuda.attention_matmul(*args, prefill_spans=batch.prefill_spans))
    want = cuda.to_numpy(FusedOps.attention_matmul(cuda, *args, prefill_spans=batch.prefill_spans))
    return got, want, (q, k_np, v_np, batch, dense)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("keys", [KEYS[:1], KEYS[1:3], KEYS, KEYS[3:5] * 4 + [KEYS[-1]]],
                         ids=["1row", "2rows", "7rows", "9rows"])
def test_attention_matmul_is_the_unfused_bits(cuda, shape, keys):
    got, want, (q, k, v, batch, dense) = run_both(cuda, shape, keys, seed=len(keys))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    ref = ref_fused.attention_matmul(q, k, v, batch.qo_indptr, batch.kv_indptr, batch.kv_indices,
                                     batch.kv_last_page_len, batch.seq_slots, 1.0 / np.sqrt(q.shape[2]), True, dense)
    live = batch.seq_slots[np.searchsorted(batch.qo_indptr, np.arange(batch.n_rows), side="right") - 1] >= 0
    assert_rows_close(got[live], ref[live], "matmul_blocks")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_attention_matmul_tree_rows_and_switch(cuda, shape, monkeypatch):
    got, want, _ = run_both(cuda, shape, [40, 300], tree=True)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    monkeypatch.setenv("LUCE_ATTN_QUANT", "0")
    off, _, _ = run_both(cuda, shape, [40, 300], tree=True)
    assert np.array_equal(off.view(np.uint32), got.view(np.uint32))
