"""Prompt-row attention on tensor cores (cuda/attention_prefill.cu: the kernel that
LUCE_ATTN_PROMPT=f16, f16p / f16s / f16w / f16l / f16l4 / f16l2 / f16g (the f16 kernel's paged, 8-warp staged,
wide staged or long staged form) or tf32 names for the run, else the default one) on a GPU; launches give the f16 kernel
its staging workspace unless a test says not.

Prompt rows take their own arithmetic (DESIGN 5 rule 1): they are checked against its model
luce/ref/attention_prefill.py and the exact math luce/ref/attention.py within
tests/kernels/tolerances.py, and a prompt row's bits must not depend on anything but itself:
the same in any chunk of the prompt, at any tile position, beside decoders, trees, padding and
other prompts. Rows past prompt_rows keep the per-row kernel's bits. The CPU emulation of the
same source: tests/kernels/test_attention_emulated.py. Helpers: tests/kernels/test_attention.py.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from luce.models.kv_cache import pages_needed
from luce.ref.attention_prefill import DEFAULT_KIND, paged_attention_prompt
from tests.kernels.test_attention import SENTINEL, Pool, Seq, assert_close, pack, pack_trees, run_kernel, tree_reference
from tests.kernels.test_gdn_tree import random_tree
from tests.kernels.tolerances import tolerance

PROMPT_ROWS = [1, 17, 64, 65, 300]
# (Hq, Hkv, D): G = 6 at both model shapes (27B, Coder-1.5B), then G 2, 3, 4, 8
HEADS = [(24, 4, 256), (12, 2, 128), (4, 2, 128), (6, 2, 256), (8, 2, 128), (16, 2, 256)]
# the kernel the library launches for prompt rows (read by each launch), so its model
KIND = {"": DEFAULT_KIND, "tf32": "tf32"}.get(os.environ.get("LUCE_ATTN_PROMPT", ""), "f16")


def mixed_launch(rng, hq, hkv, d, rows, context):
    """A prompt chunk of `rows` rows after `context` KV rows, then two decoders and a width-8
    tree (one launch) -> (pool, batch, tree_parents, q)."""
    specs = [(0, context + rows, rows), (1, 700, 1), (-1, 0, 2), (2, 257, 1), (3, 250 + 8, 8)]
    pool = Pool(rng, sum(pages_needed(max(n, 1)) for _, n, _ in specs) + 2, hkv, d)
    seqs = [pool.seq(*spec) for spec in specs]
    batch, tp = pack_trees(seqs, [None, None, None, None, random_tree(rng, 8)])
    q = rng.standard_normal((batch.n_rows, hq, d)).astype(np.float32)
    return pool, batch, tp, q


def prompt_ref(q, pool, batch, scale, rows, causal=True):
    return paged_attention_prompt(q, pool.k, pool.v, batch.qo_indptr, batch.kv_indptr, batch.kv_indices,
                                  batch.kv_last_page_len, batch.seq_slots, scale, causal, rows, KIND)


def assert_prompt_close(got, q, pool, batch, scale, rows, exact=None, causal=True):
    """got[:rows] (live rows) against the kernel's model and, given, the exact math."""
    live = got[:rows, 0, 0] != np.float32(SENTINEL)
    model = prompt_ref(q, pool, batch, scale, rows, causal)[:rows]
    np.testing.assert_allclose(got[:rows][live], model[live], *tolerance("attention_prompt"))
    assert np.median(np.abs(got[:rows][live] - model[live])) < 1e-6
    if exact is not None:
        np.testing.assert_allclose(got[:rows][live], exact[:rows][live], *tolerance("attention_prompt_exact"))


