"""The attention input fused into a decode step's attention launch (luce_rope_kv_attention through
the CUDA backend's rope_kv_attention, luce/ops/cuda_fused_ops.py) on a GPU: bitwise the two
launches it replaces (luce.ops.api.FusedOps: rope_kv_write, then attention) in the output and
every KV byte, at D 64 and 128, with and without the q/k norms, GQA groups 1..7, rows inside one
chunk, across chunk boundaries and on a page / chunk boundary, padding; a row the same bits in
any batch; steps it does not fuse unchanged; a dense model's replayed decode step one launch
fewer a layer with the same tokens. tests/kernels/test_rope_kv_attention_emulated.py runs the
kernels' source on the CPU."""
from __future__ import annotations

import numpy as np
import pytest

from luce.models.kv_cache import PAGE_SIZE, PagedKV, pages_needed
from luce.ops.api import FusedOps
from luce.ref.rope_kv_attention import rope_kv_attention as reference
from tests.kernels.tolerances import tolerance

pytestmark = pytest.mark.gpu
THETA, EPS = 1e6, 1e-6


@pytest.fixture(scope="module")
def cuda():
    from luce.ops import get_backend

    return get_backend("cuda")


def decode_step(rng, specs, hq, hkv, d, qk_norm):
    """(batch, pages k, v [host], qkv [T, (hq + 2 hkv) d], norms) of AR rows (slot, kv_len) and
    padding segments (slot -1, rows) over shuffled pages."""
    from luce.models import SegmentSpec, build_batch

    n_pages = sum(pages_needed(n) for s, n in specs if s >= 0) + 2
    free = list(rng.permutation(n_pages))
    segments = []
    for slot, n in specs:
        if slot < 0:
            segments.append(SegmentSpec(-1, [0] * n, 0, []))
            continue
        pages, free = [int(p) for p in free[:pages_needed(n)]], free[pages_needed(n):]
        segments.append(SegmentSpec(slot, [1], n - 1, pages))
    batch = build_batch(segments)
    k, v = (rng.standard_normal((n_pages, PAGE_SIZE, hkv, d)).astype(np.float32) for _ in range(2))
    qkv = (2 * rng.standard_normal((batch.n_rows, (hq + 2 * hkv) * d))).astype(np.float32)
    norms = [(1 + 0.1 * rng.standard_normal(d)).astype(np.float32) for _ in range(2)] if qk_norm else [None, None]
    return batch, k, v, qkv, norms


def run(cuda, batch, k, v, qkv, norms, hq, d, fused=True):
    kv = PagedKV(k.shape[0], k.shape[2], d, zeros=cuda.zeros)
    kv.k, kv.v = cuda.asarray(k), cuda.asarray(v)
    args = ([cuda.asarray(qkv)], kv, batch, hq, d, THETA, (), *(None if n is None else cuda.asarray(n) for n in norms),
            EPS, 1.0 / np.sqrt(d))
    out = cuda.rope_kv_attention(*args) if fused else FusedOps.rope_kv_attention(cuda, *args)
    return cuda.to_numpy(out), cuda.to_numpy(kv.k), cuda.to_numpy(kv.v)


def same_bits(a, b):
    return np.array_equal(np.ascontiguousarray(a).view(np.uint32), np.ascontiguousarray(b).view(np.uint32))


SPECS = [(0, 1), (1, 17), (-1, 3), (2, 32), (3, 33), (4, 48), (5, 160), (6, 513), (7, 1500), (-1, 0)]


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("qk_norm", [False, True], ids=["qwen2", "qwen3"])
@pytest.mark.parametrize("hq,hkv", [(2, 2), (4, 2), (3, 1), (8, 2), (10, 2), (12, 2), (14, 2)])
def test_fused_decode_input_is_the_two_launches_bits(cuda, d, qk_norm, hq, hkv):
    rng = np.random.default_rng(d + hq)
    batch, k, v, qkv, norms = decode_step(rng, SPECS, hq, hkv, d, qk_norm)
    assert batch.decode_only
    got = run(cuda, batch, k, v, qkv, norms, hq, d)
    want = run(cuda, batch, k, v, qkv, norms, hq, d, fused=False)
    for a, b in zip(got, want):
        assert same_bits(a, b)
    T = batch.n_rows
    pages, offsets, _ = batch.row_kv_locations()
    kv_dst = np.where(pages >= 0, pages * PAGE_SIZE + offsets, -1)
    kr, vr = k.copy(), v.copy()
    q_, k_, v_ = (qkv[:, a:b].reshape(T, -1, d) for a, b in ((0, hq * d), (hq * d, (hq + hkv) * d),
                                                               ((hq + hkv) * d, qkv.shape[1])))
    csr = (batch.qo_indptr, batch.kv_indptr, batch.kv_indices, batch.kv_last_page_len, batch.seq_slots)
    ref = reference(q_, k_, v_, batch.positions, kv_dst, kr, vr, csr, 1.0 / np.sqrt(d), d, THETA, *norms, EPS)
    np.testing.assert_allclose(got[0], ref, *tolerance("attention"))
    assert same_bits(got[2], vr)


