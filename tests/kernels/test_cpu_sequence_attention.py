"""The cpu backend's paged attention and KV write (luce/cpu/attention.c) against
luce/ref/attention.py and luce/ref/tree_attention.py, and bitwise against itself: a row is
the same alone or among 1..129 other rows, at any place in the batch, on 1, 2 or 4 threads;
a tree row equals the AR row at its position once its path is committed.

Batches come from luce.models.batch.build_batch over shuffled pages (tests/kernels/
test_attention.py's Pool), so a wrong page lookup cannot pass."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from luce.models.kv_cache import pages_needed
from tests.kernels.cpu_sequence_harness import cpu_backend, same_bits, threads, under_threads
from tests.kernels.test_attention import Pool, committed_seq, pack, pack_trees, reference, tree_reference
from tests.kernels.test_gdn_tree import random_tree
from tests.kernels.tolerances import tolerance

ROWS = [1, 2, 63, 64, 65, 129]
# (Hq, Hkv, D): 1.5B dense, 27B, odd head counts, a group over 8 heads, D not a multiple of 16
HEADS = [(12, 2, 128), (24, 4, 256), (7, 1, 64), (3, 3, 128), (10, 1, 40), (5, 5, 17)]


@pytest.fixture(scope="module")
def cpu():
    return cpu_backend()


def attend(cpu, q, pool, batch, scale, causal=True, tree_parents=None):
    if tree_parents is not None:
        batch = dataclasses.replace(batch, tree_parents=tree_parents)
    return cpu.attention(q, pool, batch, scale, causal)


def assert_close(got, want):
    rtol, atol = tolerance("attention")
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("rows", ROWS)
def test_prefill_segment_parity(cpu, rows, heads):
    hq, hkv, d = heads
    rng = np.random.default_rng(rows * 7 + d + hq)
    pool = Pool(rng, 40, hkv, d)
    context = 300 if rows < 100 else 140
    batch = pack([pool.seq(1, context + rows, rows)])
    q = rng.standard_normal((rows, hq, d)).astype(np.float32)
    scale = 1.0 / np.sqrt(d)
    assert_close(attend(cpu, q, pool, batch, scale), reference(q, pool, batch, scale))


@pytest.mark.parametrize("causal", [True, False])
def test_decode_rows_many_lengths(cpu, causal):
    hq, hkv, d = 12, 2, 128
    rng = np.random.default_rng(11)
    lengths = [1, 15, 16, 17, 255, 256, 257, 1025, 4097]
    pool = Pool(rng, sum(pages_needed(n) for n in lengths) + 5, hkv, d)
    batch = pack([pool.seq(i, n, 1 if causal else min(n, 3)) for i, n in enumerate(lengths)])
    q = (rng.standard_normal((batch.n_rows, hq, d)) * 2).astype(np.float32)
    assert_close(attend(cpu, q, pool, batch, 0.0884, causal), reference(q, pool, batch, 0.0884, causal))


def test_padding_segments_give_zeros_and_live_rows_match(cpu):
    hq, hkv, d = 14, 2, 64
    rng = np.random.default_rng(5)
    pool = Pool(rng, 120, hkv, d)
    seqs = [pool.seq(-1, 0, 3), pool.seq(4, 700, 65), pool.seq(-1, 0, 1), pool.seq(0, 33, 1),
            pool.seq(9, 300, 1), pool.seq(-1, 0, 2)]
    batch = pack(seqs)
    q = rng.standard_normal((batch.n_rows, hq, d)).astype(np.float32)
    got, want = attend(cpu, q, pool, batch, 0.125), reference(q, pool, batch, 0.125)
    padding = np.zeros(batch.n_rows, bool)
    for s in np.flatnonzero(batch.seq_slots < 0):
        padding[batch.qo_indptr[s]:batch.qo_indptr[s + 1]] = True
    assert (got[padding] == 0).all()
    assert_close(got[~padding], want[~padding])


def test_row_bitwise_alone_among_others_anywhere_and_on_any_thread_count(cpu):
    """A decode row and a prefill segment: bitwise the same alone, behind 1..129 other rows
    (decoders and a prefill segment), ahead of them, and on 1, 2, 4 threads."""
    hq, hkv, d = 12, 2, 128
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 300, size=129)
    pool = Pool(rng, int(sum(pages_needed(n) for n in lengths)) + pages_needed(1000) + pages_needed(700), hkv, d)
    others = [pool.seq(i + 2, int(n), 1) for i, n in enumerate(lengths)]
    row, seg = pool.seq(0, 1000, 1), pool.seq(1, 700, 65)
    q_row, q_seg = (rng.standard_normal((n, hq, d)).astype(np.float32) for n in (1, 65))
    q_others = rng.standard_normal((129, hq, d)).astype(np.float32)
    alone_row = attend(cpu, q_row, pool, pack([row]), 0.088)
    alone_seg = attend(cpu, q_seg, pool, pack([seg]), 0.088)
    for n_other in (1, 2, 7, 64, 129):
        for first in (True, False):
            seqs = [row, seg] + others[:n_other] if first else others[:n_other] + [seg, row]
            q = np.concatenate([q_row, q_seg, q_others[:n_other]] if first else [q_others[:n_other], q_seg, q_row])
            got = attend(cpu, q, pool, pack(seqs), 0.088)
            r, s = (got[0:1], got[1:66]) if first else (got[-1:], got[n_other:n_other + 65])
            assert same_bits(r, alone_row) and same_bits(s, alone_seg), (n_other, first)
    batch = pack([row, seg] + others)
    q = np.concatenate([q_row, q_seg, q_others])
    runs = under_threads(lambda: attend(cpu, q, pool, batch, 0.088))
    assert all(same_bits(runs[0], r) for r in runs[1:])
    assert same_bits(runs[0][:1], alone_row)


def test_tree_rows_match_reference_among_other_segments(cpu):
    hq, hkv, d = 12, 2, 128
    rng = np.random.default_rng(17)
    trees = [None, random_tree(rng, 23), None, None, random_tree(rng, 8), random_tree(rng, 64)]
    spec = [(0, 300, 1), (1, 250 + 23, 23), (-1, 0, 3), (2, 40, 5), (3, 1000 + 8, 8), (4, 64, 64)]
    pool = Pool(rng, sum(pages_needed(n) for _, n, _ in spec) + 2, hkv, d)
    seqs = [pool.seq(*s) for s in spec]
    batch, tp = pack_trees(seqs, trees)
    q = rng.standard_normal((batch.n_rows, hq, d)).astype(np.float32)
    got = attend(cpu, q, pool, batch, 0.088, tree_parents=tp)
    live = np.ones(batch.n_rows, bool)
    live[batch.qo_indptr[2]:batch.qo_indptr[3]] = False
    assert (got[~live] == 0).all()
    assert_close(got[live], tree_reference(q, pool, batch, tp, 0.088)[live])


@pytest.mark.parametrize("heads", [(12, 2, 128), (24, 4, 256), (10, 1, 40)])
@pytest.mark.parametrize("prefix,n", [(250, 23), (0, 8), (509, 12), (1024, 8)])
def test_tree_row_bitwise_equals_ar_row_after_commit(cpu, heads, prefix, n):
    """Every tree row (also next to decoders) equals the AR row at its position over the KV
    that commit leaves: the committed prefix then the row's root path."""
    hq, hkv, d = heads
    rng = np.random.default_rng(prefix + n + d)
    parents = random_tree(rng, n, chain=0.7)
    pool = Pool(rng, pages_needed(prefix + n) * (n + 1) + pages_needed(1024) + 2, hkv, d)
    decoder, tree = pool.seq(0, 1024, 1), pool.seq(1, prefix + n, n)
    batch, tp = pack_trees([decoder, tree], [None, parents])
    q = rng.standard_normal((n + 1, hq, d)).astype(np.float32)
    got = attend(cpu, q, pool, batch, 0.0625, tree_parents=tp)
    ar_seqs = [committed_seq(pool, tree, parents, node, slot=2 + node) for node in range(n)]
    ar = attend(cpu, q[1:], pool, pack(ar_seqs), 0.0625)
    for node in range(n):
        assert same_bits(got[1 + node], ar[node]), f"tree row {node} differs from its AR row"
    assert same_bits(got[:1], attend(cpu, q[:1], pool, pack([decoder]), 0.0625))
    tree_batch, tree_tp = pack_trees([tree], [parents])
    assert same_bits(got[1:], attend(cpu, q[1:], pool, tree_batch, 0.0625, tree_parents=tree_tp))