@pytest.mark.gpu
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("rows", PROMPT_ROWS)
def test_prompt_rows_in_mixed_launch(rows, heads):
    """Prompt rows match their kernel's model and are bitwise what they are alone; the decoders and
    the tree after them keep the per-row kernel's bits."""
    hq, hkv, d = heads
    rng = np.random.default_rng(rows * 31 + hq + d)
    context = 250 if rows < 100 else 900  # the chunk's keys cross the 256- and 1,024-key boundaries
    pool, batch, tp, q = mixed_launch(rng, hq, hkv, d, rows, context)
    scale = 1.0 / np.sqrt(d)
    per_row = run_kernel(q, pool, batch, scale, fill=SENTINEL, tree_parents=tp)
    got = run_kernel(q, pool, batch, scale, fill=SENTINEL, tree_parents=tp, prompt_rows=rows)
    for r in range(rows, batch.n_rows):
        assert np.array_equal(got[r], per_row[r]), f"row {r} differs from the per-row kernel"
    exact = tree_reference(q, pool, batch, tp, scale)
    live = per_row[:, 0, 0] != np.float32(SENTINEL)
    assert_close(per_row[live], exact[live])
    assert_prompt_close(got, q, pool, batch, scale, rows, exact)
    alone = run_kernel(q[:rows], pool, pack([pool_seq_of(batch, 0, context + rows, rows)]), scale, prompt_rows=rows)
    assert np.array_equal(alone, got[:rows]), "a prompt row changed beside decoders and a tree"


def pool_seq_of(batch, s, kv_len, n_rows):
    return Seq(0, kv_len, n_rows, [int(p) for p in batch.kv_indices[batch.kv_indptr[s]:batch.kv_indptr[s + 1]]])


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [(24, 4, 256), (12, 2, 128)])
def test_prompt_rows_bitwise_at_any_chunking(heads):
    """A 300-row prompt at 200 tokens of context: one chunk, or chunks cut at absolute
    multiples of 64 (each its own launch: every row at another tile position), gives every row
    the same bits."""
    hq, hkv, d = heads
    rng = np.random.default_rng(hq)
    start, total = 200, 300
    pool = Pool(rng, pages_needed(start + total) + 1, hkv, d)
    whole = pool.seq(0, start + total, total)
    q = rng.standard_normal((total, hq, d)).astype(np.float32)
    scale = 1.0 / np.sqrt(d)
    one = run_kernel(q, pool, pack([whole]), scale, prompt_rows=total)
    assert_prompt_close(one, q, pool, pack([whole]), scale, total)
    cuts = [start, 256, 320, 448, start + total]  # absolute positions
    for a, b in zip(cuts, cuts[1:]):
        chunk = Seq(0, b, b - a, whole.pages[:pages_needed(b)])   # the prompt's KV after the chunk
        rows = slice(a - start, b - start)
        got = run_kernel(q[rows], pool, pack([chunk]), scale, prompt_rows=b - a)
        assert np.array_equal(got, one[rows]), f"chunk [{a}, {b}) differs from the whole prompt"


