"""PagePool: allocation, failure without change, CSR view, invariants under random use."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from luce.engine.pages import PagePool, PoolExhausted
from luce.models.kv_cache import pages_needed


def test_ensure_grows_and_csr_describes_pages():
    pool = PagePool(8)
    pool.ensure(0, 17)          # 2 pages
    pool.ensure(1, 16)          # 1 page
    pool.ensure(0, 33)          # 3rd page for slot 0
    indptr, indices, last = pool.csr([0, 1], [33, 16])
    assert indptr.tolist() == [0, 3, 4]
    assert indices.tolist() == pool.slot_pages(0) + pool.slot_pages(1)
    assert last.tolist() == [1, 16]
    assert pool.n_used == 4 and pool.n_free == 4
    pool.check()


def test_exhaustion_changes_nothing():
    pool = PagePool(3)
    pool.ensure(0, 32)
    before = (pool.refcount.copy(), list(pool._free), {k: list(v) for k, v in pool.pages.items()})
    with pytest.raises(PoolExhausted, match="needs 2 more KV pages"):
        pool.ensure(1, 17)
    assert np.array_equal(pool.refcount, before[0]) and pool._free == before[1]
    assert pool.pages == before[2]


def test_release_and_truncate_return_pages():
    pool = PagePool(4)
    pool.ensure(0, 64)
    pool.truncate(0, 20)
    assert len(pool.slot_pages(0)) == 2 and pool.n_free == 2
    pool.release(0)
    assert pool.n_free == 4 and pool.slot_pages(0) == []
    pool.check()


def test_csr_rejects_uncovered_length():
    pool = PagePool(2)
    pool.ensure(0, 16)
    with pytest.raises(ValueError, match="cover"):
        pool.csr([0], [17])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["ensure", "truncate", "release"]),
                          st.integers(0, 4), st.integers(0, 100)), max_size=40))
def test_invariants_hold_under_random_operations(ops):
    pool = PagePool(12)
    lengths = {}
    for op, slot, n in ops:
        if op == "ensure":
            try:
                pool.ensure(slot, n)
                lengths[slot] = max(lengths.get(slot, 0), n)
            except PoolExhausted:
                pass
        elif op == "truncate":
            pool.truncate(slot, n)
        else:
            pool.release(slot)
        pool.check()
    for slot, pages in pool.pages.items():
        assert len(pages) <= pages_needed(100)


def test_plan_growth_peeks_and_take_adopts_exactly_those_pages():
    pool = PagePool(6)
    pool.ensure(0, 20)                       # pages 0, 1
    before = pool.digest()
    plan = pool.plan_growth([(0, 40), (1, 5)])
    assert plan == {0: [2], 1: [3]} and pool.digest() == before
    with pytest.raises(PoolExhausted, match="needs 5 more"):
        pool.plan_growth([(0, 40), (1, 80)])
    with pytest.raises(ValueError, match="twice"):
        pool.plan_growth([(1, 5), (1, 6)])
    assert pool.digest() == before
    pool.take(1, plan[1])                    # out of peek order: still exact
    pool.take(0, plan[0])
    assert pool.slot_pages(0) == [0, 1, 2] and pool.slot_pages(1) == [3]
    with pytest.raises(ValueError, match="not distinct free pages"):
        pool.take(2, [3])
    assert pool.peek_free(2) == [4, 5] and pool.n_free == 2
    pool.check()


def test_digest_tracks_every_change():
    pool = PagePool(4)
    seen = {pool.digest()}
    pool.ensure(0, 16)
    seen.add(pool.digest())
    pool.ensure(1, 16)
    seen.add(pool.digest())
    pool.release(0)
    seen.add(pool.digest())
    assert len(seen) == 4
