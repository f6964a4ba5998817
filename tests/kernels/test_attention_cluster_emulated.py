"""The cluster form of the decode attention merge (cuda/attention_cluster.cuh, LUCE_ATTN_DECODE=cluster:
a row's chunk blocks as one thread block cluster, merged through distributed shared memory) on the CPU
(tests/kernels/emu runs a cluster's blocks as one set of fibers) against the chain form (workspace,
fence, atomic count, or the combine launch): every output bit the same at the Coder-1.5B (12 / 2,
D 128) and 0.5B (14 / 2, D 64) shapes, rows of 1..2,100 keys alone and together with padding rows,
with and without the fused rope input (its KV bytes too), at one and all query heads a block; the
form really ran (the launch's cluster size); launches it does not take (a tree row, prompt rows, one
chunk) keep the chain form's bits."""
from __future__ import annotations

import ctypes as C

import numpy as np
import pytest

from luce.models.kv_cache import pages_needed
from luce.ref.attention import chunk_grid, chunk_min
from tests.kernels.test_attention import Pool, pack, pack_trees, reference
from tests.kernels.test_attention_emulated import launch, load_attention
from tests.kernels.test_gdn_tree import random_tree
from tests.kernels.test_rope_kv_attention_emulated import SPECS, Step, same_bits
from tests.kernels.test_rope_kv_attention_emulated import lib as rope_lib  # noqa: F401 - a fixture
from tests.kernels.tolerances import tolerance

pytestmark = pytest.mark.slow
SHAPES = {"1p5b": (12, 2, 128), "q05": (14, 2, 64)}
KEYS = [1, 31, 32, 33, 160, 257, 1000, 1024, 2100]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = load_attention(tmp_path_factory.mktemp("emu"))
    lib.emu_last_launch_cluster.restype = C.c_uint
    return lib


def both_forms(lib, monkeypatch, run, cluster_size):
    """run() under LUCE_ATTN_DECODE=chain, then =cluster (which must launch clusters of cluster_size)."""
    monkeypatch.setenv("LUCE_ATTN_DECODE", "chain")
    chain = run()
    assert lib.emu_last_launch_cluster() == 1
    monkeypatch.setenv("LUCE_ATTN_DECODE", "cluster")
    cluster = run()
    assert lib.emu_last_launch_cluster() == cluster_size, "not the form expected"
    return chain, cluster


def check_same(chain, cluster, what):
    assert np.array_equal(np.ascontiguousarray(chain).view(np.uint32), np.ascontiguousarray(cluster).view(np.uint32)), what


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("n", KEYS)
def test_one_decode_row_same_bits_emulated(lib, monkeypatch, shape, n):
    """A decode step of one AR row (the benchmark's launch): chunk_grid(n, chunk_min(D)) blocks of each
    head group one cluster (a row of one chunk keeps the chain form, which then writes the output directly)."""
    hq, hkv, d = SHAPES[shape]
    rng = np.random.default_rng(n)
    pool = Pool(rng, pages_needed(n) + 2, hkv, d)
    batch = pack([pool.seq(0, n, 1)])
    q = rng.standard_normal((1, hq, d)).astype(np.float32)
    scale = 1.0 / np.sqrt(d)
    z = chunk_grid(n, chunk_min(d))
    counters = np.zeros(1 << 10, np.int32)
    chain, cluster = both_forms(lib, monkeypatch, lambda: launch(lib, q, pool, batch, None, scale, 0, no_tree=True,
                                                                 counters=counters), z if z > 1 else 1)
    check_same(chain, cluster, f"{n} keys")
    assert not counters.any()
    np.testing.assert_allclose(cluster, reference(q, pool, batch, scale), *tolerance("attention"))