@pytest.mark.gpu
@pytest.mark.parametrize("heads", HEADS)
def test_staged_and_paged_f16_forms_give_the_same_bits(heads, monkeypatch):
    """The f16 kernel's staged forms (keys converted to f16 once into the workspace, cp.async
    ring: the default, LUCE_ATTN_PROMPT=f16s the 8-warp form, f16w the wide one of 4 warps with
    two m-tiles each, f16l / f16l4 the long one of 6 / 4 warps walking runs of splits, f16l2 the
    long one of 4 warps with two m-tiles each, D <= 128, f16g the warpgroup one (sm_90a, D 64 / 128),
    where the device holds it; elsewhere they take the default staged form)
    and its paged form (every tile converting the f32 pages: n_kv_indices = 0, or f16p): every
    bit the same, for a chunk across 1,024-key splits beside decoders, padding and a tree."""
    if KIND != "f16":
        pytest.skip("the f16 kernel's forms (LUCE_ATTN_PROMPT names another kernel)")
    hq, hkv, d = heads
    rng = np.random.default_rng(hq * 7 + d)
    pool, batch, tp, q = mixed_launch(rng, hq, hkv, d, 300, 1900)
    scale = 1.0 / np.sqrt(d)
    staged = run_kernel(q, pool, batch, scale, fill=SENTINEL, tree_parents=tp, prompt_rows=300)
    paged = run_kernel(q, pool, batch, scale, fill=SENTINEL, tree_parents=tp, prompt_rows=300, staged=False)
    assert np.array_equal(staged.view(np.uint32), paged.view(np.uint32))
    for form in ("f16p", "f16s", "f16w", "f16l", "f16l4", "f16l2", "f16g"):
        monkeypatch.setenv("LUCE_ATTN_PROMPT", form)
        forced = run_kernel(q, pool, batch, scale, fill=SENTINEL, tree_parents=tp, prompt_rows=300)
        assert np.array_equal(forced.view(np.uint32), paged.view(np.uint32)), form
    assert_prompt_close(staged, q, pool, batch, scale, 300, tree_reference(q, pool, batch, tp, scale))


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [(12, 2, 128), (8, 2, 128), (14, 2, 64)])
def test_long_form_gives_the_default_bits_at_any_run(heads, monkeypatch):
    """The long form (LUCE_ATTN_PROMPT=f16l: 6 warps, f16l4: 4 warps, f16l2: 4 warps of two
    m-tiles, f16g: one warpgroup on wgmma (sm_90a); its blocks walk runs of
    LUCE_ATTN_SPLITS_PER_BLOCK consecutive splits, or the launch's pick) against the default
    form through the library: every bit the same, for a 700-row chunk ending at 3,100 keys
    (four splits, the last short) beside decoders, padding and a tree."""
    if KIND != "f16":
        pytest.skip("the f16 kernel's forms (LUCE_ATTN_PROMPT names another kernel)")
    hq, hkv, d = heads
    rng = np.random.default_rng(hq + d)
    pool, batch, tp, q = mixed_launch(rng, hq, hkv, d, 700, 2400)
    scale = 1.0 / np.sqrt(d)
    monkeypatch.setenv("LUCE_ATTN_PROMPT", "f16")
    want = run_kernel(q, pool, batch, scale, fill=SENTINEL, tree_parents=tp, prompt_rows=700)
    for form in ("f16l", "f16l4", "f16l2", "f16g"):
        monkeypatch.setenv("LUCE_ATTN_PROMPT", form)
        for run in ("", "1", "2", "4"):
            monkeypatch.setenv("LUCE_ATTN_SPLITS_PER_BLOCK", run)
            got = run_kernel(q, pool, batch, scale, fill=SENTINEL, tree_parents=tp, prompt_rows=700)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (form, run)
    assert_prompt_close(want, q, pool, batch, scale, 700, tree_reference(q, pool, batch, tp, scale))


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [(12, 2, 128), (14, 2, 64)])
def test_prompt_forms_at_a_long_context_give_the_default_bits(heads, monkeypatch):
    """The long forms and the warpgroup form (f16l2, f16g: new in session 20, written without a
    GPU) on a 1,536-row chunk ending at 6,000 keys (six splits, runs of them, grids of hundreds
    of blocks, several blocks an SM) beside decoders and a tree: every bit the default form's."""
    if KIND != "f16":
        pytest.skip("the f16 kernel's forms (LUCE_ATTN_PROMPT names another kernel)")
    hq, hkv, d = heads
    rng = np.random.default_rng(hq * 3 + d)
    pool, batch, tp, q = mixed_launch(rng, hq, hkv, d, 1536, 6000 - 1536)
    scale = 1.0 / np.sqrt(d)
    monkeypatch.setenv("LUCE_ATTN_PROMPT", "f16")
    want = run_kernel(q, pool, batch, scale, fill=SENTINEL, tree_parents=tp, prompt_rows=1536)
    for form in ("f16l", "f16l2", "f16g"):
        monkeypatch.setenv("LUCE_ATTN_PROMPT", form)
        got = run_kernel(q, pool, batch, scale, fill=SENTINEL, tree_parents=tp, prompt_rows=1536)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), form
    assert_prompt_close(want, q, pool, batch, scale, 1536)


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
def test_prompt_rows_over_long_context(causal):
    """64 rows at 4,100 keys (5 splits), causal and not: the model, and the last 20 rows
    alone give the same bits."""
    hq, hkv, d = 24, 4, 256
    rng = np.random.default_rng(9)
    pool = Pool(rng, pages_needed(4100) + 1, hkv, d)
    seq = pool.seq(0, 4100, 64)
    q = (rng.standard_normal((64, hq, d)) * 2).astype(np.float32)
    got = run_kernel(q, pool, pack([seq]), 1.0 / 16, causal, prompt_rows=64)
    assert_prompt_close(got, q, pool, pack([seq]), 1.0 / 16, 64, causal=causal)
    tail = run_kernel(q[44:], pool, pack([Seq(0, 4100, 20, seq.pages)]), 1.0 / 16, causal, prompt_rows=20)
    assert np.array_equal(tail, got[44:])


