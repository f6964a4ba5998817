"""Paged GQA attention kernel (cuda/attention.cu) against luce/ref/attention.py.

Batches are packed by luce.models.batch.build_batch, so the kernel reads exactly the CSR the
models produce. KV pages are scattered over a shared pool (random page order) so a wrong page
lookup cannot pass. Batch invariance is checked bitwise (DESIGN 5 rule 2).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from luce.models.packer import SegmentSpec, build_batch
from luce.models.kv_cache import PAGE_SIZE, pages_needed
from luce.ref.attention import attend_row, paged_attention
from luce.ref.tree_attention import paged_attention_with_trees
from tests.kernels.test_gdn_tree import random_tree, root_path
from tests.kernels.tolerances import tolerance

SENTINEL = 1234.5  # fill of outputs that padding rows must leave untouched
ROWS = [1, 2, 63, 64, 65, 129]
HEADS = [(24, 4, 256), (7, 1, 64), (12, 2, 128), (3, 3, 128)]  # (Hq, Hkv, D); 27B first


@dataclass
class Seq:
    """A sequence in the KV pool: `n_rows` query rows ending at KV index kv_len - 1."""
    slot: int
    kv_len: int
    n_rows: int
    pages: list


class Pool:
    """Random K/V pages [n_pages, PAGE_SIZE, Hkv, D] f32 handed out in shuffled order."""

    def __init__(self, rng, n_pages: int, hkv: int, d: int):
        self.k = rng.standard_normal((n_pages, PAGE_SIZE, hkv, d)).astype(np.float32)
        self.v = rng.standard_normal((n_pages, PAGE_SIZE, hkv, d)).astype(np.float32)
        self.free = list(rng.permutation(n_pages))

    def seq(self, slot: int, kv_len: int, n_rows: int) -> Seq:
        if slot < 0:
            return Seq(slot, 0, n_rows, [])
        n = pages_needed(kv_len)
        pages, self.free = self.free[:n], self.free[n:]
        return Seq(slot, kv_len, n_rows, [int(p) for p in pages])


def pack(seqs):
    return build_batch([SegmentSpec(s.slot, [0] * s.n_rows, s.kv_len - s.n_rows if s.slot >= 0 else 0,
                                    s.pages, logits="none") for s in seqs])


def reference(q, pool: Pool, batch, scale, causal=True):
    return paged_attention(q, pool.k, pool.v, batch.qo_indptr, batch.kv_indptr, batch.kv_indices,
                           batch.kv_last_page_len, batch.seq_slots, scale, causal)


def run_kernel(q, pool: Pool, batch, scale, causal=True, max_kv_len=None, fill=np.nan, raw=False,
               tree_parents=None, prompt_rows=0, staged=True, counters=False):
    """Launch luce_attention; returns the output after the guard-band and NaN checks
    (raw=True: the plain download, NaN allowed). tree_parents [T] int32 or None (NULL);
    rows 0..prompt_rows-1 take the prompt-row kernel (cuda/attention_prefill.cu); staged:
    n_kv_indices = len(kv_indices) (the f16 kernel stages the prompt keys as f16), else 0;
    counters: the engine's zeroed merge counters (rows merged in the partition kernel), checked zero after."""
    from luce import _cuda_attention as ka
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.harness import GUARD_BYTES, GuardedOutput

    k = load_kernels()
    T, hq, d = q.shape
    if max_kv_len is None:
        live = [batch.kv_len(s) for s in range(batch.n_segments) if batch.seq_slots[s] >= 0]
        max_kv_len = max(live + [1])
    arrays = (q, pool.k, pool.v, batch.qo_indptr, batch.kv_indptr, batch.kv_indices,
              batch.kv_last_page_len, batch.seq_slots)
    bufs = [DeviceBuffer.from_numpy(a) for a in arrays]
    n_kv_indices = len(batch.kv_indices) if staged else 0
    # prompt rows: an entry per split, then (staged) their keys as f16
    ws_bytes = ka.workspace_bytes(T, hq, d, max_kv_len, prompt_rows, pool.k.shape[2], PAGE_SIZE, n_kv_indices)
    ws = DeviceBuffer(ws_bytes)
    out = GuardedOutput((T, hq, d), fill=fill)
    tp = None if tree_parents is None else DeviceBuffer.from_numpy(np.asarray(tree_parents, np.int32))
    cnt = DeviceBuffer.from_numpy(np.zeros(1 << 16, np.int32)) if counters else None
    merge = {"counters": cnt.ptr, "n_counters": 1 << 16} if counters else {}
    ka.attention(*(b.ptr for b in bufs[:3]), out.ptr, ws.ptr, ws_bytes, *(b.ptr for b in bufs[3:]),
                 T, batch.n_segments, hq, pool.k.shape[2], d, PAGE_SIZE, max_kv_len, scale, causal,
                 tree_parents=0 if tp is None else tp.ptr, prompt_rows=prompt_rows, n_kv_indices=n_kv_indices,
                 **merge)
    k.synchronize()
    assert cnt is None or not cnt.download((1 << 16,), np.int32).any(), "a merge counter left set"
    return out.buf.download(out.shape, np.float32, GUARD_BYTES) if raw else out.result()


