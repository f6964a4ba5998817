"""Tiled prompt-row attention (cuda/attention_prefill.cu) against the per-row partition kernel.

The tiled kernel takes rows 0..prompt_rows-1 of a luce_attention launch and must give every
row bitwise what the per-row kernel gives (same dot-product tree, softmax and value order),
so the test is exact equality, row by row, whatever the tile rows, the other segments in the
launch and the chunking of the prompt; the reference check (tolerance) guards both kernels.
Helpers: tests/kernels/test_attention.py.
"""
from __future__ import annotations

import numpy as np
import pytest

from luce.models.kv_cache import pages_needed
from tests.kernels.test_attention import SENTINEL, Pool, Seq, assert_close, pack, pack_trees, run_kernel, tree_reference
from tests.kernels.test_gdn_tree import random_tree

PROMPT_ROWS = [1, 17, 64, 65, 300]
# (Hq, Hkv, D): G = 6 at both model shapes (27B, Coder-1.5B), then G 2, 3, 4, 8
HEADS = [(24, 4, 256), (12, 2, 128), (4, 2, 128), (6, 2, 256), (8, 2, 128), (16, 2, 256)]


def mixed_launch(rng, hq, hkv, d, rows, context):
    """A prompt chunk of `rows` rows after `context` KV rows, then two decoders and a width-8
    tree (one launch) -> (pool, batch, tree_parents, q)."""
    specs = [(0, context + rows, rows), (1, 700, 1), (-1, 0, 2), (2, 257, 1), (3, 250 + 8, 8)]
    pool = Pool(rng, sum(pages_needed(max(n, 1)) for _, n, _ in specs) + 2, hkv, d)
    seqs = [pool.seq(*spec) for spec in specs]
    batch, tp = pack_trees(seqs, [None, None, None, None, random_tree(rng, 8)])
    q = rng.standard_normal((batch.n_rows, hq, d)).astype(np.float32)
    return pool, batch, tp, q


@pytest.mark.gpu
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("rows", PROMPT_ROWS)
def test_tiled_rows_bitwise_equal_per_row_kernel_in_mixed_launch(rows, heads):
    hq, hkv, d = heads
    rng = np.random.default_rng(rows * 31 + hq + d)
    context = 250 if rows < 100 else 470  # the chunk's keys cross the 256- and 512-key boundaries
    pool, batch, tp, q = mixed_launch(rng, hq, hkv, d, rows, context)
    scale = 1.0 / np.sqrt(d)
    per_row = run_kernel(q, pool, batch, scale, fill=SENTINEL, tree_parents=tp)
    tiled = run_kernel(q, pool, batch, scale, fill=SENTINEL, tree_parents=tp, prompt_rows=rows)
    for r in range(batch.n_rows):
        assert np.array_equal(tiled[r], per_row[r]), f"row {r} differs between the kernels"
    live = per_row[:, 0, 0] != np.float32(SENTINEL)
    assert_close(tiled[live], tree_reference(q, pool, batch, tp, scale)[live])


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [(24, 4, 256), (12, 2, 128)])
def test_prompt_rows_bitwise_at_any_chunking(heads):
    """A 300-row prompt at 200 tokens of context: one chunk, or chunks cut at absolute
    multiples of 64 (each its own launch, the chunk's rows tiled), gives every row the same bits."""
    hq, hkv, d = heads
    rng = np.random.default_rng(hq)
    start, total = 200, 300
    pool = Pool(rng, pages_needed(start + total) + 1, hkv, d)
    whole = pool.seq(0, start + total, total)
    q = rng.standard_normal((total, hq, d)).astype(np.float32)
    scale = 1.0 / np.sqrt(d)
    one = run_kernel(q, pool, pack([whole]), scale, prompt_rows=total)
    cuts = [start, 256, 320, 448, start + total]  # absolute positions
    for a, b in zip(cuts, cuts[1:]):
        chunk = Seq(0, b, b - a, whole.pages[:pages_needed(b)])   # the prompt's KV after the chunk
        rows = slice(a - start, b - start)
        got = run_kernel(q[rows], pool, pack([chunk]), scale, prompt_rows=b - a)
        assert np.array_equal(got, one[rows]), f"chunk [{a}, {b}) differs from the whole prompt"


