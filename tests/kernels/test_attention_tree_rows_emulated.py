"""Tree rows at the models' head shapes on the CPU through the kernels' own source
(tests/kernels/emu): in a launch that mixes trees, an AR row and padding, every tree row gives the
bits of the AR row at its position once its path is committed (DESIGN 5 rule 2), merged in the
kernel or by the combine launch, at any query heads a block; each within the tolerance of the
exact math. tests/kernels/test_attention.py runs the same property on a GPU.
"""
from __future__ import annotations

import numpy as np
import pytest

from luce.models.kv_cache import pages_needed
from tests.kernels.test_attention import Pool, committed_seq, pack, pack_trees, tree_reference
from tests.kernels.test_attention_emulated import FILL, launch, load_attention
from tests.kernels.test_gdn_tree import random_tree
from tests.kernels.tolerances import tolerance

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return load_attention(tmp_path_factory.mktemp("emu"))


# (Hq, Hkv, D), the big tree's prefix and rows: the 27B's head dim and group (G 6) with the root
# path crossing a 256-key partition; the Coder-1.5B's shape with prefix 1,020 (its rows straddle
# the chunk length switch at 1,024 keys); G 8 at D 64 with 30 rows.
CASES = [((12, 2, 256), 500, 23), ((12, 2, 128), 1020, 13), ((8, 1, 64), 300, 30)]


@pytest.mark.parametrize("heads,prefix,n", CASES, ids=["d256_g6", "d128_g6_straddle", "d64_g8"])
def test_tree_rows_equal_ar_rows_at_model_shapes_emulated(lib, monkeypatch, heads, prefix, n):
    """Two trees (n rows over `prefix` keys, 7 rows over 90), an AR row and a padding segment in
    one launch: each tree row's output equals, bit for bit, the AR row at its position once its
    path is committed, at all G heads a block and at 2, merged in the kernel and by the combine
    launch; every merge counter is zero again and padding stays unwritten."""
    hq, hkv, d = heads
    monkeypatch.setenv("LUCE_ATTN_TREE_CLUSTER", "0")  # test_attention_cluster_emulated.py has the cluster form
    rng = np.random.default_rng(prefix + n)
    parents = [random_tree(rng, n, chain=0.7), random_tree(rng, 7, chain=0.5)]
    kv_lens = [prefix + n, 90 + 7]
    pool = Pool(rng, sum((len(p) + 1) * pages_needed(k) for p, k in zip(parents, kv_lens)) + 20, hkv, d)
    trees = [pool.seq(0, kv_lens[0], n), pool.seq(1, kv_lens[1], 7)]
    seqs = [trees[0], pool.seq(2, 200, 1), pool.seq(-1, 0, 2), trees[1]]
    batch, tp = pack_trees(seqs, [parents[0], None, None, parents[1]])
    q = rng.standard_normal((batch.n_rows, hq, d)).astype(np.float32)
    scale = 1.0 / np.sqrt(d)
    tree_rows = np.r_[0:n, n + 3:n + 10]
    ar_seqs = [committed_seq(pool, t, p, node, slot=10 + 20 * i + node)
               for i, (t, p) in enumerate(zip(trees, parents)) for node in range(len(p))]
    ar = launch(lib, q[tree_rows], pool, pack(ar_seqs), None, scale, 0)
    exact = tree_reference(q, pool, batch, tp, scale)
    counters = np.zeros(1 << 12, np.int32)
    for group_heads in (None, "2"):
        if group_heads is None:
            monkeypatch.delenv("LUCE_ATTN_GROUP_HEADS", raising=False)
        else:
            monkeypatch.setenv("LUCE_ATTN_GROUP_HEADS", group_heads)
        for merged in (counters, None):
            got = launch(lib, q, pool, batch, tp, scale, 0, counters=merged)
            what = f"{group_heads or 'all'} heads a block, merged in kernel: {merged is not None}"
            assert np.array_equal(got[tree_rows].view(np.uint32), ar.view(np.uint32)), what
            assert (got[n + 1:n + 3] == FILL).all(), f"{what}: a padding row was written"
            assert not counters.any(), f"{what}: a merge counter was left set"
            live = np.r_[tree_rows, n]
            np.testing.assert_allclose(got[live], exact[live], *tolerance("attention"))
