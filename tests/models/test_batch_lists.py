"""ForwardBatch's per-step derivations computed on Python lists (luce/models/batch.py) equal their
definitions, written here as whole-array numpy (what they were before they moved to lists):
every row's KV location, the metadata arena's arrays (step_arrays), the KV span; and
validate_batch accepts exactly the batches the definition accepts, naming the same first
inconsistency, over mixed steps [prefill][AR][tree] packed by the engine's StepBuilder (padded
and exact) and randomly broken copies of them."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from luce.engine.pages import PagePool
from luce.engine.step import Cohort, DecodeRow, PrefillChunk, StepBuilder, TreeChunk
from luce.models.batch import SEG_AR, SEG_PAD, SEG_PREFILL, SEG_TREE, validate_batch
from luce.models.kv_cache import PAGE_SIZE, bucket
from luce.ref.tree import tree_depths


# ---- the definitions -------------------------------------------------------------------------
def kv_len(b, s):
    n = int(b.kv_indptr[s + 1] - b.kv_indptr[s])
    return 0 if n == 0 else (n - 1) * PAGE_SIZE + int(b.kv_last_page_len[s])


def row_kv_locations(b):
    pages, offsets, index = (np.full(b.n_rows, -1, np.int64) for _ in range(3))
    for s in range(b.n_segments):
        if b.seq_slots[s] < 0:
            continue
        r0, r1 = b.segment_rows(s)
        idx = np.arange(kv_len(b, s) - (r1 - r0), kv_len(b, s), dtype=np.int64)
        pages[r0:r1] = b.segment_pages(s)[idx // PAGE_SIZE]
        offsets[r0:r1], index[r0:r1] = idx % PAGE_SIZE, idx
    return pages, offsets, index


def step_arrays(b):
    i32 = lambda a: np.ascontiguousarray(a, dtype=np.int32).reshape(-1)  # noqa: E731
    pages, offsets, _ = row_kv_locations(b)
    kinds, slots = b.kinds, b.seq_slots
    first = np.minimum(b.qo_indptr[:-1], max(b.n_rows - 1, 0))
    start = np.where(np.diff(b.qo_indptr) > 0, b.positions[first] if b.n_rows else 0, 0)
    out = dict(token_ids=i32(b.token_ids), positions=i32(b.positions), qo_indptr=i32(b.qo_indptr),
               kv_indptr=i32(b.kv_indptr), kv_indices=i32(b.kv_indices), kv_last_page_len=i32(b.kv_last_page_len),
               seq_slots=i32(slots), kv_dst=np.where(pages >= 0, pages * PAGE_SIZE + offsets, -1).astype(np.int64),
               logits_indices=np.ascontiguousarray(b.logits_indices, dtype=np.int64).reshape(-1), start_pos=i32(start),
               ordinary_slots=i32(np.where((kinds == SEG_PREFILL) | (kinds == SEG_AR), slots, -1)),
               ar_slots=i32(np.where(kinds == SEG_AR, slots, -1)),
               prefill_slots=i32(np.where(kinds == SEG_PREFILL, slots, -1)))
    if b.tree_parents is not None:
        tp = np.asarray(b.tree_parents, dtype=np.int64)
        trees = np.nonzero(kinds == SEG_TREE)[0]
        s0 = int(trees[0]) if trees.size else b.n_segments
        t0 = int(b.qo_indptr[s0]) if trees.size else b.n_rows
        rows = np.concatenate([np.arange(*b.segment_rows(s)) for s in trees] or [np.zeros(0, np.int64)])
        out.update(tree_parents=i32(np.where(np.isin(np.arange(b.n_rows), rows), tp, -1)),
                   tree_slots=i32(np.where(kinds == SEG_TREE, slots, -1)), block_qo=i32(b.qo_indptr[s0:] - t0),
                   block_slots=i32(np.where(kinds[s0:] == SEG_TREE, slots[s0:], -1)),
                   block_parents=i32(np.where(tp[t0:] >= 0, tp[t0:] - t0, -1)))
    return out


def first_inconsistency(b, max_slots, vocab):
    """The message of the first rule `b` breaks (None when valid), segment by segment."""
    T, S = b.n_rows, b.n_segments
    if b.qo_indptr[0] != 0 or b.qo_indptr[-1] != T or np.any(np.diff(b.qo_indptr) < 0):
        return f"qo_indptr {b.qo_indptr.tolist()} must rise from 0 to T={T}"
    if b.kv_indptr[0] != 0 or b.kv_indptr[-1] != len(b.kv_indices) or np.any(np.diff(b.kv_indptr) < 0):
        return f"kv_indptr {b.kv_indptr.tolist()} must rise from 0 to nnz={len(b.kv_indices)}"
    if S and int(b.seq_slots.max()) >= max_slots:
        return f"slot {int(b.seq_slots.max())} >= max_slots {max_slots}"
    if T and (b.token_ids.min() < 0 or b.token_ids.max() >= vocab):
        return f"token id out of range [0, {vocab}): {b.token_ids.min()}..{b.token_ids.max()}"
    tp = None if b.tree_parents is None else np.asarray(b.tree_parents)
    seen_tree = False
    for s in range(S):
        r0, r1 = b.segment_rows(s)
        kind = int(b.kinds[s])
        if (kind == SEG_PAD) != (b.seq_slots[s] < 0):
            return f"segment {s}: kind {kind} does not fit slot {int(b.seq_slots[s])} (padding is slot -1)"
        if kind == SEG_PAD:
            if tp is not None and (tp[r0:r1] >= 0).any():
                return f"segment {s}: padding rows cannot have tree parents"
            continue
        if seen_tree and kind != SEG_TREE:
            return f"segment {s}: tree segments come last (after prefill and AR rows)"
        seen_tree |= kind == SEG_TREE
        if np.diff(b.kv_indptr)[s] and not 1 <= b.kv_last_page_len[s] <= PAGE_SIZE:
            return f"segment {s}: kv_last_page_len {b.kv_last_page_len[s]} not in 1..{PAGE_SIZE}"
        n = kv_len(b, s)
        if r1 - r0 > n:
            return f"segment {s}: {r1 - r0} rows but only {n} KV rows after the step"
        start = n - (r1 - r0)
        if kind == SEG_TREE:
            if tp is None or r1 == r0:
                return f"segment {s}: a tree segment needs tree_parents and at least its root"
            rows = tp[r0:r1].astype(np.int64)
            if (rows[1:] < r0).any():
                return (f"segment {s}: tree_parents {rows.tolist()} must be -1 for the root (row {r0}) and an earlier "
                        "row of the segment for every other row")
            try:
                want = start + tree_depths(np.where(rows >= 0, rows - r0, -1))
            except ValueError as e:
                return str(e)
        else:
            if tp is not None and (tp[r0:r1] >= 0).any():
                return (f"segment {s}: rows of a {'prefill' if kind == SEG_PREFILL else 'AR'} segment cannot have "
                        "tree parents")
            want = np.arange(start, n)
        if not np.array_equal(b.positions[r0:r1], want):
            what = "the committed length plus the depth" if kind == SEG_TREE else \
                "the segment's KV indices (consecutive, ending at kv_len-1)"
            return f"segment {s}: positions {b.positions[r0:r1].tolist()} must be {what}: {want.tolist()}"
    return None


# ---- steps -----------------------------------------------------------------------------------
TREE = (-1, 0, 1, 1, 0, 4, 2)


def random_step(rng, pad: bool):
    """A StepBuilder step of random prefill chunks, AR rows and trees over slots 0..7."""
    pool = PagePool(400)
    slots = rng.permutation(8)[:rng.integers(1, 7)]
    prefill, decode, tree = [], [], []
    for i, slot in enumerate(slots.tolist()):
        committed = int(rng.integers(0, 90))
        if committed:
            pool.take(slot, pool.peek_free(-(-committed // PAGE_SIZE)))
        kind = rng.integers(3) if committed else 0
        if kind == 0:
            n = int(rng.integers(1, 70))
            tokens = tuple(rng.integers(0, 500, n).tolist())
            prefill.append(PrefillChunk(slot, i, tokens, committed, bool(rng.integers(2))))
        elif kind == 1:
            decode.append(DecodeRow(slot, i, int(rng.integers(0, 500)), committed))
        else:
            parents = TREE[:rng.integers(1, len(TREE) + 1)]
            tree.append(TreeChunk(slot, i, tuple(rng.integers(0, 500, len(parents)).tolist()), parents, committed))
    return StepBuilder(pool, pad=pad).build(Cohort(prefill=prefill, decode=decode, tree=tree))


def hand_made(batch):
    """The batch without segment kinds (derived from slots, sizes and parents) or padding
    widths: what direct callers build."""
    return dataclasses.replace(batch, segment_kind=None, row_capacity=0, tree_width=0)


@pytest.mark.parametrize("seed", range(40))
def test_step_arrays_and_kv_locations_follow_their_definitions(seed):
    rng = np.random.default_rng(seed)
    batch = random_step(rng, pad=bool(seed % 2)).forward
    assert first_inconsistency(batch, 8, 500) is None
    for b in (batch, hand_made(batch)):
        if first_inconsistency(b, 8, 500) is not None:   # derived kinds: a lone tree root reads as an AR row
            continue
        validate_batch(b, 8, 500)
        want, got = step_arrays(b), b.step_arrays()
        assert list(got) == list(want)
        for name in want:
            assert got[name].dtype == want[name].dtype and np.array_equal(got[name], want[name]), name
        for g, w in zip(b.row_kv_locations(), row_kv_locations(b)):
            assert g.dtype == np.int64 and np.array_equal(g, w)
        live = np.diff(b.kv_indptr)[b.seq_slots >= 0]
        assert b.kv_span == bucket(int(live.max(initial=0))) * PAGE_SIZE


def _broken(rng, b):
    """A copy of b with one field changed at random."""
    field = rng.choice(["positions", "kv_last_page_len", "tree_parents", "seq_slots", "token_ids", "qo_indptr",
                        "kv_indptr", "segment_kind"])
    value = getattr(b, field)
    if value is None or len(value) == 0:
        return b
    value = np.array(value)
    i = int(rng.integers(len(value)))
    value[i] = {"positions": value[i] + rng.choice([-2, -1, 1, 3]), "kv_last_page_len": rng.choice([0, 17, 5]),
                "tree_parents": rng.integers(-2, max(b.n_rows, 1)), "seq_slots": rng.choice([-1, 0, 3, 9]),
                "token_ids": rng.choice([-1, 500, 7]), "qo_indptr": value[i] + rng.choice([-1, 1]),
                "kv_indptr": value[i] + rng.choice([-1, 1]), "segment_kind": rng.choice([SEG_PAD, SEG_AR, SEG_TREE,
                                                                                        SEG_PREFILL])}[field]
    return dataclasses.replace(b, **{field: value})


@pytest.mark.parametrize("seed", range(40))
def test_validation_names_the_same_first_inconsistency_as_the_definition(seed):
    rng = np.random.default_rng(1000 + seed)
    batch = random_step(rng, pad=bool(seed % 2)).forward
    for b in (batch, hand_made(batch)):
        for _ in range(25):
            bad = _broken(rng, b)
            for _ in range(int(rng.integers(2))):
                bad = _broken(rng, bad)
            try:
                want = first_inconsistency(bad, 8, 500)
            except (IndexError, ValueError):     # the definition cannot even read the CSR: both must refuse
                want = ...
            if want is None:
                validate_batch(bad, 8, 500)
            elif want is ...:
                with pytest.raises((ValueError, IndexError)):
                    validate_batch(bad, 8, 500)
            else:
                with pytest.raises(ValueError) as e:
                    validate_batch(bad, 8, 500)
                assert str(e.value) == want


def test_segment_pages_may_be_any_sequence():
    """The packer takes a segment's pages as a list, a range or a numpy array alike."""
    from luce.models.packer import SegmentSpec, build_batch

    batches = [build_batch([SegmentSpec(0, [1, 2, 3], 20, pages(range(4))), SegmentSpec(1, [5], 3, pages(range(8, 10)))],
                           pad_pages=True) for pages in (list, tuple, lambda r: r, lambda r: np.array(r, np.int64))]
    for b in batches:
        validate_batch(b)
        assert b.replay_key == batches[0].replay_key
        for name in ("kv_indices", "kv_indptr", "kv_last_page_len", "positions"):
            assert np.array_equal(getattr(b, name), getattr(batches[0], name))


