"""The cpu backend's Gated DeltaNet recurrence (luce/cpu/gdn.c): gdn_recurrent, gdn_chunked
(the same per-token recurrence on the cpu) and gdn_recurrent_segments over a slot pool,
against luce/ref/gdn_recurrent.py and luce/ref/gdn_chunked.py, and bitwise against itself:
tokens split over calls or chunks, a segment alone or among 1..129 others, 1, 2 or 4 threads."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from luce.models.packer import SegmentSpec, build_batch
from luce.ref.gdn_chunked import gdn_chunked as ref_chunked
from luce.ref.gdn_recurrent import gdn_recurrent as ref_recurrent
from tests.kernels.cpu_sequence_harness import cpu_backend, same_bits, under_threads
from tests.kernels.gdn_harness import gdn_inputs, random_states
from tests.kernels.tolerances import tolerance

ROWS = [1, 2, 63, 64, 65, 129]
SHAPES = [(3, 32, 48), (1, 128, 128), (5, 16, 16), (2, 17, 33)]   # (Hv, Dk, Dv)


@pytest.fixture(scope="module")
def cpu():
    return cpu_backend()


def assert_close(got, want, kind="gdn_recurrent"):
    rtol, atol = tolerance(kind)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def segments_batch(lengths, slots):
    """A ForwardBatch of one segment per (length, slot); slot -1 is padding."""
    return build_batch([SegmentSpec(slot, [0] * n, 5, [0] * 8, logits="none") for n, slot in zip(lengths, slots)])


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("T", ROWS)
def test_recurrent_and_chunked_match_references(cpu, T, shape):
    H, dk, dv = shape
    rng = np.random.default_rng(T * 5 + dk)
    inputs = gdn_inputs(rng, T, H, dk, dv)
    h0 = random_states(rng, 1, H, dk, dv)[0]
    keep = h0.copy()
    o, h = cpu.gdn_recurrent(*inputs, h0)
    assert same_bits(h0, keep), "the input state changed"
    want_o, want_h = ref_recurrent(*inputs, h0)
    assert_close(o, want_o)
    assert_close(h, want_h)
    oc, hc = cpu.gdn_chunked(*inputs, h0, chunk=64)
    assert same_bits(oc, o) and same_bits(hc, h), "cpu gdn_chunked is the recurrence, bitwise"
    want_o, want_h = ref_chunked(*inputs, h0)
    assert_close(oc, want_o, "gdn_chunked")
    assert_close(hc, want_h, "gdn_chunked")


def test_tokens_split_over_calls_and_threads_give_the_same_bits(cpu):
    H, dk, dv = 4, 128, 128
    rng = np.random.default_rng(1)
    inputs = gdn_inputs(rng, 130, H, dk, dv)
    h0 = random_states(rng, 1, H, dk, dv)[0]
    runs = under_threads(lambda: cpu.gdn_recurrent(*inputs, h0))
    assert all(same_bits(runs[0][0], o) and same_bits(runs[0][1], h) for o, h in runs[1:])
    whole_o, whole_h = runs[0]
    for cuts in ([1], [64], [63, 64, 65], [2, 100, 129]):
        h, outs, bounds = h0, [], [0, *cuts, 130]
        for a, b in zip(bounds, bounds[1:]):
            fn = cpu.gdn_chunked if b - a > 1 else cpu.gdn_recurrent
            o, h = fn(*(x[a:b] for x in inputs), h)
            outs.append(o)
        assert same_bits(np.concatenate(outs), whole_o) and same_bits(h, whole_h), cuts


def test_segments_over_a_pool(cpu):
    """Prefill and AR segments on shuffled slots, padding segments: each segment equals
    gdn_recurrent from its slot's state bitwise, padding rows are zeros, other slots keep
    their states."""
    H, dk, dv = 3, 64, 48
    rng = np.random.default_rng(2)
    lengths, slots = [5, 1, 2, 1, 65, 3, 1], [4, -1, 0, 7, 2, -1, 5]
    batch = segments_batch(lengths, slots)
    inputs = gdn_inputs(rng, batch.n_rows, H, dk, dv)
    pool = random_states(rng, 9, H, dk, dv)
    before = pool.copy()
    o = cpu.gdn_recurrent_segments(*inputs, pool, batch)
    for s, slot in enumerate(slots):
        rows = slice(batch.qo_indptr[s], batch.qo_indptr[s + 1])
        if slot < 0:
            assert (o[rows] == 0).all()
            continue
        want_o, want_h = cpu.gdn_recurrent(*(x[rows] for x in inputs), before[slot])
        assert same_bits(o[rows], want_o) and same_bits(pool[slot], want_h)
        assert_close(o[rows], ref_recurrent(*(x[rows] for x in inputs), before[slot])[0])
    for slot in set(range(9)) - set(slots):
        assert same_bits(pool[slot], before[slot])


def test_ar_rows_bitwise_alone_among_up_to_129_and_any_thread_count(cpu):
    H, dk, dv = 12, 128, 32   # a light pool: 129 slots
    rng = np.random.default_rng(3)
    n = 129
    inputs = gdn_inputs(rng, n, H, dk, dv)
    pool0 = random_states(rng, n, H, dk, dv)
    slots = list(rng.permutation(n))
    target = 17   # row 17, on slot slots[17]
    alone_pool = pool0.copy()
    alone = cpu.gdn_recurrent_segments(*(x[target:target + 1] for x in inputs), alone_pool,
                                       segments_batch([1], [slots[target]]))
    for count in (1, 2, 64, 129):
        lo = max(0, min(target, n - count))
        pool = pool0.copy()
        o = cpu.gdn_recurrent_segments(*(x[lo:lo + count] for x in inputs), pool,
                                       segments_batch([1] * count, slots[lo:lo + count]))
        assert same_bits(o[target - lo], alone[0]) and same_bits(pool[slots[target]], alone_pool[slots[target]])

    def full():
        pool = pool0.copy()
        return cpu.gdn_recurrent_segments(*inputs, pool, segments_batch([1] * n, slots)), pool

    runs = under_threads(full)
    assert all(same_bits(runs[0][0], o) and same_bits(runs[0][1], p) for o, p in runs[1:])


def test_nan_stays_in_its_head(cpu):
    H, dk, dv = 3, 32, 32
    rng = np.random.default_rng(4)
    q, k, v, g, beta = gdn_inputs(rng, 4, H, dk, dv)
    v[1, 2, 3] = np.nan
    o, h = cpu.gdn_recurrent(q, k, v, g, beta, random_states(rng, 1, H, dk, dv)[0])
    assert np.isnan(o[1:, 2]).any() and np.isnan(h[2]).any()
    assert np.isfinite(o[:, :2]).all() and np.isfinite(h[:2]).all() and np.isfinite(o[0]).all()


def test_bad_arguments_raise(cpu):
    H, dk, dv = 2, 16, 16
    rng = np.random.default_rng(5)
    inputs = gdn_inputs(rng, 3, H, dk, dv)
    h0 = random_states(rng, 1, H, dk, dv)[0]
    with pytest.raises(ValueError, match="state"):
        cpu.gdn_recurrent(*inputs, h0[:, :8])
    with pytest.raises(ValueError, match="g"):
        cpu.gdn_recurrent(inputs[0], inputs[1], inputs[2], inputs[3][:2], inputs[4], h0)
    pool = random_states(rng, 3, H, dk, dv)
    with pytest.raises(ValueError, match="share one slot"):
        cpu.gdn_recurrent_segments(*inputs, pool, segments_batch([1, 2], [1, 1]))
    with pytest.raises(ValueError, match="outside the state pool"):
        cpu.gdn_recurrent_segments(*inputs, pool, segments_batch([1, 2], [0, 3]))
    with pytest.raises(ValueError, match="rows"):
        cpu.gdn_recurrent_segments(*inputs, pool, segments_batch([1, 1], [0, 1]))
    with pytest.raises(TypeError, match="in place"):
        cpu.gdn_recurrent_segments(*inputs, pool.astype(np.float64), segments_batch([3], [0]))
    bad = dataclasses.replace(segments_batch([1, 2], [0, 1]), qo_indptr=np.array([0, 2, 1], np.int32))
    with pytest.raises(ValueError, match="qo_indptr"):
        cpu.gdn_recurrent_segments(*inputs, pool, bad)