def assert_close(got, want):
    rtol, atol = tolerance("attention")
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def test_packed_batch_matches_per_row_definition():
    """The test packing (shuffled pages, padding) is what the reference reads row by row."""
    rng = np.random.default_rng(0)
    pool = Pool(rng, 40, 2, 8)
    seqs = [pool.seq(3, 40, 5), pool.seq(-1, 0, 2), pool.seq(0, 17, 1)]
    batch = pack(seqs)
    q = rng.standard_normal((8, 6, 8)).astype(np.float32)
    got = reference(q, pool, batch, 0.3)
    k, v = pool.k[seqs[0].pages].reshape(-1, 2, 8), pool.v[seqs[0].pages].reshape(-1, 2, 8)
    for j in range(5):
        n = 40 - 5 + j + 1
        want = attend_row(q[j], k[:n].astype(np.float64), v[:n].astype(np.float64), 0.3)
        np.testing.assert_allclose(got[j], want, rtol=1e-6, atol=1e-7)
    assert not got[5:7].any()


@pytest.mark.gpu
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("rows", ROWS)
def test_prefill_segment_parity(rows, heads):
    hq, hkv, d = heads
    rng = np.random.default_rng(rows * 7 + d)
    pool = Pool(rng, 40, hkv, d)
    context = 300 if rows < 100 else 140  # keys cross the 256-key partition boundary
    batch = pack([pool.seq(1, context + rows, rows)])
    q = rng.standard_normal((rows, hq, d)).astype(np.float32)
    scale = 1.0 / np.sqrt(d)
    assert_close(run_kernel(q, pool, batch, scale), reference(q, pool, batch, scale))


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False])
def test_decode_rows_over_many_partitions(causal):
    hq, hkv, d = 24, 4, 256
    rng = np.random.default_rng(11)
    lengths = [1, 15, 16, 17, 255, 256, 257, 512, 513, 2049, 4097]
    pool = Pool(rng, sum(pages_needed(n) for n in lengths) + 5, hkv, d)
    batch = pack([pool.seq(i, n, 1 if causal else min(n, 3)) for i, n in enumerate(lengths)])
    q = (rng.standard_normal((batch.n_rows, hq, d)) * 2).astype(np.float32)
    scale = 1.0 / 16
    assert_close(run_kernel(q, pool, batch, scale, causal), reference(q, pool, batch, scale, causal))


