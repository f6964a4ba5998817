"""StepBuilder: row order, logits rows, CSR, padding, replay keys (same key => same shapes,
and the key is topology only: slots, positions, pages and tree shapes within a bucket leave
it unchanged)."""
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from luce.engine.pages import PagePool, PoolExhausted
from luce.engine.step import ROW_AR, ROW_PAD, ROW_PREFILL, ROW_TREE, Cohort, DecodeRow, PrefillChunk, StepBuilder, TreeChunk
from luce.models.kv_cache import PAGE_SIZE, bucket, pages_needed


def test_bucket_values():
    assert [bucket(n) for n in (0, 1, 2, 3, 5, 33, 64, 65, 128, 129)] == [0, 1, 2, 4, 8, 64, 64, 128, 128, 192]


def pool_with(lengths):
    """A pool where slot i already holds pages for lengths[i] tokens."""
    pool = PagePool(256)
    for slot, n in enumerate(lengths):
        pool.take(slot, pool.plan_growth([(slot, n)])[slot])
    return pool


def test_layout_order_logits_and_csr():
    pool = pool_with([0, 16, 40])
    cohort = Cohort(prefill=[PrefillChunk(0, "a", tuple(range(5)), 0, False)],
                    decode=[DecodeRow(1, "b", 9, 16)],
                    tree=[TreeChunk(2, "c", (1, 2, 3), (-1, 0, 0), 40)])
    step = StepBuilder(pool).build(cohort)
    f = step.forward
    # prefill 5 rows + 3 padding (bucket 8), one AR row, tree 3 rows + 1 padding (width 4)
    assert step.row_kind.tolist() == [ROW_PREFILL] * 5 + [ROW_PAD] * 3 + [ROW_AR] + [ROW_TREE] * 3 + [ROW_PAD]
    assert f.seq_slots.tolist() == [0, -1, 1, 2, -1, -1]
    assert f.positions[:5].tolist() == [0, 1, 2, 3, 4] and f.positions[8] == 16
    assert f.positions[9:12].tolist() == [40, 41, 41]                     # tree rows: start + depth
    assert step.tree_parents[9:12].tolist() == [-1, 9, 9]
    # the prompt is not complete: its last row's logits are computed (a fixed shape) but give
    # no token (slot -1); AR and tree rows do, the tree's padding row too (slot -1)
    assert f.logits_indices.tolist() == [4, 8, 9, 10, 11, 12]
    assert step.logits_position.tolist() == [5, 17, 41, 42, 42, 0]
    assert step.logits_slot.tolist() == [-1, 1, 2, 2, 2, -1]
    # slot 0 gets a fresh page, slot 1 a second page for position 16; both only peeked
    assert step.new_pages == {0: (pool.peek_free(1)[0],), 1: (pool.peek_free(2)[1],), 2: ()}
    assert f.segment_pages(2).tolist() == pool.slot_pages(1) + list(step.new_pages[1]) and f.kv_len(2) == 17
    # the tree's rows are KV rows 40..42 of its own pages (scratch past the committed length)
    assert f.segment_pages(3).tolist() == pool.slot_pages(2) and f.kv_len(3) == 43
    assert step.kv_len_after == {0: 5, 1: 17, 2: 43}
    assert len(f.kv_indices) == bucket(1 + 2 + 3)                         # padded KV span
    assert pool.n_used == pages_needed(16) + pages_needed(40)             # nothing allocated


def test_completed_prompt_tail_reaches_lm_head_and_batch_validates():
    pool = pool_with([64])
    cohort = Cohort(prefill=[PrefillChunk(0, "a", tuple(range(70)), 64, True)])
    step = StepBuilder(pool).build(cohort)
    step.forward.validate()
    assert step.forward.logits_indices.tolist() == [69] and step.logits_position.tolist() == [134]
    assert step.forward.n_rows == 128
    assert step.replay_key == (((ROW_PREFILL, 128),), bucket(pages_needed(134)), 1, bucket(pages_needed(134)) * PAGE_SIZE, ())


