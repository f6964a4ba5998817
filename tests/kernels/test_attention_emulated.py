"""The attention kernels' own source on the CPU (tests/kernels/emu): the prompt-row kernels
(cuda/attention_prefill_f16.cuh and the TF32 one of cuda/attention_prefill.cu, each named by
LUCE_ATTN_PROMPT; here through the shuffle forms of their MMAs and ldmatrix)
against their arithmetic model luce/ref/attention_prefill.py and the exact math
luce/ref/attention.py, and a prompt row's bits invariant to its chunk, its tile position and
the rows beside it; decode and tree rows (cuda/attention.cu) the same bits whatever
query-head group a block takes, whether the last partition block or the combine launch
merges the partitions, and whether the launch has tree_parents at all. The
emulation runs a block's CUDA threads as fibers on one host thread, so the cases are small;
tests/kernels/test_attention_prefill.py runs the set on a GPU (the MMA itself).
"""
from __future__ import annotations

import ctypes as C

import numpy as np
import pytest

from luce.models.kv_cache import PAGE_SIZE, pages_needed
from luce.ref.attention import chunk_grid, chunk_keys
from luce.ref.attention_prefill import paged_attention_prompt
from tests.kernels.emu import build as emu
from tests.kernels.test_attention import Pool, Seq, pack, pack_trees, reference, tree_reference
from tests.kernels.test_gdn_tree import random_tree
from tests.kernels.tolerances import tolerance

pytestmark = pytest.mark.slow
_P = C.c_void_p
FILL = np.float32(1234.5)


class Params(C.Structure):
    """luce_attention_params (cuda/luce_ops_sequence.h), field for field."""
    _fields_ = ([(n, _P) for n in "q k v out ws qo kv_indptr kv_indices last slots tree".split()]
                + [("workspace_bytes", C.c_int64)]
                + [(n, C.c_int32) for n in "n_rows n_seg hq hkv d page max_kv causal".split()]
                + [("scale", C.c_float), ("prompt_rows", C.c_int32), ("counters", _P), ("n_counters", C.c_int64),
                   ("n_kv_indices", C.c_int64)])


def load_attention(out_dir):
    lib = emu.load(["attention.cu", "attention_prefill.cu"], out_dir, "the attention kernels")
    lib.luce_attention.argtypes = [C.POINTER(Params), _P]
    lib.luce_attention_workspace_bytes.restype = C.c_int64
    # n_rows, prompt_rows, Hq, D, max_kv_len, Hkv, page_size, n_kv_indices
    lib.luce_attention_workspace_bytes.argtypes = [C.c_int32] * 7 + [C.c_int64]
    return lib


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return load_attention(tmp_path_factory.mktemp("emu"))