@pytest.mark.gpu
def test_mixed_batch_with_padding_segments_writes_nothing_there():
    hq, hkv, d = 14, 2, 64
    rng = np.random.default_rng(5)
    pool = Pool(rng, 120, hkv, d)
    seqs = [pool.seq(-1, 0, 3), pool.seq(4, 700, 65), pool.seq(-1, 0, 1), pool.seq(0, 33, 1),
            pool.seq(9, 300, 1), pool.seq(-1, 0, 2)]
    batch = pack(seqs)
    q = rng.standard_normal((batch.n_rows, hq, d)).astype(np.float32)
    got = run_kernel(q, pool, batch, 0.125, fill=SENTINEL)
    want = reference(q, pool, batch, 0.125)
    padding = np.zeros(batch.n_rows, bool)
    for s in range(batch.n_segments):
        if batch.seq_slots[s] < 0:
            padding[batch.qo_indptr[s]:batch.qo_indptr[s + 1]] = True
    assert (got[padding] == np.float32(SENTINEL)).all(), "a padding row was written"
    assert_close(got[~padding], want[~padding])


def _fixture(rng, hq=24, hkv=4, d=256):
    """Two established decoders at 1,024 tokens of context (16-token pages) and a width-8
    tree suffix, modelled as 8 causal rows of a third sequence."""
    pool = Pool(rng, 3 * pages_needed(1032) + 2, hkv, d)
    decoders = [pool.seq(0, 1024, 1), pool.seq(1, 1024, 1)]
    tree = pool.seq(2, 1024 + 8, 8)
    q = rng.standard_normal((10, hq, d)).astype(np.float32)
    return pool, decoders, tree, q


@pytest.mark.gpu
def test_decoders_bitwise_identical_alone_and_ahead_of_tree_suffix():
    rng = np.random.default_rng(21)
    pool, decoders, tree, q = _fixture(rng)
    scale = 1.0 / 16
    combined = run_kernel(q, pool, pack(decoders + [tree]), scale)
    assert_close(combined, reference(q, pool, pack(decoders + [tree]), scale))
    pair = run_kernel(q[:2], pool, pack(decoders), scale)
    padded_span = run_kernel(q[:2], pool, pack(decoders), scale, max_kv_len=32768)
    for i, dec in enumerate(decoders):
        alone = run_kernel(q[i:i + 1], pool, pack([dec]), scale)[0]
        assert np.array_equal(alone, combined[i]), f"decoder {i} changed next to the tree rows"
        assert np.array_equal(alone, pair[i])
        assert np.array_equal(alone, padded_span[i]), f"decoder {i} changed with the padded KV span"


@pytest.mark.gpu
def test_row_bitwise_identical_alone_and_in_batch_of_64():
    hq, hkv, d = 24, 4, 256
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 1100, size=64)
    pool = Pool(rng, int(sum(pages_needed(n) for n in lengths)) + 1, hkv, d)
    seqs = [pool.seq(i, int(n), 1) for i, n in enumerate(lengths)]
    q = rng.standard_normal((64, hq, d)).astype(np.float32)
    together = run_kernel(q, pool, pack(seqs), 0.0625)
    for i in (0, 17, 63):
        alone = run_kernel(q[i:i + 1], pool, pack([seqs[i]]), 0.0625)
        assert np.array_equal(alone[0], together[i])


@pytest.mark.gpu
def test_prefill_rows_bitwise_identical_next_to_other_segments():
    hq, hkv, d = 12, 2, 128
    rng = np.random.default_rng(8)
    pool = Pool(rng, 100, hkv, d)
    prefill = pool.seq(2, 600, 64)
    others = [pool.seq(5, 900, 1), pool.seq(-1, 0, 4), pool.seq(6, 20, 3)]
    q = rng.standard_normal((72, hq, d)).astype(np.float32)
    alone = run_kernel(q[:64], pool, pack([prefill]), 0.088)
    mixed = run_kernel(q, pool, pack([prefill] + others), 0.088, fill=SENTINEL)
    assert np.array_equal(alone, mixed[:64])


@pytest.mark.gpu
def test_row_with_more_keys_than_max_kv_len_gets_nan():
    rng = np.random.default_rng(2)
    pool = Pool(rng, pages_needed(200) + pages_needed(600), 1, 64)
    batch = pack([pool.seq(0, 200, 1), pool.seq(1, 600, 1)])
    q = rng.standard_normal((2, 1, 64)).astype(np.float32)
    got = run_kernel(q, pool, batch, 0.125, max_kv_len=256, raw=True)
    assert np.isnan(got[1]).all()
    assert_close(got[:1], reference(q, pool, batch, 0.125)[:1])


