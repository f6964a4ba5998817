"""Gated DeltaNet recurrent-step kernel (cuda/gdn_recurrent.cu) against
luce/ref/gdn_recurrent.py: outputs and the resident state [n_slots, Hv, Dk, Dv], padding
segments, untouched slots, batch and split invariance (bitwise)."""
from __future__ import annotations

import numpy as np
import pytest

from luce.ref.gdn_recurrent import gdn_recurrent
from tests.kernels.gdn_harness import SENTINEL, assert_padded_segments, gdn_inputs, random_states, run_gdn_kernel
from tests.kernels.harness import csr_indptr
from tests.kernels.tolerances import tolerance

TOKENS = [1, 2, 63, 64, 65, 129]


def run_kernel(inputs, states, qo_indptr, seq_slots, out_fill=np.nan, raw_out=False):
    """Launch luce_gdn_recurrent on copies; returns (out [T, Hv, Dv], states after)."""
    return run_gdn_kernel("gdn_recurrent", inputs, states, (qo_indptr, seq_slots), out_fill, raw_out)


def assert_close(got, want):
    rtol, atol = tolerance("gdn_recurrent")
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def test_reference_split_is_bitwise():
    """The contract the kernel keeps too: tokens split over calls equal one call."""
    rng = np.random.default_rng(0)
    inputs = gdn_inputs(rng, 9, 2, 8, 8)
    h0 = random_states(rng, 1, 2, 8, 8)[0]
    o, h = gdn_recurrent(*inputs, h0)
    o1, h1 = gdn_recurrent(*(a[:4] for a in inputs), h0)
    o2, h2 = gdn_recurrent(*(a[4:] for a in inputs), h1)
    assert np.array_equal(o, np.concatenate([o1, o2])) and np.array_equal(h, h2)


@pytest.mark.gpu
@pytest.mark.parametrize("T", TOKENS)
@pytest.mark.parametrize("H,dk,dv", [(3, 128, 128), (5, 64, 64), (1, 256, 32), (2, 128, 96)])
def test_segment_parity_on_largest_slot(T, H, dk, dv):
    rng = np.random.default_rng(T * 31 + H)
    inputs = gdn_inputs(rng, T, H, dk, dv)
    states = random_states(rng, 4, H, dk, dv)
    got_o, got_states = run_kernel(inputs, states, [0, T], [3])
    want_o, want_h = gdn_recurrent(*inputs, states[3])
    assert_close(got_o, want_o)
    assert_close(got_states[3], want_h)
    assert np.array_equal(got_states[:3], states[:3]), "another slot's state changed"


@pytest.mark.gpu
def test_segments_with_padding_and_untouched_slots():
    H, dk, dv = 3, 128, 128
    rng = np.random.default_rng(4)
    lengths = [3, 2, 1, 4, 1]
    slots = [2, -1, 0, 5, -1]
    qo = csr_indptr(lengths)
    inputs = gdn_inputs(rng, int(qo[-1]), H, dk, dv)
    states = random_states(rng, 7, H, dk, dv)
    got_o, got_states = run_kernel(inputs, states, qo, slots, out_fill=SENTINEL)

    def want(s):
        return gdn_recurrent(*(a[qo[s]:qo[s + 1]] for a in inputs), states[slots[s]])

    assert_padded_segments(got_o, got_states, states, qo, slots, want, assert_close)


@pytest.mark.gpu
def test_ar_rows_bitwise_identical_alone_and_in_batch_of_64():
    H, dk, dv = 6, 128, 128
    rng = np.random.default_rng(9)
    inputs = gdn_inputs(rng, 64, H, dk, dv)
    states = random_states(rng, 64, H, dk, dv)
    slots = rng.permutation(64)
    together_o, together_states = run_kernel(inputs, states, np.arange(65), slots)
    for r in (0, 31, 63):
        one = tuple(a[r:r + 1] for a in inputs)
        alone_o, alone_states = run_kernel(one, states, [0, 1], [slots[r]])
        assert np.array_equal(alone_o[0], together_o[r])
        assert np.array_equal(alone_states[slots[r]], together_states[slots[r]])


@pytest.mark.gpu
def test_tokens_split_over_launches_are_bitwise_one_launch():
    H, dk, dv = 4, 128, 128
    rng = np.random.default_rng(12)
    inputs = gdn_inputs(rng, 65, H, dk, dv)
    states = random_states(rng, 2, H, dk, dv)
    whole_o, whole_states = run_kernel(inputs, states, [0, 65], [1])
    first_o, mid_states = run_kernel(tuple(a[:40] for a in inputs), states, [0, 40], [1])
    second_o, end_states = run_kernel(tuple(a[40:] for a in inputs), mid_states, [0, 25], [1])
    assert np.array_equal(whole_o, np.concatenate([first_o, second_o]))
    assert np.array_equal(whole_states, end_states)


@pytest.mark.gpu
def test_slot_out_of_range_poisons_outputs_and_keeps_states():
    H, dk, dv = 2, 64, 64
    rng = np.random.default_rng(1)
    inputs = gdn_inputs(rng, 3, H, dk, dv)
    states = random_states(rng, 2, H, dk, dv)
    got_o, got_states = run_kernel(inputs, states, [0, 1, 3], [0, 2], raw_out=True)
    assert np.isnan(got_o[1:]).all()
    assert_close(got_o[:1], gdn_recurrent(*(a[:1] for a in inputs), states[0])[0])
    assert np.array_equal(got_states[1], states[1])


@pytest.mark.gpu
@pytest.mark.parametrize("dk,dv", [(96, 64), (128, 48)])
def test_unsupported_head_dims_raise(dk, dv):
    from luce._cuda import KernelError

    rng = np.random.default_rng(0)
    inputs = gdn_inputs(rng, 1, 1, dk, dv)
    with pytest.raises(KernelError, match="luce_gdn_recurrent"):
        run_kernel(inputs, random_states(rng, 1, 1, dk, dv), [0, 1], [0])