def test_unpadded_build_is_exact():
    pool = pool_with([0])
    step = StepBuilder(pool, pad=False).build(Cohort(prefill=[PrefillChunk(0, "a", (1, 2, 3), 0, True)]))
    assert step.forward.n_rows == 3 and step.forward.n_segments == 1 and len(step.forward.kv_indices) == 1


def test_exhausted_pool_and_malformed_cohorts_change_nothing():
    pool = PagePool(2)
    pool.take(0, pool.plan_growth([(0, 16)])[0])
    before = pool.digest()
    with pytest.raises(PoolExhausted):
        StepBuilder(pool).build(Cohort(prefill=[PrefillChunk(1, "b", tuple(range(40)), 0, True)]))
    with pytest.raises(ValueError, match="twice"):
        StepBuilder(pool).build(Cohort(decode=[DecodeRow(0, "a", 1, 16), DecodeRow(0, "a", 1, 16)]))
    with pytest.raises(ValueError, match="at least one token"):
        StepBuilder(pool).build(Cohort(prefill=[PrefillChunk(1, "b", (), 0, True)]))
    with pytest.raises(ValueError, match="earlier node"):
        StepBuilder(pool).build(Cohort(tree=[TreeChunk(0, "a", (1, 2), (1, -1), 16)]))
    with pytest.raises(ValueError, match="earlier node"):
        StepBuilder(pool).build(Cohort(tree=[TreeChunk(0, "a", (1, 2), (-1, -1), 16)]))
    assert pool.digest() == before


cohort_spec = st.fixed_dictionaries({
    "prefill": st.lists(st.tuples(st.integers(1, 200), st.integers(0, 300), st.booleans()), max_size=3),
    "decode": st.lists(st.integers(0, 400), max_size=4),
    "tree": st.lists(st.integers(1, 12), max_size=2),
})


def build_spec(spec, draw_len):
    """Build a StepBatch for a spec; draw_len(n) picks a length (same bucket or exact)."""
    lengths = [p[1] for p in spec["prefill"]] + spec["decode"] + [0] * len(spec["tree"])
    pool = pool_with(lengths)
    cohort, slot = Cohort(), 0
    for n, start, last in spec["prefill"]:
        cohort.prefill.append(PrefillChunk(slot, slot, tuple([3] * draw_len(n)), start, last))
        slot += 1
    for pos in spec["decode"]:
        cohort.decode.append(DecodeRow(slot, slot, 5, pos))
        slot += 1
    for n in spec["tree"]:
        m = draw_len(n)
        cohort.tree.append(TreeChunk(slot, slot, tuple([1] * m), tuple(range(-1, m - 1)), 0))
        slot += 1
    return StepBuilder(pool).build(cohort)