def test_tree_parents_of_minus_one_change_no_bits(cpu):
    hq, hkv, d = 14, 2, 64
    rng = np.random.default_rng(6)
    pool = Pool(rng, 120, hkv, d)
    batch = pack([pool.seq(4, 700, 65), pool.seq(-1, 0, 1), pool.seq(0, 33, 1), pool.seq(9, 300, 1)])
    q = rng.standard_normal((batch.n_rows, hq, d)).astype(np.float32)
    plain = attend(cpu, q, pool, batch, 0.125)
    assert same_bits(plain, attend(cpu, q, pool, batch, 0.125, tree_parents=np.full(batch.n_rows, -1, np.int32)))


def test_nan_stays_in_its_row(cpu):
    hq, hkv, d = 12, 2, 128
    rng = np.random.default_rng(9)
    pool = Pool(rng, 60, hkv, d)
    batch = pack([pool.seq(0, 200, 3), pool.seq(1, 300, 1)])
    q = rng.standard_normal((4, hq, d)).astype(np.float32)
    q[1, 7, 5] = np.nan                 # row 1, query head 7 (KV head 1)
    got = attend(cpu, q, pool, batch, 0.088)
    want = reference(q, pool, batch, 0.088)
    assert np.isnan(got[1, 7]).all() and np.isnan(want[1, 7]).all()
    mask = np.ones(got.shape, bool)
    mask[1, 7] = False
    assert np.isfinite(got[mask]).all()
    assert_close(got[mask], want[mask])
    pool.v[batch.kv_indices[0], 4, 0, 3] = np.nan   # KV index 4 of segment 0, KV head 0
    got = attend(cpu, q, pool, batch, 0.088)
    assert np.isnan(got[0:3, :6, 3]).all() and np.isfinite(got[3]).all()