def test_a_block_segment_takes_its_first_rows_after_the_first_to_the_lm_head():
    """SegmentSpec.block_logits n: a 'block' segment's logits rows are rows 1..n (all of them
    past the block), and the key follows n; given for another kind, or below 0, it is refused."""
    from luce.models.packer import SegmentSpec, build_batch

    spec = lambda **kw: SegmentSpec(0, [1, 9, 9, 9, 9], 10, [0], logits="block", **kw)  # noqa: E731
    assert build_batch([spec()]).logits_indices.tolist() == [1, 2, 3, 4]
    assert build_batch([spec(block_logits=2)]).logits_indices.tolist() == [1, 2]
    assert build_batch([spec(block_logits=9)]).logits_indices.tolist() == [1, 2, 3, 4]
    assert build_batch([spec(block_logits=2)]).replay_key != build_batch([spec()]).replay_key
    for bad in (dict(block_logits=-1), dict(block_logits=2, logits="all")):
        with pytest.raises(ValueError, match="block_logits"):
            build_batch([SegmentSpec(0, [1, 9, 9], 10, [0], **{"logits": "block", **bad})])


def test_a_batch_without_the_prompt_gemm_has_no_prompt_spans():
    """build_batch(prompt_gemm=False): the prompt rows' matmuls take the decode family (no
    prefill_spans), under a key of its own."""
    from luce.models.packer import SegmentSpec, build_batch

    segs = [SegmentSpec(0, [1, 2, 3], 10, [0]), SegmentSpec(1, [4], 7, [1])]
    both = build_batch(segs), build_batch(segs, prompt_gemm=False)
    assert both[0].prefill_spans == ((0, 3),) and both[1].prefill_spans == ()
    assert both[0].replay_key != both[1].replay_key and not both[1].prompt_gemm
    assert both[1].kinds.tolist() == both[0].kinds.tolist()      # still a prompt segment


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v"]))
