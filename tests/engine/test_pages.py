"""PagePool: planned growth taken at commit, failure without change, invariants under random use."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from luce.engine.pages import PagePool, PoolExhausted
from luce.models.kv_cache import pages_needed


def grow(pool, slot, n_tokens):
    """What a step does: plan the pages a slot needs, then take them (its commit)."""
    pool.take(slot, pool.plan_growth([(slot, n_tokens)])[slot])


def test_growth_takes_pages_in_order():
    pool = PagePool(8)
    grow(pool, 0, 17)          # 2 pages
    grow(pool, 1, 16)          # 1 page
    grow(pool, 0, 33)          # 3rd page for slot 0
    assert pool.slot_pages(0) == [0, 1, 3] and pool.slot_pages(1) == [2]
    assert pool.n_used == 4 and pool.n_free == 4 and pool.extra_pages_needed(0, 48) == 0
    pool.check()


def test_exhaustion_changes_nothing():
    pool = PagePool(3)
    grow(pool, 0, 32)
    before = pool.digest()
    with pytest.raises(PoolExhausted, match="needs 2 more KV pages"):
        grow(pool, 1, 17)
    assert pool.digest() == before


def test_release_returns_pages():
    pool = PagePool(4)
    grow(pool, 0, 64)
    pool.release(0)
    assert pool.n_free == 4 and pool.slot_pages(0) == []
    pool.check()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["grow", "release"]), st.integers(0, 4), st.integers(0, 100)),
                max_size=40))
def test_invariants_hold_under_random_operations(ops):
    pool = PagePool(12)
    for op, slot, n in ops:
        if op == "grow":
            try:
                grow(pool, slot, n)
            except PoolExhausted:
                pass
        else:
            pool.release(slot)
        pool.check()
    for slot, pages in pool.pages.items():
        assert len(pages) <= pages_needed(100)


def test_plan_growth_peeks_and_take_adopts_exactly_those_pages():
    pool = PagePool(6)
    grow(pool, 0, 20)                        # pages 0, 1
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
    grow(pool, 0, 16)
    seen.add(pool.digest())
    grow(pool, 1, 16)
    seen.add(pool.digest())
    pool.release(0)
    seen.add(pool.digest())
    assert len(seen) == 4 and np.all(pool.refcount >= 0)