@pytest.mark.gpu
@pytest.mark.parametrize("hq,hkv,d", [(24, 4, 256), (12, 2, 128), (7, 1, 64)])
def test_tree_row_under_prompt_rows_gets_nan(hq, hkv, d):
    """prompt_rows must not cover a tree row: the prompt kernel does not address tree keys and
    says so with NaN rather than a plausible wrong output. (The per-row kernel gives those rows
    finite values, so this also shows the prompt kernel runs at each D rather than falling
    back to the per-row kernel, which would make the tests above vacuous.)"""
    rng = np.random.default_rng(12)
    pool = Pool(rng, 40, hkv, d)
    batch, tp = pack_trees([pool.seq(0, 250 + 8, 8)], [random_tree(rng, 8)])
    q = rng.standard_normal((8, hq, d)).astype(np.float32)
    got = run_kernel(q, pool, batch, 0.088, tree_parents=tp, prompt_rows=8, raw=True)
    parented = tp >= 0
    assert np.isnan(got[parented]).all()
    assert np.isfinite(run_kernel(q, pool, batch, 0.088, tree_parents=tp, raw=True)).all()


def test_prompt_rows_are_the_leading_run_of_prefill_segments():
    """The CUDA op sends the packer's leading prefill run (and nothing else) to the prompt kernel."""
    from luce.ops.cuda_sequence_ops import prompt_rows

    rng = np.random.default_rng(0)
    pool = Pool(rng, 20, 1, 8)
    assert prompt_rows(pack([pool.seq(0, 40, 5), pool.seq(1, 9, 1), pool.seq(2, 30, 1)])) == 5
    assert prompt_rows(pack([pool.seq(0, 40, 5), pool.seq(-1, 0, 2), pool.seq(1, 30, 7)])) == 14
    assert prompt_rows(pack([pool.seq(0, 9, 1), pool.seq(1, 30, 1)])) == 0
    assert prompt_rows(object()) == 0  # a batch view without prefill_spans


@pytest.mark.parametrize("n,d", [(1, 64), (255, 128), (257, 256), (1100, 128)])
@pytest.mark.parametrize("kind", ["f16", "tf32"])
def test_prompt_model_matches_the_float64_reference(n, d, kind):
    """luce/ref/attention_prefill.py (the prompt kernels' arithmetic) against luce/ref/attention.py:
    a 10-bit mantissa's error, and the model with its roundings taken out is the exact math."""
    from luce.ref import attention_prefill as pf
    from luce.ref.attention import attend_row

    rng = np.random.default_rng(n + d)
    q = rng.standard_normal((6, d)).astype(np.float32)
    k, v = (rng.standard_normal((n, d)).astype(np.float32) for _ in range(2))
    want = attend_row(q, k[:, None, :].astype(np.float64), v[:, None, :].astype(np.float64), 1 / np.sqrt(d))
    np.testing.assert_allclose(pf.attend_row_prompt(q, k, v, 1 / np.sqrt(d), kind), want,
                               *tolerance("attention_prompt_exact"))
    x = np.array([1.0, 1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, -(1 + 2.0 ** -11), 1 + 2.0 ** -12, np.inf], np.float32)
    assert pf.tf32(x).tolist() == [1.0, 1 + 2.0 ** -10, 1 + 2 * 2.0 ** -10, -(1 + 2.0 ** -10), 1.0, np.inf]
    # f16: ties to even, overflow at 65,520, subnormals below 2^-14
    y = np.array([1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 65519.0, 65520.0, 2.0 ** -20 * 1.75], np.float32)
    assert pf.f16(y).tolist() == [1.0, 1 + 2 * 2.0 ** -10, 65504.0, np.inf, 2.0 ** -20 * 1.75]
    rounding = getattr(pf, kind)
    try:
        setattr(pf, kind, lambda a: np.asarray(a, np.float32))
        np.testing.assert_allclose(pf.attend_row_prompt(q, k, v, 1 / np.sqrt(d), kind), want, rtol=2e-5, atol=2e-6)
    finally:
        setattr(pf, kind, rounding)