@settings(max_examples=150, deadline=None)
@given(spec=cohort_spec, other=cohort_spec, data=st.data())
def test_same_replay_key_means_same_shapes(spec, other, data):
    """A second cohort with the same topology and lengths redrawn within their buckets (and
    other positions, so other page counts) has the same key exactly when its padded page
    count matches; with the same key every array has the same shape."""
    def within_bucket(n):
        lo = bucket(n) // 2 + 1 if bucket(n) <= 64 else bucket(n) - 63
        return data.draw(st.integers(max(1, lo), bucket(n)))

    a = build_spec(spec, lambda n: n)
    shift = data.draw(st.integers(0, 15))
    sibling = {"prefill": [(n, start + shift, last) for n, start, last in spec["prefill"]],
               "decode": [pos + shift for pos in spec["decode"]], "tree": spec["tree"]}
    b = build_spec(sibling, within_bucket)
    unrelated = build_spec(other, lambda n: n)
    for x, y in ((a, b), (a, unrelated)):
        if x.replay_key == y.replay_key:
            assert x.shapes() == y.shapes()
            assert arena_layout(x) == arena_layout(y)     # one graph's metadata arena fits both
    assume(a.replay_key == b.replay_key)
    assert a.shapes() == b.shapes()
    f = a.forward
    assert f.kv_indptr[-1] == len(f.kv_indices) and f.qo_indptr[-1] == f.n_rows
    live = a.row_kind != ROW_PAD
    assert (a.row_slot[live] >= 0).all() and (a.row_slot[~live] == -1).all()
    kinds = a.row_kind[f.logits_indices]
    assert (kinds[a.logits_slot >= 0] != ROW_PAD).all() and (a.logits_slot[kinds == ROW_PAD] == -1).all()
    assert int(live.sum()) == a.cohort.n_rows
    for s in range(f.n_segments):
        if f.seq_slots[s] >= 0:
            assert f.kv_len(s) == a.kv_len_after[int(f.seq_slots[s])]
            assert len(f.segment_pages(s)) == pages_needed(f.kv_len(s))
    np.testing.assert_array_equal(np.diff(f.qo_indptr) >= 0, True)
    f.validate()
    assert PAGE_SIZE == 16


def arena_layout(step):
    """(dtype, shape) of every array of the step's device metadata arena, and the grid sizes
    the step ops take from the batch (what a captured graph bakes in)."""
    from luce.ops.cuda_step_meta import pack

    _, layout = pack(step.forward.step_arrays())
    f = step.forward
    return ({k: v[1:] for k, v in layout.items()}, f.max_rows, f.max_tree_rows, f.kv_span, f.tree_start, f.has_trees,
            tuple(f.kinds.tolist()))


def test_key_is_topology_only_slots_and_tree_shapes_stay_out():
    """Two steps with other slots, positions and trees of other shapes (same bucket) share the
    key: one graph serves both (DESIGN 4)."""
    pool = pool_with([30, 0, 0, 50, 0])
    a = StepBuilder(pool).build(Cohort(decode=[DecodeRow(0, "a", 1, 30)],
                                       tree=[TreeChunk(3, "d", (1, 2, 3), (-1, 0, 0), 50)]))
    b = StepBuilder(pool).build(Cohort(decode=[DecodeRow(3, "d", 1, 50)],
                                       tree=[TreeChunk(0, "a", (1, 2, 3, 4), (-1, 0, 1, 1), 30)]))
    assert a.replay_key == b.replay_key and a.shapes() == b.shapes() and arena_layout(a) == arena_layout(b)
    assert a.forward.seq_slots.tolist() != b.forward.seq_slots.tolist()
    c = StepBuilder(pool).build(Cohort(decode=[DecodeRow(0, "a", 1, 30)],
                                       tree=[TreeChunk(3, "d", (1, 2, 3, 4, 5), (-1, 0, 1, 2, 3), 50)]))
    assert c.replay_key != a.replay_key          # a tree of 5 rows: the next bucket