def launch(lib, q, pool, batch, tp, scale, prompt_rows, causal=True, counters=None, no_tree=False,
           ws_bytes=None, status=0, guard=0, staged=True):
    """no_tree: tree_parents NULL (the kernels without the tree path); else tp, or no parents.
    ws_bytes: the workspace size the launch is told (default: luce_attention_workspace_bytes),
    with `guard` more floats after it that must stay untouched; status: its expected return.
    staged: n_kv_indices is len(kv_indices) (the f16 kernel stages the prompt keys), else 0."""
    T, hq, d = q.shape
    max_kv = max([batch.kv_len(s) for s in range(batch.n_segments) if batch.seq_slots[s] >= 0] + [1])
    n_kv_indices = len(batch.kv_indices) if staged else 0
    if ws_bytes is None:
        ws_bytes = lib.luce_attention_workspace_bytes(T, prompt_rows, hq, d, max_kv, pool.k.shape[2], PAGE_SIZE,
                                                      n_kv_indices)
    ws = np.full(-(-ws_bytes // 4) + guard, np.nan, np.float32)
    out = np.full((T, hq, d), FILL)
    tp = np.full(T, -1, np.int32) if tp is None else tp
    meta = [np.ascontiguousarray(a, np.int32) for a in (batch.qo_indptr, batch.kv_indptr, batch.kv_indices,
                                                        batch.kv_last_page_len, batch.seq_slots, tp)]
    if no_tree:
        meta[-1] = None
    p = Params(q.ctypes.data, pool.k.ctypes.data, pool.v.ctypes.data, out.ctypes.data, ws.ctypes.data,
               *(None if a is None else a.ctypes.data for a in meta), ws_bytes, T, batch.n_segments, hq, pool.k.shape[2], d, PAGE_SIZE,
               max_kv, int(causal), scale, prompt_rows)
    p.n_kv_indices = n_kv_indices
    if counters is not None:
        p.counters, p.n_counters = counters.ctypes.data, counters.size
    assert lib.luce_attention(C.byref(p), None) == status
    assert np.isnan(ws[len(ws) - guard:]).all(), "a launch wrote past its workspace"
    return out


@pytest.fixture(params=["f16"])
def kind(request, monkeypatch):
    """The prompt-row kernel a test runs (LUCE_ATTN_PROMPT, read by each launch)."""
    monkeypatch.setenv("LUCE_ATTN_PROMPT", request.param)
    return request.param


def prompt_ref(q, pool, batch, scale, rows, causal=True, kind="f16"):
    return paged_attention_prompt(q, pool.k, pool.v, batch.qo_indptr, batch.kv_indptr, batch.kv_indices,
                                  batch.kv_last_page_len, batch.seq_slots, scale, causal, rows, kind)


def check_prompt_rows(got, q, pool, batch, tp, scale, rows, causal=True, kind="f16"):
    """Prompt rows against their kernel's model and the exact math; rows past them the per-row kernel's."""
    tp = np.full(batch.n_rows, -1, np.int32) if tp is None else tp
    exact = tree_reference(q, pool, batch, tp, scale) if causal else None
    model = prompt_ref(q, pool, batch, scale, rows, causal, kind)
    live = got[:, 0, 0] != FILL
    head = np.zeros(len(live), bool)
    head[:rows] = True
    np.testing.assert_allclose(got[live & head], model[live & head], *tolerance("attention_prompt"))
    # typically only f32 accumulation apart: a missing or extra rounding would move most outputs
    assert np.median(np.abs(got[live & head] - model[live & head])) < 1e-6
    if exact is not None:
        np.testing.assert_allclose(got[live & head], exact[live & head], *tolerance("attention_prompt_exact"))
        np.testing.assert_allclose(got[live & ~head], exact[live & ~head], *tolerance("attention"))


CASES = {  # (Hq, Hkv, D), [(slot, kv_len, rows)], tree segment, prompt_rows
    "g6_d64_prompt_then_tree_and_decoder": ((6, 1, 64), [(0, 150, 40), (1, 100, 1), (3, 90, 8)], 2, 40),
    "g8_d64_two_prompts_and_padding_in_tiles": ((8, 1, 64), [(0, 90, 13), (-1, 0, 3), (1, 47, 6), (2, 57, 1)],
                                                None, 22),
    "g2_d64_split_boundary": ((2, 1, 64), [(0, 1100, 8)], None, 8),
    "g2_d128": ((2, 1, 128), [(0, 90, 9)], None, 9),
    "g6_d128_coder_shape": ((12, 2, 128), [(0, 300, 50), (1, 70, 3)], None, 53),
    "g4_d256": ((4, 2, 256), [(0, 70, 5)], None, 5),
    "g7_d64_coder_0p5b_shape": ((14, 2, 64), [(0, 1100, 30), (1, 60, 1)], None, 30),
}


@pytest.mark.parametrize("kind,name", [("f16", name) for name in CASES]
                         + [("tf32", "g2_d128")], indirect=["kind"])
def test_prompt_rows_match_their_model_emulated(lib, kind, name):
    (hq, hkv, d), specs, tree_seg, prompt_rows = CASES[name]
    rng = np.random.default_rng(len(name))
    pool = Pool(rng, sum(pages_needed(max(n, 1)) for _, n, _ in specs) + 2, hkv, d)
    seqs = [pool.seq(*s) for s in specs]
    trees = [random_tree(rng, specs[i][2]) if i == tree_seg else None for i in range(len(specs))]
    batch, tp = pack_trees(seqs, trees)
    q = rng.standard_normal((batch.n_rows, hq, d)).astype(np.float32)
    got = launch(lib, q, pool, batch, tp, 1.0 / np.sqrt(d), prompt_rows)
    check_prompt_rows(got, q, pool, batch, tp, 1.0 / np.sqrt(d), prompt_rows, kind=kind)
    # the rows past prompt_rows took the per-row kernel exactly as in a launch without prompt rows
    per_row = launch(lib, q, pool, batch, tp, 1.0 / np.sqrt(d), 0)
    assert np.array_equal(got[prompt_rows:], per_row[prompt_rows:])


def test_prompt_row_bits_independent_of_chunk_tile_and_neighbours_emulated(lib, kind):
    """A 30-row prompt at 60 tokens of context (G = 6: 21 rows a tile) in one launch, cut into
    chunks that move every row to another tile position, and beside another prompt and a
    decoder: every row the same bits."""
    hq, hkv, d = 6, 1, 64
    rng = np.random.default_rng(3)
    start, total = 60, 30
    pool = Pool(rng, pages_needed(start + total) + pages_needed(70) + 2, hkv, d)
    whole = pool.seq(0, start + total, total)
    other, dec = pool.seq(1, 50, 7), pool.seq(2, 20, 1)
    q = (rng.standard_normal((total, hq, d)) * 2).astype(np.float32)
    scale = 1.0 / 8
    one = launch(lib, q, pool, pack([whole]), None, scale, total)
    check_prompt_rows(one, q, pool, pack([whole]), None, scale, total)
    for a, b in [(60, 64), (64, 77), (77, 90)]:
        chunk = Seq(0, b, b - a, whole.pages[:pages_needed(b)])
        rows = slice(a - start, b - start)
        got = launch(lib, q[rows], pool, pack([chunk]), None, scale, b - a)
        assert np.array_equal(got, one[rows]), f"chunk [{a}, {b}) differs from the whole prompt"
    qx = np.concatenate([rng.standard_normal((7, hq, d)).astype(np.float32), q[4:], q[:1]])
    mixed = launch(lib, qx, pool, pack([other, Seq(0, start + total, total - 4, whole.pages), dec]), None,
                   scale, 7 + total - 4)
    assert np.array_equal(mixed[7:7 + total - 4], one[4:]), "a row changed beside another prompt"


def test_non_causal_prompt_rows_emulated(lib, kind):
    rng = np.random.default_rng(1)
    pool = Pool(rng, pages_needed(100) + 1, 1, 64)
    seq = pool.seq(0, 100, 12)
    q = rng.standard_normal((12, 2, 64)).astype(np.float32)
    got = launch(lib, q, pool, pack([seq]), None, 0.125, 12, causal=False)
    np.testing.assert_allclose(got, prompt_ref(q, pool, pack([seq]), 0.125, 12, causal=False),
                               *tolerance("attention_prompt"))
    tail = launch(lib, q[5:], pool, pack([Seq(0, 100, 7, seq.pages)]), None, 0.125, 7, causal=False)
    assert np.array_equal(tail, got[5:])


def test_one_buffer_form_gives_the_same_bits_emulated(lib, kind, tmp_path_factory, monkeypatch):
    """At D = 128 the f16 kernel's staged keys take its long form (6 warps walking runs of
    splits) or its wide form (f16w: Q and two K / V buffers, ~104 KiB); where a block may take only 99 KiB (sm_86/89/120) the 8-warp staged form with
    two buffers; its paged form (no staging workspace) loads block i + 1's K and V while block
    i's MMAs run (two buffers) or, in 99 KiB, stages one buffer between blocks. A second build
    of the library sees 99 KiB (its launch decides once): every form the same bits, over five
    key blocks."""
    rng = np.random.default_rng(7)
    pool = Pool(rng, pages_needed(300) + 1, 1, 128)
    seq = pool.seq(0, 300, 10)
    q = rng.standard_normal((10, 2, 128)).astype(np.float32)
    three = launch(lib, q, pool, pack([seq]), None, 0.088, 10)
    two = launch(lib, q, pool, pack([seq]), None, 0.088, 10, staged=False)
    monkeypatch.setenv("LUCE_EMU_SMEM_OPTIN", str(99 * 1024))
    small = load_attention(tmp_path_factory.mktemp("emu99"))
    for staged in (True, False):
        assert np.array_equal(launch(small, q, pool, pack([seq]), None, 0.088, 10, staged=staged), two), staged
    assert np.array_equal(three, two)
    check_prompt_rows(two, q, pool, pack([seq]), None, 0.088, 10)


@pytest.mark.parametrize("name", list(CASES))
def test_staged_form_gives_the_paged_bits_emulated(lib, name, monkeypatch):
    """The f16 kernel's staged forms (the prompt segments' keys converted to f16 once into the
    workspace, cp.async into shared memory: the default, f16s its 8-warp form, f16w its wide
    form of 4 warps with two m-tiles each, f16l / f16l4 / f16l2 its long form of 6 / 4 warps of
    one m-tile / 4 warps of two whose blocks walk runs of splits, f16g its warpgroup form, D <= 128) against its paged form (every tile
    converting the f32 pages; n_kv_indices = 0, and LUCE_ATTN_PROMPT=f16p with the staging
    workspace given): every output bit the same, at D = 64, 128, 256, over several prompts,
    padding and a tree, the pool's pages shuffled so that a segment's keys sit apart."""
    (hq, hkv, d), specs, tree_seg, prompt_rows = CASES[name]
    rng = np.random.default_rng(len(name) + 5)
    pool = Pool(rng, sum(pages_needed(max(n, 1)) for _, n, _ in specs) + 2, hkv, d)
    seqs = [pool.seq(*s) for s in specs]
    trees = [random_tree(rng, specs[i][2]) if i == tree_seg else None for i in range(len(specs))]
    batch, tp = pack_trees(seqs, trees)
    q = rng.standard_normal((batch.n_rows, hq, d)).astype(np.float32)
    monkeypatch.setenv("LUCE_ATTN_PROMPT", "f16")
    staged = launch(lib, q, pool, batch, tp, 1.0 / np.sqrt(d), prompt_rows, guard=16)
    paged = launch(lib, q, pool, batch, tp, 1.0 / np.sqrt(d), prompt_rows, staged=False)
    assert np.array_equal(staged.view(np.uint32), paged.view(np.uint32))
    for form in ("f16p", "f16s") + (("f16w", "f16l", "f16l4", "f16l2", "f16g") if d <= 128 else ()):
        monkeypatch.setenv("LUCE_ATTN_PROMPT", form)
        forced = launch(lib, q, pool, batch, tp, 1.0 / np.sqrt(d), prompt_rows, guard=16)
        assert np.array_equal(forced.view(np.uint32), paged.view(np.uint32)), form
    check_prompt_rows(staged, q, pool, batch, tp, 1.0 / np.sqrt(d), prompt_rows)


def test_decode_rows_same_bits_in_any_head_group_and_merged_in_kernel_emulated(lib, monkeypatch):
    """AR rows over 1-3 partitions, padding and a tree: the combine launch
    (no counters) and the in-kernel merge (counters) at 1, 4 (groups of 4 and 2) and 6 query heads a block give
    the same bits, every counter is zero again after the launch, and padding stays unwritten."""
    hq, hkv, d = 12, 2, 64
    rng = np.random.default_rng(17)
    specs = [(0, 1, 1), (1, 256, 1), (2, 257, 1), (-1, 0, 2), (3, 600, 1), (5, 140, 6)]
    pool = Pool(rng, sum(pages_needed(max(n, 1)) for _, n, _ in specs) + 2, hkv, d)
    seqs = [pool.seq(*s) for s in specs]
    batch, tp = pack_trees(seqs, [None] * 5 + [random_tree(rng, 6)])
    q = rng.standard_normal((batch.n_rows, hq, d)).astype(np.float32)
    scale = 1.0 / 8
    base = launch(lib, q, pool, batch, tp, scale, 0)
    live = batch.seq_slots[np.searchsorted(batch.qo_indptr, np.arange(batch.n_rows), side="right") - 1] >= 0
    np.testing.assert_allclose(base[live], tree_reference(q, pool, batch, tp, scale)[live], *tolerance("attention"))
    assert (base[~live] == FILL).all(), "a padding row was written"
    counters = np.zeros(1 << 10, np.int32)
    for heads, merged in (("1", counters), ("4", counters), ("6", counters), ("6", None)):   # base: 1, combine
        monkeypatch.setenv("LUCE_ATTN_GROUP_HEADS", heads)
        got = launch(lib, q, pool, batch, tp, scale, 0, counters=merged)
        assert np.array_equal(got, base), f"{heads} heads a block, merged in kernel: {merged is not None}"
        assert not counters.any(), "a launch left a merge counter set"


@pytest.mark.parametrize("hq,hkv,d", [(14, 2, 64), (12, 2, 128), (8, 2, 256)])
def test_decode_rows_same_bits_without_tree_parents_emulated(lib, monkeypatch, hq, hkv, d):
    """The partition kernel without tree_parents (its TREE = false form) against the one
    with a parents array of no tree: AR rows over 1-3 partitions and padding, one head and all
    G a block, merged in kernel or by the combine launch: the same bits."""
    rng = np.random.default_rng(d)
    specs = [(0, 140, 1), (1, 17, 1), (-1, 0, 1), (2, 513, 1), (3, 256, 1)]
    pool = Pool(rng, sum(pages_needed(max(n, 1)) for _, n, _ in specs) + 2, hkv, d)
    batch = pack([pool.seq(*s) for s in specs])
    q = rng.standard_normal((batch.n_rows, hq, d)).astype(np.float32)
    scale = 1.0 / np.sqrt(d)
    for heads in ("1", str(hq // hkv)):
        monkeypatch.setenv("LUCE_ATTN_GROUP_HEADS", heads)
        for merged in (None, np.zeros(1 << 10, np.int32)):
            with_tp = launch(lib, q, pool, batch, None, scale, 0, counters=merged)
            got = launch(lib, q, pool, batch, None, scale, 0, counters=merged, no_tree=True)
            assert np.array_equal(got.view(np.uint32), with_tp.view(np.uint32)), f"{heads} heads a block"
    live = batch.seq_slots[np.searchsorted(batch.qo_indptr, np.arange(batch.n_rows), side="right") - 1] >= 0
    np.testing.assert_allclose(got[live], reference(q, pool, batch, scale)[live], *tolerance("attention"))


def test_prompt_rows_take_a_workspace_entry_per_split_emulated(lib, kind, tmp_path_factory, monkeypatch):
    """A launch of prompt rows (1,100 keys: two 1,024-key splits) beside decode rows (600 and
    1,300 keys: 10 chunks of 64 and 11 of 128) sizes its workspace at an entry per split for the prompt
    rows and chunk_grid(1,300) = 16 entries for the others, writes nothing past it, and gives the bits of the
    prompt alone and of the decode rows without prompt rows; 4 bytes less is refused
    (cudaErrorInvalidValue) with nothing written; the f16 keys the kernel stages sit after the
    partials, within the size. Where the prompt kernel does not fit the
    device (a second build that sees a 16 KiB block), the prompt rows take the partition
    kernel and the full size."""
    hq, hkv, d = 4, 1, 64
    rng = np.random.default_rng(11)
    specs = [(0, 1100, 8), (1, 600, 1), (2, 1300, 1)]
    pool = Pool(rng, sum(pages_needed(n) for _, n, _ in specs) + 2, hkv, d)
    seqs = [pool.seq(*s) for s in specs]
    batch = pack(seqs)
    T, prompt = batch.n_rows, 8
    q = rng.standard_normal((T, hq, d)).astype(np.float32)
    scale = 1.0 / 8
    entry = (d + 2) * 4
    n_idx = len(batch.kv_indices)
    sizes = lambda lib, prompt_rows, n=n_idx: lib.luce_attention_workspace_bytes(  # noqa: E731
        T, prompt_rows, hq, d, 1300, hkv, PAGE_SIZE, n)
    chunks = chunk_grid(1300)   # entries a head of a decode row: 16 (a row of 1,024 keys takes 16 of 64)
    partials = prompt * hq * -(-1300 // 1024) * entry + (T - prompt) * hq * chunks * entry
    assert sizes(lib, prompt, 0) == partials
    need = sizes(lib, prompt)   # then f16 K and V of every kv_indices entry's rows, 256-byte aligned
    assert need == -(-partials // 256) * 256 + 2 * 2 * n_idx * PAGE_SIZE * hkv * d
    assert sizes(lib, 0) == T * hq * chunks * entry
    assert sizes(lib, T + 1) == -1 and sizes(lib, prompt, -1) == -1
    got = launch(lib, q, pool, batch, None, scale, prompt, guard=64)
    merged = launch(lib, q, pool, batch, None, scale, prompt, counters=np.zeros(1 << 10, np.int32), guard=64)
    assert np.array_equal(merged.view(np.uint32), got.view(np.uint32))
    check_prompt_rows(got, q, pool, batch, None, scale, prompt, kind=kind)
    alone = launch(lib, q[:prompt], pool, pack(seqs[:1]), None, scale, prompt)
    assert np.array_equal(got[:prompt].view(np.uint32), alone.view(np.uint32)), "a prompt row changed"
    per_row = launch(lib, q, pool, batch, None, scale, 0)
    assert np.array_equal(got[prompt:].view(np.uint32), per_row[prompt:].view(np.uint32)), "a decode row changed"
    short = launch(lib, q, pool, batch, None, scale, prompt, ws_bytes=need - 4, status=1, guard=1)
    assert (short == FILL).all(), "a refused launch wrote its output"

    monkeypatch.setenv("LUCE_EMU_SMEM_OPTIN", str(16 * 1024))
    small = load_attention(tmp_path_factory.mktemp("emu16"))
    assert sizes(small, prompt) == T * hq * chunks * entry
    fallback = launch(small, q, pool, batch, None, scale, prompt, guard=64)
    assert np.array_equal(fallback.view(np.uint32), per_row.view(np.uint32)), "the per-row kernel's bits"


def test_chunk_rule_matches_the_kernel_emulated(lib):
    """luce/ref/attention.py's chunk rule is the kernel's: at D <= 128 its workspace holds
    chunk_grid(max_kv) entries a head for a decode row, and every row of at most max_kv keys fits
    in them at every shortest chunk."""
    assert [chunk_keys(n) for n in (1, 160, 512, 513, 1024, 1025, 2048, 4096, 4097, 32768)] == \
        [32, 32, 32, 64, 64, 128, 128, 256, 256, 256]
    for max_kv in (0, 1, 31, 160, 511, 512, 513, 600, 1024, 1300, 4096, 4097, 9000):
        got = lib.luce_attention_workspace_bytes(3, 0, 4, 64, max_kv, 1, PAGE_SIZE, 0)
        assert got == 3 * 4 * chunk_grid(max_kv) * (64 + 2) * 4, max_kv
        # D = 256 keeps partitions of 256 keys (cmin 256): the workspace of the kernel before chunks
        got = lib.luce_attention_workspace_bytes(3, 0, 4, 256, max_kv, 1, PAGE_SIZE, 0)
        assert got == 3 * 4 * max(1, -(-max_kv // 256)) * (256 + 2) * 4, max_kv
        for cmin in (32, 64, 128, 256):
            assert all(-(-n // chunk_keys(n, cmin)) <= chunk_grid(max_kv, cmin) <= chunk_grid(max_kv)
                       for n in range(1, max_kv + 1)), (max_kv, cmin)


@pytest.mark.parametrize("prefix,n", [(58, 9), (505, 12), (1020, 8)])
def test_tree_rows_bitwise_equal_ar_rows_across_chunks_emulated(lib, monkeypatch, prefix, n):
    """Tree rows whose root paths cross chunk boundaries (32 keys a chunk up to 512 keys, 64 past
    it: prefix 505 also crosses that switch, 1,020 the one to 128) equal the AR rows at their
    positions once committed, at the default shortest chunk and at 64 and 256 (the kernel before
    chunks), in one launch with the AR rows of other lengths; each within the tolerance of the
    exact math."""
    from tests.kernels.test_attention import committed_seq

    hq, hkv, d = 4, 1, 64
    rng = np.random.default_rng(prefix)
    parents = random_tree(rng, n, chain=0.8)
    pool = Pool(rng, pages_needed(prefix + n) * (n + 2) + n, hkv, d)
    tree = pool.seq(0, prefix + n, n)
    batch, tp = pack_trees([tree], [parents])
    q = rng.standard_normal((n, hq, d)).astype(np.float32)
    ar_seqs = [committed_seq(pool, tree, parents, node, slot=1 + node) for node in range(n)]
    for cmin in ("32", "64", "256"):
        monkeypatch.setenv("LUCE_ATTN_CHUNK_MIN", cmin)
        got = launch(lib, q, pool, batch, tp, 0.125, 0, counters=np.zeros(64, np.int32))
        ar = launch(lib, q, pool, pack(ar_seqs), None, 0.125, 0)
        assert np.array_equal(got.view(np.uint32), ar.view(np.uint32)), f"cmin {cmin}: a tree row differs"
        np.testing.assert_allclose(got, tree_reference(q, pool, batch, tp, 0.125), *tolerance("attention"))