@pytest.mark.gpu
@pytest.mark.parametrize("hq,hkv,d", [(8, 3, 64), (4, 4, 96), (34, 2, 64)])
def test_unsupported_shapes_raise(hq, hkv, d):
    from luce._cuda import KernelError

    rng = np.random.default_rng(0)
    pool = Pool(rng, 4, hkv, d)
    batch = pack([pool.seq(0, 10, 1)])
    q = rng.standard_normal((1, hq, d)).astype(np.float32)
    with pytest.raises(KernelError, match="luce_attention"):
        run_kernel(q, pool, batch, 0.1)


# ---- tree rows (tree_parents): prefix plus root path, logical partitions ----------------

def pack_trees(seqs, trees):
    """Pack seqs (as `pack`); trees[i] is seq i's local parents (None: ordinary segment)
    -> (batch, tree_parents [T] int32 global parent rows)."""
    batch = pack(seqs)
    tp = np.full(batch.n_rows, -1, np.int32)
    for s, parents in enumerate(trees):
        if parents is not None:
            r0 = batch.qo_indptr[s]
            tp[r0:r0 + len(parents)] = np.where(np.asarray(parents) >= 0, np.asarray(parents) + r0, -1)
    return batch, tp


def tree_reference(q, pool, batch, tp, scale):
    return paged_attention_with_trees(q, pool.k, pool.v, batch.qo_indptr, batch.kv_indptr, batch.kv_indices,
                                      batch.kv_last_page_len, batch.seq_slots, tp, scale)