def test_bad_arguments_raise_value_errors(cpu):
    rng = np.random.default_rng(2)
    pool = Pool(rng, 10, 2, 64)
    batch = pack([pool.seq(0, 40, 2)])
    q = rng.standard_normal((2, 6, 64)).astype(np.float32)
    with pytest.raises(ValueError, match="multiple"):
        attend(cpu, q[:, :5], pool, batch, 0.1)
    with pytest.raises(ValueError, match="D = 64"):
        attend(cpu, q[..., :32], pool, batch, 0.1)
    with pytest.raises(ValueError, match="rows"):
        attend(cpu, q[:1], pool, batch, 0.1)
    bad = dataclasses.replace(batch, kv_indices=np.array([0, 1, 99], np.int32))
    with pytest.raises(ValueError, match="pages lie in the pool"):
        attend(cpu, q, pool, bad, 0.1)
    bad = dataclasses.replace(batch, kv_last_page_len=np.array([17], np.int32))
    with pytest.raises(ValueError, match="last page length"):
        attend(cpu, q, pool, bad, 0.1)
    with pytest.raises(ValueError, match="not a tree"):
        attend(cpu, q, pool, batch, 0.1, tree_parents=np.array([1, 0], np.int32))


def test_kv_write_matches_numpy_backend_bitwise(cpu):
    from luce.ops.numpy_backend import NumpyBackend

    rng = np.random.default_rng(4)
    hkv, d = 2, 128
    pool_np = Pool(rng, 50, hkv, d)
    pool_cpu = dataclasses.make_dataclass("KV", ["k", "v"])(pool_np.k.copy(), pool_np.v.copy())
    seqs = [pool_np.seq(3, 100, 37), pool_np.seq(-1, 0, 2), pool_np.seq(0, 17, 1), pool_np.seq(5, 300, 129)]
    batch = pack(seqs)
    k = rng.standard_normal((batch.n_rows, hkv, d)).astype(np.float32)
    v = rng.standard_normal((batch.n_rows, hkv, d)).astype(np.float32)
    NumpyBackend().kv_write(pool_np, batch, k, v)
    for n in (1, 2, 4):
        with threads(n):
            cpu.kv_write(pool_cpu, batch, k, v)
        assert same_bits(pool_cpu.k, pool_np.k) and same_bits(pool_cpu.v, pool_np.v)
    with pytest.raises(ValueError, match="kv_write"):
        cpu.kv_write(pool_cpu, batch, k[:, :1], v)
