"""The long form of the f16 prompt-row kernel (cuda/attention_prefill_f16_long.cuh,
LUCE_ATTN_PROMPT=f16l: 6 warps, f16l4: 4 warps, f16l2: 4 warps of two m-tiles; f16g: one warpgroup on
warpgroup MMAs, emulated per warp as mma.sync; a block walks a run of consecutive 1,024-key
splits, LUCE_ATTN_SPLITS_PER_BLOCK long, or as many as its launch picks) on the CPU through
tests/kernels/emu: every output bit the same as the default staged form's, whatever the run
length, across prompt segments that share tiles, a short split at the end of a run, padding
and a decoder, with q 16-byte aligned or not (not: the launch takes the default form).
The forms over the shared cases: test_staged_form_gives_the_paged_bits_emulated in
tests/kernels/test_attention_emulated.py; on a GPU: tests/kernels/test_attention_prefill.py.
"""
from __future__ import annotations

import numpy as np
import pytest

from luce.models.kv_cache import pages_needed
from tests.kernels.test_attention import Pool, pack
from tests.kernels.test_attention_emulated import check_prompt_rows, launch, load_attention

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return load_attention(tmp_path_factory.mktemp("emu_long"))


def coder_like_launch(rng, d):
    """G = 6 (Hq 6, Hkv 1): a 20-row prompt chunk ending at 2,100 keys (three splits, the last
    52 keys), a 5-row prompt at 1,030 keys (tiles straddle the two), padding and a decoder."""
    specs = [(0, 2100, 20), (1, 1030, 5), (-1, 0, 2), (2, 300, 1)]
    pool = Pool(rng, sum(pages_needed(max(n, 1)) for _, n, _ in specs) + 2, 1, d)
    batch = pack([pool.seq(*s) for s in specs])
    q = rng.standard_normal((batch.n_rows, 6, d)).astype(np.float32)
    return pool, batch, q


@pytest.mark.parametrize("d", [128, 64])
def test_long_form_runs_give_the_default_bits_emulated(lib, d, monkeypatch):
    rng = np.random.default_rng(d + 3)
    pool, batch, q = coder_like_launch(rng, d)
    scale, rows = 1.0 / np.sqrt(d), 25
    monkeypatch.setenv("LUCE_ATTN_PROMPT", "f16")
    want = launch(lib, q, pool, batch, None, scale, rows, guard=16)
    check_prompt_rows(want, q, pool, batch, None, scale, rows)
    for form in ("f16l", "f16l4", "f16l2", "f16g"):
        monkeypatch.setenv("LUCE_ATTN_PROMPT", form)
        for run in ("", "1", "2", "3", "9"):
            monkeypatch.setenv("LUCE_ATTN_SPLITS_PER_BLOCK", run)
            got = launch(lib, q, pool, batch, None, scale, rows, guard=16)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (form, run)


def test_long_form_unaligned_q_takes_the_default_form_emulated(lib, monkeypatch):
    rng = np.random.default_rng(5)
    pool, batch, q = coder_like_launch(rng, 64)
    scale, rows = 0.125, 25
    monkeypatch.setenv("LUCE_ATTN_PROMPT", "f16")
    want = launch(lib, q, pool, batch, None, scale, rows)
    buf = np.empty(q.size + 1, np.float32)
    shifted = buf[1:].reshape(q.shape)  # 4 bytes past a 16-byte boundary
    shifted[...] = q
    assert shifted.ctypes.data % 16 != 0
    for form in ("f16l", "f16l4", "f16l2", "f16g"):
        monkeypatch.setenv("LUCE_ATTN_PROMPT", form)
        got = launch(lib, shifted, pool, batch, None, scale, rows)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), form


@pytest.mark.parametrize("variant", ["LUCE_ATTN_WG_STAGES", "LUCE_ATTN_WG_OVERLAP"])
@pytest.mark.parametrize("d", [128, 64])
def test_warpgroup_form_variants_give_the_default_bits_emulated(tmp_path, d, variant, monkeypatch):
    """f16g with LUCE_ATTN_WG_STAGES=3, and with LUCE_ATTN_WG_OVERLAP=1 (3 stages, each key
    block's Q K^T issued before the softmax of the block ahead), read once by a library (a fresh
    one here). The emulator runs each wgmma at once: what it checks is the ring's and the S
    buffers' bookkeeping, not the asynchrony."""
    monkeypatch.setenv(variant, "3" if variant.endswith("STAGES") else "1")
    lib3 = load_attention(tmp_path)
    rng = np.random.default_rng(d + 11)
    pool, batch, q = coder_like_launch(rng, d)
    scale, rows = 1.0 / np.sqrt(d), 25
    monkeypatch.setenv("LUCE_ATTN_PROMPT", "f16")
    want = launch(lib3, q, pool, batch, None, scale, rows, guard=16)
    monkeypatch.setenv("LUCE_ATTN_PROMPT", "f16g")
    for run in ("", "1", "2"):
        monkeypatch.setenv("LUCE_ATTN_SPLITS_PER_BLOCK", run)
        got = launch(lib3, q, pool, batch, None, scale, rows, guard=16)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), run