@pytest.mark.gpu
def test_tiles_across_prompt_segments_and_padding_change_no_bits():
    """Two prompt segments and a padding segment under prompt_rows (tiles straddle them): each
    segment bitwise as it is alone, padding rows untouched."""
    hq, hkv, d = 12, 2, 128
    rng = np.random.default_rng(4)
    pool = Pool(rng, 80, hkv, d)
    a, pad, b = pool.seq(0, 300 + 65, 65), pool.seq(-1, 0, 3), pool.seq(1, 40 + 17, 17)
    q = rng.standard_normal((85, hq, d)).astype(np.float32)
    both = run_kernel(q, pool, pack([a, pad, b]), 0.088, fill=SENTINEL, prompt_rows=85)
    assert (both[65:68] == np.float32(SENTINEL)).all(), "a padding row was written"
    assert np.array_equal(both[:65], run_kernel(q[:65], pool, pack([a]), 0.088, prompt_rows=65))
    assert np.array_equal(both[68:], run_kernel(q[68:], pool, pack([b]), 0.088, prompt_rows=17))


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False])
def test_tiled_rows_bitwise_over_long_context(causal):
    """64 rows at 4,100 keys (17 partitions), causal and not."""
    hq, hkv, d = 24, 4, 256
    rng = np.random.default_rng(9)
    pool = Pool(rng, pages_needed(4100) + 1, hkv, d)
    batch = pack([pool.seq(0, 4100, 64)])
    q = (rng.standard_normal((64, hq, d)) * 2).astype(np.float32)
    per_row = run_kernel(q, pool, batch, 1.0 / 16, causal)
    assert np.array_equal(run_kernel(q, pool, batch, 1.0 / 16, causal, prompt_rows=64), per_row)


@pytest.mark.gpu
@pytest.mark.parametrize("hq,hkv,d", [(24, 4, 256), (12, 2, 128), (7, 1, 64)])
def test_tree_row_under_prompt_rows_gets_nan(hq, hkv, d):
    """prompt_rows must not cover a tree row: the tiled kernel does not address tree keys and
    says so with NaN rather than a plausible wrong output. (The per-row kernel gives those rows
    finite values, so this also shows the tiled kernel runs at each D rather than falling
    back to the per-row kernel, which would make the bitwise tests above vacuous.)"""
    rng = np.random.default_rng(12)
    pool = Pool(rng, 40, hkv, d)
    batch, tp = pack_trees([pool.seq(0, 250 + 8, 8)], [random_tree(rng, 8)])
    q = rng.standard_normal((8, hq, d)).astype(np.float32)
    got = run_kernel(q, pool, batch, 0.088, tree_parents=tp, prompt_rows=8, raw=True)
    parented = tp >= 0
    assert np.isnan(got[parented]).all()
    assert np.isfinite(run_kernel(q, pool, batch, 0.088, tree_parents=tp, raw=True)).all()


def test_prompt_rows_are_the_leading_run_of_prefill_segments():
    """The CUDA op sends the packer's leading prefill run (and nothing else) to the tiled kernel."""
    from luce.ops.cuda_sequence_ops import prompt_rows

    rng = np.random.default_rng(0)
    pool = Pool(rng, 20, 1, 8)
    assert prompt_rows(pack([pool.seq(0, 40, 5), pool.seq(1, 9, 1), pool.seq(2, 30, 1)])) == 5
    assert prompt_rows(pack([pool.seq(0, 40, 5), pool.seq(-1, 0, 2), pool.seq(1, 30, 7)])) == 14
    assert prompt_rows(pack([pool.seq(0, 9, 1), pool.seq(1, 30, 1)])) == 0
    assert prompt_rows(object()) == 0  # a batch view without prefill_spans


@pytest.mark.parametrize("n,d", [(1, 64), (255, 128), (257, 256), (700, 128)])
def test_f32_order_model_matches_the_float64_reference(n, d):
    """luce/ref/attention_prefill.py (the kernels' f32 order) against luce/ref/attention.py."""
    from luce.ref.attention import attend_row
    from luce.ref.attention_prefill import attend_row_f32

    rng = np.random.default_rng(n + d)
    q = rng.standard_normal((6, d)).astype(np.float32)
    k, v = (rng.standard_normal((n, d)).astype(np.float32) for _ in range(2))
    want = attend_row(q, k[:, None, :].astype(np.float64), v[:, None, :].astype(np.float64), 1 / np.sqrt(d))
    np.testing.assert_allclose(attend_row_f32(q, k, v, 1 / np.sqrt(d)), want, rtol=2e-5, atol=2e-6)