def committed_seq(pool: Pool, seq: Seq, parents, node: int, slot: int) -> Seq:
    """A fresh sequence holding seq's committed prefix then node's root path (the KV rows
    moved as commit moves them): the AR row at node's position reads it."""
    prefix = seq.kv_len - seq.n_rows
    path = root_path(parents, node)
    new = pool.seq(slot, prefix + len(path), 1)
    for kv in (pool.k, pool.v):
        rows = kv[seq.pages].reshape(-1, *kv.shape[2:])
        moved = np.concatenate([rows[:prefix], rows[prefix + np.asarray(path)]])
        padded = np.zeros((len(new.pages) * PAGE_SIZE, *kv.shape[2:]), np.float32)
        padded[:len(moved)] = moved
        kv[new.pages] = padded.reshape(len(new.pages), PAGE_SIZE, *kv.shape[2:])
    return new


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [(24, 4, 256), (7, 1, 64), (12, 2, 128)])
def test_tree_rows_match_reference_among_other_segments(heads):
    hq, hkv, d = heads
    rng = np.random.default_rng(d + hq)
    trees = [None, random_tree(rng, 23), None, None, random_tree(rng, 8), random_tree(rng, 64)]
    seqs_spec = [(0, 300, 1), (1, 250 + 23, 23), (-1, 0, 3), (2, 40, 5), (3, 1000 + 8, 8), (4, 64, 64)]
    pool = Pool(rng, sum(pages_needed(n) for _, n, _ in seqs_spec) + 2, hkv, d)
    seqs = [pool.seq(*spec) for spec in seqs_spec]
    batch, tp = pack_trees(seqs, trees)
    q = rng.standard_normal((batch.n_rows, hq, d)).astype(np.float32)
    scale = 1.0 / np.sqrt(d)
    got = run_kernel(q, pool, batch, scale, fill=SENTINEL, tree_parents=tp)
    live = np.ones(batch.n_rows, bool)
    live[batch.qo_indptr[2]:batch.qo_indptr[3]] = False
    assert (got[~live] == np.float32(SENTINEL)).all(), "a padding row was written"
    assert_close(got[live], tree_reference(q, pool, batch, tp, scale)[live])


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [(24, 4, 256), (12, 2, 128)])
@pytest.mark.parametrize("prefix,n", [(250, 23), (243, 30), (0, 8), (509, 12)])
def test_tree_row_bitwise_equals_ar_row_after_commit(prefix, n, heads):
    """Each tree row equals the AR row at its position once its root path is committed,
    also when its keys cross the 256-key partition boundary inside the path (and at D = 128
    the chunk boundaries, and the chunk length's change from 32 to 64 keys past 512 keys)."""
    hq, hkv, d = heads
    rng = np.random.default_rng(prefix + n)
    parents = random_tree(rng, n, chain=0.7)
    pool = Pool(rng, pages_needed(prefix + n) * (n + 1) + n, hkv, d)
    tree = pool.seq(0, prefix + n, n)
    batch, tp = pack_trees([tree], [parents])
    q = rng.standard_normal((n, hq, d)).astype(np.float32)
    got = run_kernel(q, pool, batch, 1.0 / 16, tree_parents=tp)
    ar_seqs = [committed_seq(pool, tree, parents, node, slot=1 + node) for node in range(n)]
    ar = run_kernel(q, pool, pack(ar_seqs), 1.0 / 16)
    depths = [len(root_path(parents, node)) - 1 for node in range(n)]
    if prefix:  # the case must put some row's path across a partition boundary
        assert any((prefix + dd) // 256 > prefix // 256 for dd in depths), "no row crosses a partition"
    for node in range(n):
        assert np.array_equal(got[node], ar[node]), f"tree row {node} differs from its AR row"


@pytest.mark.gpu
def test_issue7_fixture_decoders_and_width8_tree_each_bitwise_alone():
    """Two established decoders at 1,024 tokens (16-token pages) and a width-8 tree suffix
    (1,032 KV rows: 65 pages) in one launch: every row bitwise equal to running it alone,
    the tree rows to the AR rows after commit, the decoders to a launch without trees."""
    hq, hkv, d = 24, 4, 256
    rng = np.random.default_rng(77)
    parents = np.array([-1, 0, 1, 1, 0, 2, 3, 6])
    pool = Pool(rng, 3 * pages_needed(1032) + 9 * pages_needed(1032), hkv, d)
    decoders = [pool.seq(0, 1024, 1), pool.seq(1, 1024, 1)]
    tree = pool.seq(2, 1024 + 8, 8)
    assert len(tree.pages) == 65
    batch, tp = pack_trees(decoders + [tree], [None, None, parents])
    q = rng.standard_normal((10, hq, d)).astype(np.float32)
    scale = 1.0 / 16
    combined = run_kernel(q, pool, batch, scale, tree_parents=tp)
    assert_close(combined, tree_reference(q, pool, batch, tp, scale))
    for i, dec in enumerate(decoders):
        alone = run_kernel(q[i:i + 1], pool, pack([dec]), scale)[0]
        assert np.array_equal(alone, combined[i]), f"decoder {i} changed next to the tree rows"
    tree_batch, tree_tp = pack_trees([tree], [parents])
    tree_alone = run_kernel(q[2:], pool, tree_batch, scale, tree_parents=tree_tp)
    assert np.array_equal(tree_alone, combined[2:]), "tree rows changed next to the decoders"
    for node in range(8):
        ar_seq = committed_seq(pool, tree, parents, node, slot=3 + node)
        ar = run_kernel(q[2 + node:3 + node], pool, pack([ar_seq]), scale)[0]
        assert np.array_equal(ar, combined[2 + node]), f"tree row {node} differs from its AR row"


@pytest.mark.gpu
def test_tree_parents_without_trees_change_no_bits():
    """A tree_parents array of -1 everywhere (and a one-row tree) gives bitwise the NULL result."""
    hq, hkv, d = 14, 2, 64
    rng = np.random.default_rng(6)
    pool = Pool(rng, 120, hkv, d)
    seqs = [pool.seq(4, 700, 65), pool.seq(-1, 0, 1), pool.seq(0, 33, 1), pool.seq(9, 300, 1)]
    batch = pack(seqs)
    q = rng.standard_normal((batch.n_rows, hq, d)).astype(np.float32)
    plain = run_kernel(q, pool, batch, 0.125, fill=SENTINEL)
    flat = run_kernel(q, pool, batch, 0.125, fill=SENTINEL, tree_parents=np.full(batch.n_rows, -1, np.int32))
    assert np.array_equal(plain, flat)


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [(12, 2, 128), (14, 2, 64)], ids=["1p5b", "q05"])
def test_cluster_decode_form_bitwise_equals_chain_form(heads, monkeypatch):
    """LUCE_ATTN_DECODE=cluster (a row's chunk blocks one thread block cluster, merged through
    distributed shared memory: cuda/attention_cluster.cuh) against =chain (the workspace merge):
    every output bit the same, one decode row alone at each key count, and all of them in one launch
    with padding rows, at one and all query heads a block, merged in the kernel or by the combine launch."""
    hq, hkv, d = heads
    rng = np.random.default_rng(d)
    lengths = [1, 31, 32, 33, 160, 257, 1000, 1024, 2100]
    pool = Pool(rng, sum(pages_needed(n) for n in lengths) + 4, hkv, d)
    seqs = [pool.seq(i, n, 1) for i, n in enumerate(lengths)]
    launches = [pack([s]) for s in seqs] + [pack(seqs[:4] + [pool.seq(-1, 0, 2)] + seqs[4:] + [pool.seq(-1, 0, 1)])]
    scale = 1.0 / np.sqrt(d)
    for batch in launches:
        q = (rng.standard_normal((batch.n_rows, hq, d)) * 2).astype(np.float32)
        for group, counters in (("", True), ("1", True), (str(hq // hkv), False)):
            if group:
                monkeypatch.setenv("LUCE_ATTN_GROUP_HEADS", group)
            got = {}
            for form in ("chain", "cluster"):
                monkeypatch.setenv("LUCE_ATTN_DECODE", form)
                got[form] = run_kernel(q, pool, batch, scale, fill=1234.5, raw=True, counters=counters)
            assert np.array_equal(got["chain"].view(np.uint32), got["cluster"].view(np.uint32)), \
                f"{batch.n_rows} rows, group {group or 'default'}, counters {counters}"
            monkeypatch.delenv("LUCE_ATTN_GROUP_HEADS", raising=False)
        live = batch.seq_slots[np.searchsorted(batch.qo_indptr, np.arange(batch.n_rows), side="right") - 1] >= 0
        assert_close(got["cluster"][live], reference(q, pool, batch, scale)[live])


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [(12, 2, 128), (14, 2, 64)], ids=["1p5b", "q05"])
def test_cluster_tree_form_bitwise_equals_chain_form(heads, monkeypatch):
    """LUCE_ATTN_TREE_CLUSTER=1 (a verify launch's tree rows in the cluster form) against the chain
    form: every output bit the same (trees of 23 and 64 rows beside AR rows and padding), close to
    the tree reference."""
    hq, hkv, d = heads
    rng = np.random.default_rng(d + 1)
    trees = [None, random_tree(rng, 23), None, random_tree(rng, 64)]
    seqs_spec = [(0, 300, 1), (1, 128 + 23, 23), (-1, 0, 2), (2, 128 + 64, 64)]
    pool = Pool(rng, sum(pages_needed(max(n, 1)) for _, n, _ in seqs_spec) + 2, hkv, d)
    batch, tp = pack_trees([pool.seq(*spec) for spec in seqs_spec], trees)
    q = rng.standard_normal((batch.n_rows, hq, d)).astype(np.float32)
    scale = 1.0 / np.sqrt(d)
    monkeypatch.setenv("LUCE_ATTN_TREE_CLUSTER", "1")
    got = {}
    for form in ("chain", "cluster"):
        monkeypatch.setenv("LUCE_ATTN_DECODE", form)
        got[form] = run_kernel(q, pool, batch, scale, fill=SENTINEL, raw=True, tree_parents=tp, counters=True)
    assert np.array_equal(got["chain"].view(np.uint32), got["cluster"].view(np.uint32))
    live = np.ones(batch.n_rows, bool)
    live[batch.qo_indptr[2]:batch.qo_indptr[3]] = False
    assert_close(got["cluster"][live], tree_reference(q, pool, batch, tp, scale)[live])