@pytest.mark.parametrize("qk_norm", [False, True], ids=["qwen2", "qwen3"])
def test_a_decode_row_is_the_same_in_any_batch(cuda, qk_norm):
    hq, hkv, d = 12, 2, 128
    rng = np.random.default_rng(3)
    batch, k, v, qkv, norms = decode_step(rng, [(0, 300), (1, 40), (-1, 2), (2, 1000)], hq, hkv, d, qk_norm)
    together = run(cuda, batch, k, v, qkv, norms, hq, d)[0]
    from luce.models import SegmentSpec, build_batch

    for s, row in ((0, 0), (1, 1), (3, 4)):
        n = batch.kv_len(s)
        pages = [int(p) for p in batch.segment_pages(s)]
        alone = build_batch([SegmentSpec(int(batch.seq_slots[s]), [1], n - 1, pages)])
        got = run(cuda, alone, k, v, qkv[row:row + 1], norms, hq, d)[0]
        assert same_bits(got[0], together[row]), f"segment {s}"


@pytest.mark.parametrize("d", [64, 128])
def test_head_groups_writing_one_new_key_never_expose_a_half_done_key(cuda, d):
    """Every head group of a KV head (a block each) writes the row's new key at once. With the
    k norm, a page that held the normed key before its rotation could be read, or rotated twice,
    by another group (call 3's suite and call 4's racecheck run, docs/PERF.md session 33): each
    of many launches writes the two-launch path's key and output bits."""
    hq, hkv = 14, 2   # 7 query heads a KV head: short rows take up to 7 group blocks
    rng = np.random.default_rng(11 + d)
    batch, k, v, qkv, norms = decode_step(rng, [(0, 40), (1, 129), (2, 7)], hq, hkv, d, True)
    want = run(cuda, batch, k, v, qkv, norms, hq, d, fused=False)
    for i in range(60):
        got = run(cuda, batch, k, v, qkv, norms, hq, d)
        assert all(same_bits(a, b) for a, b in zip(got, want)), f"launch {i}"


def test_steps_it_does_not_fuse_are_the_composition(cuda):
    """A prompt segment beside decode rows, and D = 256: the two launches, the same bits."""
    from luce.models import SegmentSpec, build_batch

    rng = np.random.default_rng(9)
    for d in (64, 256):
        k, v = (rng.standard_normal((12, PAGE_SIZE, 1, d)).astype(np.float32) for _ in range(2))
        batch = build_batch([SegmentSpec(0, [1] * 5, 20, [0, 1]), SegmentSpec(1, [1], 40, [2, 3, 4])])
        if d == 256:
            batch = build_batch([SegmentSpec(1, [1], 40, [2, 3, 4])])
        qkv = rng.standard_normal((batch.n_rows, 4 * d)).astype(np.float32)
        got = run(cuda, batch, k, v, qkv, [None, None], 2, d)
        want = run(cuda, batch, k, v, qkv, [None, None], 2, d, fused=False)
        assert all(same_bits(a, b) for a, b in zip(got, want))


def test_replayed_decode_step_launches_one_kernel_fewer_a_layer(tmp_path, monkeypatch):
    """A dense qwen3 (D 64) decoding 3 slots through captured graphs: the same tokens with the
    input fused or not, and one launch fewer a layer (luce.ops.launch_count)."""
    from luce.benchmark.decode_bench import run_ar
    from luce.models import load_model
    from luce.ops import get_backend
    from luce.ops.cuda_fused_ops import CudaFusedOps
    from luce.testing.tiny_models import make_dense

    make_dense(tmp_path / "q3.gguf", "qwen3", seed=22, head_dim=64)
    model = load_model(tmp_path / "q3.gguf", get_backend("cuda"))
    prompts = [[5, 6, 7, 8, 9], [11, 12], [40] * 30]
    fused_tokens, _, fused = run_ar(model, prompts, 6)
    monkeypatch.setattr(CudaFusedOps, "rope_kv_attention", FusedOps.rope_kv_attention)
    unfused_tokens, _, unfused = run_ar(model, prompts, 6)
    assert fused_tokens == unfused_tokens
    assert unfused["nodes"]["launches"] - fused["nodes"]["launches"] == model.config.n_layer


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("qk_norm", [False, True], ids=["qwen2", "qwen3"])
@pytest.mark.parametrize("hq,hkv", [(12, 2), (14, 2)])
def test_cluster_decode_form_is_the_chain_forms_bits(cuda, monkeypatch, d, qk_norm, hq, hkv):
    """The fused decode launch (the engine's) under LUCE_ATTN_DECODE=cluster (cuda/attention_cluster.cuh)
    and =chain: outputs and KV bytes the same bits, SPECS together and the 160- and 1,024-key rows alone."""
    rng = np.random.default_rng(d + hq + qk_norm)
    for specs in (SPECS, [(0, 160)], [(0, 1024)]):
        batch, k, v, qkv, norms = decode_step(rng, specs, hq, hkv, d, qk_norm)
        got = {}
        for form in ("chain", "cluster"):
            monkeypatch.setenv("LUCE_ATTN_DECODE", form)
            got[form] = run(cuda, batch, k, v, qkv, norms, hq, d)
        for a, b in zip(got["chain"], got["cluster"]):
            assert same_bits(a, b), specs