@pytest.mark.parametrize("shape", list(SHAPES))
def test_many_rows_and_padding_same_bits_emulated(lib, monkeypatch, shape):
    """Every key count of KEYS in one launch with padding rows (clusters of chunk_grid(2,100) = 16,
    shorter rows leaving blocks idle) at one, two and all query heads a block, merged in the kernel
    (counters) or by the combine launch (none): the chain form's bits; padding rows unwritten."""
    hq, hkv, d = SHAPES[shape]
    rng = np.random.default_rng(hq)
    specs = [(i, n, 1) for i, n in enumerate(KEYS[:4])] + [(-1, 0, 2)] + \
        [(4 + i, n, 1) for i, n in enumerate(KEYS[4:])] + [(-1, 0, 1)]
    pool = Pool(rng, sum(pages_needed(max(n, 1)) for _, n, _ in specs) + 2, hkv, d)
    batch = pack([pool.seq(*s) for s in specs])
    q = rng.standard_normal((batch.n_rows, hq, d)).astype(np.float32)
    scale = 1.0 / np.sqrt(d)
    live = batch.seq_slots[np.searchsorted(batch.qo_indptr, np.arange(batch.n_rows), side="right") - 1] >= 0
    for heads in ("1", "2", str(hq // hkv)):
        monkeypatch.setenv("LUCE_ATTN_GROUP_HEADS", heads)
        for counters in (np.zeros(1 << 12, np.int32), None):
            chain, cluster = both_forms(lib, monkeypatch, lambda: launch(lib, q, pool, batch, None, scale, 0, no_tree=True,
                                                                         counters=counters), 16)
            check_same(chain, cluster, f"{heads} heads a block, counters: {counters is not None}")
            assert (cluster[~live] == 1234.5).all(), "a padding row was written"
    np.testing.assert_allclose(cluster[live], reference(q, pool, batch, scale)[live], *tolerance("attention"))


def test_shorter_shortest_chunk_emulated(lib, monkeypatch):
    """LUCE_ATTN_CHUNK_MIN=32 (the floor, under D = 64's default of 128: clusters of 5 at 160 keys)
    over rows of 1, 160 and 40 keys: the chain form's bits."""
    hq, hkv, d = SHAPES["q05"]
    rng = np.random.default_rng(2)
    specs = [(0, 1, 1), (1, 160, 1), (2, 40, 1)]
    pool = Pool(rng, sum(pages_needed(n) for _, n, _ in specs) + 2, hkv, d)
    batch = pack([pool.seq(*s) for s in specs])
    q = rng.standard_normal((batch.n_rows, hq, d)).astype(np.float32)
    monkeypatch.setenv("LUCE_ATTN_CHUNK_MIN", "32")
    chain, cluster = both_forms(lib, monkeypatch, lambda: launch(lib, q, pool, batch, None, 0.125, 0, no_tree=True,
                                                                 counters=np.zeros(256, np.int32)), 5)
    check_same(chain, cluster, "cmin 32")


@pytest.mark.parametrize("shape", list(SHAPES))
def test_tree_rows_in_the_cluster_form_emulated(lib, monkeypatch, shape):
    """LUCE_ATTN_TREE_CLUSTER=1: a verify launch (AR rows beside trees of 6 and 23 rows, a padding
    row) runs clusters and gives the chain form's bits."""
    hq, hkv, d = SHAPES[shape]
    rng = np.random.default_rng(d)
    specs = [(0, 160, 1), (1, 300, 6), (-1, 0, 1), (2, 128, 23)]
    pool = Pool(rng, sum(pages_needed(max(n, 1)) + 8 for _, n, _ in specs), hkv, d)
    batch, tp = pack_trees([pool.seq(*s) for s in specs], [None, random_tree(rng, 6), None, random_tree(rng, 23)])
    q = rng.standard_normal((batch.n_rows, hq, d)).astype(np.float32)
    monkeypatch.setenv("LUCE_ATTN_TREE_CLUSTER", "1")
    for heads in ("1", str(hq // hkv)):
        monkeypatch.setenv("LUCE_ATTN_GROUP_HEADS", heads)
        for counters in (np.zeros(1 << 12, np.int32), None):
            run = lambda: launch(lib, q, pool, batch, tp, 0.09, 0, counters=counters)  # noqa: E731
            monkeypatch.setenv("LUCE_ATTN_DECODE", "chain")
            chain = run()
            assert lib.emu_last_launch_cluster() == 1
            monkeypatch.setenv("LUCE_ATTN_DECODE", "cluster")
            cluster = run()
            assert lib.emu_last_launch_cluster() > 1, "the tree launch did not run clusters"
            check_same(chain, cluster, f"{heads} heads a block, counters {counters is not None}")


def test_launches_it_does_not_take_keep_the_chain_bits_emulated(lib, monkeypatch):
    """A launch of more than kTreeClusterMaxRows (32) tree rows, one the switch turns off
    (LUCE_ATTN_TREE_CLUSTER=0) and a launch with prompt rows take the chain form (cluster size 1
    under LUCE_ATTN_DECODE=cluster), with the same bits; up to 32 tree rows take clusters unasked."""
    hq, hkv, d = SHAPES["1p5b"]
    rng = np.random.default_rng(9)
    for n_tree, switch, size in ((6, "0", 1), (33, None, 1), (26, None, 5)):
        specs = [(0, 160, 1), (1, 300, n_tree)]
        pool = Pool(rng, sum(pages_needed(n) for _, n, _ in specs) + 40, hkv, d)
        batch, tp = pack_trees([pool.seq(*s) for s in specs], [None, random_tree(rng, n_tree)])
        q = rng.standard_normal((batch.n_rows, hq, d)).astype(np.float32)
        if switch is None:
            monkeypatch.delenv("LUCE_ATTN_TREE_CLUSTER", raising=False)
        else:
            monkeypatch.setenv("LUCE_ATTN_TREE_CLUSTER", switch)
        run = lambda: launch(lib, q, pool, batch, tp, 0.09, 0, counters=np.zeros(256, np.int32))  # noqa: E731
        chain, cluster = both_forms(lib, monkeypatch, run, size)
        check_same(chain, cluster, f"a tree launch of {batch.n_rows} rows, switch {switch}")
    monkeypatch.delenv("LUCE_ATTN_TREE_CLUSTER", raising=False)
    batch = pack([pool.seq(2, 200, 5), pool.seq(3, 160, 1)])
    q = rng.standard_normal((batch.n_rows, hq, d)).astype(np.float32)
    run = lambda: launch(lib, q, pool, batch, None, 0.09, 5, no_tree=True, counters=np.zeros(256, np.int32))  # noqa: E731
    chain, cluster = both_forms(lib, monkeypatch, run, 1)
    check_same(chain, cluster, "a launch with prompt rows")


@pytest.mark.parametrize("qk_norm", [False, True], ids=["qwen2", "qwen3"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_fused_rope_input_same_bits_emulated(rope_lib, monkeypatch, shape, qk_norm):  # noqa: F811
    """luce_rope_kv_attention (q/k norm, rotary, the new key's KV write in the kernel) in the cluster
    form: its outputs and KV bytes the chain form's, at 1, 2 and all query heads a block, rows whose
    new key sits inside a chunk, alone in the last one, on a page, padding, up to 1,000 keys."""
    hq, hkv, d = SHAPES[shape]
    rng = np.random.default_rng(d + qk_norm)
    step = Step(rng, hq, hkv, d, SPECS + [(7, 1000, 1)], qk_norm)
    rope_lib.emu_last_launch_cluster.restype = C.c_uint
    for heads in ("1", "2", str(hq // hkv)):
        monkeypatch.setenv("LUCE_ATTN_GROUP_HEADS", heads)
        for counters in (np.zeros(1 << 12, np.int32), None):
            got = both_forms(rope_lib, monkeypatch, lambda: step.fused(rope_lib, counters),
                             chunk_grid(1000, chunk_min(d)))
            for a, b, what in zip(*got, ("out", "k", "v")):
                assert same_bits(a, b), f"{what}: {heads} heads a block, counters {counters is not None}"