def assert_same_step(a, b):
    """Two StepBatches of one cohort are the same step: every array, the key, pages, lengths."""
    fa, fb = a.forward, b.forward
    for name in ("token_ids", "positions", "qo_indptr", "seq_slots", "kv_indptr", "kv_indices", "kv_last_page_len",
                 "logits_indices", "segment_kind"):
        x, y = getattr(fa, name), getattr(fb, name)
        assert x.dtype == y.dtype and x.tolist() == y.tolist(), name
    assert fa.tree_parents is None and fb.tree_parents is None
    assert (fa.replay_key, fa.capture_layers, fa.row_capacity, fa.tree_width, fa.kv_span) == \
        (fb.replay_key, fb.capture_layers, fb.row_capacity, fb.tree_width, fb.kv_span)
    for name in ("logits_slot", "logits_kind", "logits_position"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.tolist() == y.tolist(), name
    assert a.new_pages == b.new_pages and a.kv_len_after == b.kv_len_after
    assert fa.step_values() == fb.step_values()
    assert {k: (v.dtype, v.tolist()) for k, v in fa.step_arrays().items()} == \
        {k: (v.dtype, v.tolist()) for k, v in fb.step_arrays().items()}


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_steady_decode_step_is_the_last_step_advanced_exactly_as_packing_gives_it(data):
    """StepBuilder advances its last step (ForwardBatch.advance) for the same AR rows one
    position on: whatever happens between builds (a commit or none, page boundaries, rows
    joining or leaving, another request in a slot, capture layers, padding off), the step is
    the one a fresh builder packs, and it validates."""
    n_slots = data.draw(st.integers(1, 4))
    pool = pool_with([data.draw(st.integers(1, 40)) for _ in range(n_slots)])
    pad = data.draw(st.booleans())
    builder = StepBuilder(pool, pad=pad)
    kv = {s: len(pool.slot_pages(s)) * PAGE_SIZE - data.draw(st.integers(0, 15)) for s in range(n_slots)}
    owner = {s: f"r{s}" for s in range(n_slots)}
    for _ in range(40):
        event = data.draw(st.sampled_from(["commit"] * 6 + ["none", "drop", "swap", "layers", "tree"]))
        slots = sorted(kv) if event != "drop" else data.draw(st.lists(st.sampled_from(sorted(kv)), min_size=1,
                                                                         max_size=n_slots, unique=True))
        if event == "swap":
            owner[slots[0]] += "'"
        layers = (1,) if event == "layers" else ()
        cohort = Cohort(decode=[DecodeRow(s, owner[s], data.draw(st.integers(0, 99)), kv[s]) for s in slots])
        if event == "tree":
            s = slots.pop()
            cohort = Cohort(decode=cohort.decode[:-1], tree=[TreeChunk(s, owner[s], (1, 2), (-1, 0), kv[s])])
        step = builder.build(cohort, capture_layers=layers)
        if not cohort.tree:
            assert_same_step(step, StepBuilder(pool, pad=pad).build(cohort, capture_layers=layers))
        step.forward.validate(n_slots, 100)
        if event in ("commit", "swap", "layers", "drop"):
            for s, pages in step.new_pages.items():
                pool.take(s, pages)
                kv[s] = step.kv_len_after[s]


def test_steady_decode_packs_only_where_a_page_starts():
    """One request decoding from position 17 to 40: every step is the last one advanced but
    those whose row starts a page (position 32) and the first."""
    pool = pool_with([17])
    builder, packed = StepBuilder(pool), []
    for pos in range(17, 41):
        step = builder.build(Cohort(decode=[DecodeRow(0, "a", pos % 7, pos)]))
        if "_ar_rows" not in step.forward.__dict__:     # set by ForwardBatch.advance
            packed.append(pos)
        pool.take(0, step.new_pages[0])
    assert packed == [17, 32]


def test_an_advanced_batch_keeps_its_validation_only_with_token_ids_in_range():
    pool = pool_with([20, 33])
    builder = StepBuilder(pool)
    first = builder.build(Cohort(decode=[DecodeRow(0, "a", 3, 20), DecodeRow(1, "b", 4, 33)]))
    first.forward.validate(2, 50)
    nxt = first.forward.advance([5, 6])
    assert nxt.__dict__["_validated"] == (2, 50) and nxt.positions.tolist() == [21, 34]
    assert nxt.kv_last_page_len.tolist()[:2] == [6, 3] and nxt.replay_key == first.forward.replay_key
    bad = first.forward.advance([5, 50])
    assert "_validated" not in bad.__dict__
    with pytest.raises(ValueError, match="token id out of range"):
        bad.validate(2, 50)
    step = StepBuilder(pool_with([32])).build(Cohort(decode=[DecodeRow(0, "a", 3, 31)]))
    assert step.forward.advance([1]) is None          # its last page is full: the next row starts one
