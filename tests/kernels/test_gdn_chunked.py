"""Gated DeltaNet chunked-prefill kernel (cuda/gdn_chunked.cu: the tensor-core kernel of
cuda/gdn_chunked_tc.cuh, 3xTF32 by default) against luce/ref/gdn_chunked.py: outputs and
resident states, chunks at absolute multiples of 64 (start_pos), padding, untouched slots;
bitwise: cuts on chunk multiples, batch invariance, and one-token chunks equal to the recurrent
kernel (DESIGN 5 rules 3 and 4). The variants LUCE_GDN_CHUNKED=tf32 (one TF32 pass) and f32 (the
f32 CUDA-core kernel) are checked for parity and bitwise cuts too, and the shared-memory
configurations of smaller GPUs (LUCE_SMEM_LIMIT) for the same bits as this GPU's."""
from __future__ import annotations

import numpy as np
import pytest

from luce.ref.gdn_chunked import gdn_chunked
from tests.kernels.gdn_harness import SENTINEL, assert_padded_segments, gdn_inputs, random_states, run_gdn_kernel
from tests.kernels.harness import csr_indptr
from tests.kernels.test_gdn_recurrent import run_kernel as run_recurrent
from tests.kernels.tolerances import tolerance

TOKENS = [1, 2, 63, 64, 65, 129]


def run_kernel(inputs, states, qo_indptr, seq_slots, start_pos, out_fill=np.nan, raw_out=False):
    """Launch luce_gdn_chunked on copies; returns (out [T, Hv, Dv], states after)."""
    return run_gdn_kernel("gdn_chunked", inputs, states, (qo_indptr, seq_slots, start_pos), out_fill,
                          raw_out)


VARIANTS = {"tf32x3": "gdn_chunked_tc", "tf32": "gdn_chunked_tf32", "f32": "gdn_chunked"}


def assert_close(got, want, mode="tf32x3"):
    rtol, atol = tolerance(VARIANTS[mode])
    if mode == "tf32":  # atol in units of the largest |value|
        atol *= float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def rows(inputs, begin, end):
    return tuple(a[begin:end] for a in inputs)


def test_reference_cut_on_chunk_multiple_is_bitwise():
    rng = np.random.default_rng(0)
    inputs = gdn_inputs(rng, 80, 2, 8, 8)
    h0 = random_states(rng, 1, 2, 8, 8)[0]
    o, h = gdn_chunked(*rows(inputs, 0, 80), h0, start_pos=10)
    o1, h1 = gdn_chunked(*rows(inputs, 0, 54), h0, start_pos=10)
    o2, h2 = gdn_chunked(*rows(inputs, 54, 80), h1, start_pos=64)
    assert np.array_equal(o, np.concatenate([o1, o2])) and np.array_equal(h, h2)


@pytest.mark.gpu
@pytest.mark.parametrize("T", TOKENS)
@pytest.mark.parametrize("start", [0, 5, 63])
def test_segment_parity_27b_heads(T, start):
    _check_parity(T, start, 3, 128, 128)


@pytest.mark.gpu
@pytest.mark.parametrize("T", TOKENS)
@pytest.mark.parametrize("H,dk,dv", [(5, 64, 64), (1, 256, 32), (2, 128, 96)])
def test_segment_parity_other_shapes(T, H, dk, dv):
    _check_parity(T, 0, H, dk, dv)


def _check_parity(T, start, H, dk, dv):
    rng = np.random.default_rng(T * 131 + start * 7 + dk)
    inputs = gdn_inputs(rng, T, H, dk, dv)
    states = random_states(rng, 3, H, dk, dv)
    got_o, got_states = run_kernel(inputs, states, [0, T], [2], [start])
    want_o, want_h = gdn_chunked(*inputs, states[2], start_pos=start)
    assert_close(got_o, want_o)
    assert_close(got_states[2], want_h)
    assert np.array_equal(got_states[:2], states[:2]), "another slot's state changed"


@pytest.mark.gpu
def test_segments_with_padding_and_untouched_slots():
    H, dk, dv = 3, 128, 128
    rng = np.random.default_rng(4)
    lengths, slots, starts = [70, 3, 1, 40, 2], [2, -1, 0, 5, -1], [30, 0, 63, 128, 0]
    qo = csr_indptr(lengths)
    inputs = gdn_inputs(rng, int(qo[-1]), H, dk, dv)
    states = random_states(rng, 7, H, dk, dv)
    got_o, got_states = run_kernel(inputs, states, qo, slots, starts, out_fill=SENTINEL)

    def want(s):
        return gdn_chunked(*rows(inputs, qo[s], qo[s + 1]), states[slots[s]], start_pos=starts[s])

    assert_padded_segments(got_o, got_states, states, qo, slots, want, assert_close)


@pytest.mark.gpu
def test_prompt_cut_on_chunk_multiples_is_bitwise_one_segment():
    H, dk, dv = 4, 128, 128
    rng = np.random.default_rng(12)
    inputs = gdn_inputs(rng, 150, H, dk, dv)
    states = random_states(rng, 1, H, dk, dv)
    whole_o, whole_s = run_kernel(inputs, states, [0, 150], [0], [0])
    a_o, mid_s = run_kernel(rows(inputs, 0, 64), states, [0, 64], [0], [0])
    b_o, end_s = run_kernel(rows(inputs, 64, 150), mid_s, [0, 86], [0], [64])
    assert np.array_equal(whole_o, np.concatenate([a_o, b_o]))
    assert np.array_equal(whole_s, end_s)


@pytest.mark.gpu
def test_segment_bitwise_identical_alone_and_among_others():
    H, dk, dv = 3, 128, 128
    rng = np.random.default_rng(6)
    inputs = gdn_inputs(rng, 100, H, dk, dv)
    states = random_states(rng, 4, H, dk, dv)
    together_o, together_s = run_kernel(inputs, states, [0, 30, 95, 100], [1, 3, 0], [0, 17, 64])
    alone_o, alone_s = run_kernel(rows(inputs, 30, 95), states, [0, 65], [3], [17])
    assert np.array_equal(alone_o, together_o[30:95])
    assert np.array_equal(alone_s[3], together_s[3])


@pytest.mark.gpu
def test_one_token_chunks_are_the_recurrent_kernel_bitwise():
    H, dk, dv = 3, 128, 128
    rng = np.random.default_rng(8)
    inputs = gdn_inputs(rng, 65, H, dk, dv)
    states = random_states(rng, 1, H, dk, dv)
    # 65 tokens from position 0: one 64-token chunk, then a one-token chunk.
    chunked_o, chunked_s = run_kernel(inputs, states, [0, 65], [0], [0])
    head_o, head_s = run_kernel(rows(inputs, 0, 64), states, [0, 64], [0], [0])
    tail_o, tail_s = run_recurrent(rows(inputs, 64, 65), head_s, [0, 1], [0])
    assert np.array_equal(chunked_o, np.concatenate([head_o, tail_o]))
    assert np.array_equal(chunked_s, tail_s)


@pytest.mark.gpu
def test_slot_out_of_range_poisons_outputs_and_keeps_states():
    H, dk, dv = 2, 64, 64
    rng = np.random.default_rng(1)
    inputs = gdn_inputs(rng, 10, H, dk, dv)
    states = random_states(rng, 2, H, dk, dv)
    got_o, got_states = run_kernel(inputs, states, [0, 4, 10], [0, 2], [0, 0], raw_out=True)
    assert np.isnan(got_o[4:]).all()
    assert_close(got_o[:4], gdn_chunked(*rows(inputs, 0, 4), states[0])[0])
    assert np.array_equal(got_states[1], states[1])


@pytest.mark.gpu
@pytest.mark.parametrize("dk,dv", [(96, 64), (128, 48)])
def test_unsupported_head_dims_raise(dk, dv):
    from luce._cuda import KernelError

    rng = np.random.default_rng(0)
    inputs = gdn_inputs(rng, 3, 1, dk, dv)
    with pytest.raises(KernelError, match="luce_gdn_chunked"):
        run_kernel(inputs, random_states(rng, 1, 1, dk, dv), [0, 3], [0], [0])


@pytest.mark.gpu
@pytest.mark.parametrize("mode,T,start", [(m, T, s) for m in VARIANTS for T, s in [(64, 0), (129, 5)]]
                         + [("tf32x3", 1000, 40), ("tf32", 1000, 40)])
def test_variant_parity_27b_head_dims(monkeypatch, mode, T, start):
    monkeypatch.setenv("LUCE_GDN_CHUNKED", mode)
    H, dk, dv = 4, 128, 128
    rng = np.random.default_rng(T + start)
    inputs = gdn_inputs(rng, T, H, dk, dv)
    states = random_states(rng, 2, H, dk, dv)
    got_o, got_states = run_kernel(inputs, states, [0, T], [1], [start])
    want_o, want_h = gdn_chunked(*inputs, states[1], start_pos=start)
    assert_close(got_o, want_o, mode)
    assert_close(got_states[1], want_h, mode)
    assert np.array_equal(got_states[0], states[0])


@pytest.mark.gpu
def test_long_prompt_error_stays_bounded():
    """4,096 tokens (64 chunks) at the 27B head dims: the state error does not grow chunk by chunk."""
    H, dk, dv, T = 2, 128, 128, 4096
    rng = np.random.default_rng(40)
    inputs = gdn_inputs(rng, T, H, dk, dv)
    states = random_states(rng, 1, H, dk, dv)
    got_o, got_states = run_kernel(inputs, states, [0, T], [0], [0])
    want_o, want_h = gdn_chunked(*inputs, states[0])
    assert_close(got_o, want_o)
    assert_close(got_states[0], want_h)
    err = np.abs(got_states[0] - want_h).max() / np.abs(want_h).max()
    print(f"MEASURE gdn_chunked_tc 4096 tokens: state error {err:.3g} of max |state|, "
          f"output error {np.abs(got_o - want_o).max() / np.abs(want_o).max():.3g} of max |out|")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", list(VARIANTS))
def test_variant_cuts_on_chunk_multiples_and_among_others_are_bitwise(monkeypatch, mode):
    monkeypatch.setenv("LUCE_GDN_CHUNKED", mode)
    H, dk, dv = 3, 128, 128
    rng = np.random.default_rng(13)
    inputs = gdn_inputs(rng, 300, H, dk, dv)
    states = random_states(rng, 3, H, dk, dv)
    whole_o, whole_s = run_kernel(rows(inputs, 0, 200), states, [0, 200], [2], [20])
    a_o, mid_s = run_kernel(rows(inputs, 0, 108), states, [0, 108], [2], [20])   # up to position 128
    # the rest among a padding segment and another slot's segment
    mixed = tuple(np.concatenate([x[200:210], x[108:200], x[210:300]]) for x in inputs)
    b_o, end_s = run_kernel(mixed, mid_s, [0, 10, 102, 192], [-1, 2, 0], [0, 128, 7], out_fill=SENTINEL)
    assert np.array_equal(whole_o, np.concatenate([a_o, b_o[10:102]]))
    assert np.array_equal(whole_s[2], end_s[2])


@pytest.mark.gpu
def test_unknown_variant_is_refused(monkeypatch):
    from luce._cuda import KernelError

    monkeypatch.setenv("LUCE_GDN_CHUNKED", "fp8")
    rng = np.random.default_rng(0)
    with pytest.raises(KernelError, match="luce_gdn_chunked"):
        run_kernel(gdn_inputs(rng, 3, 1, 64, 64), random_states(rng, 1, 1, 64, 64), [0, 3], [0], [0])


# LUCE_SMEM_LIMIT values: the 99 KB of RTX 3090 / 4090 / 5090, a limit between two compact
# layouts, the 64 KB of RDNA3/4 (configurations: cuda/gdn_chunked.cu's header).
SMEM_LIMITS = [101_376, 94_463, 65_536]


@pytest.mark.gpu
@pytest.mark.parametrize("mode", list(VARIANTS))
@pytest.mark.parametrize("dk,dv", [(128, 128), (128, 96), (64, 64), (256, 32)])
def test_smaller_shared_memory_configurations_are_bitwise(monkeypatch, mode, dk, dv):
    from luce._cuda import KernelError

    monkeypatch.setenv("LUCE_GDN_CHUNKED", mode)
    H = 3
    rng = np.random.default_rng(dk + dv)
    # 130 tokens from position 40 (chunks of 24, 64, 42), 2 from 127 (one-token chunks), padding
    lengths, slots, starts = [130, 2, 3], [1, 0, -1], [40, 127, 0]
    qo = csr_indptr(lengths)
    inputs = gdn_inputs(rng, int(qo[-1]), H, dk, dv)
    states = random_states(rng, 2, H, dk, dv)
    monkeypatch.delenv("LUCE_SMEM_LIMIT", raising=False)
    want_o, want_s = run_kernel(inputs, states, qo, slots, starts, out_fill=SENTINEL)
    for limit in SMEM_LIMITS:
        monkeypatch.setenv("LUCE_SMEM_LIMIT", str(limit))
        if mode != "f32" and dk == 256 and limit < 90_368:  # no tensor-core layout fits
            with pytest.raises(KernelError, match="luce_gdn_chunked"):
                run_kernel(inputs, states, qo, slots, starts)
            continue
        got_o, got_s = run_kernel(inputs, states, qo, slots, starts, out_fill=SENTINEL)
        assert np.array_equal(got_o, want_o), f"limit {limit}: outputs differ"
        assert np.array_equal(got_s, want_s), f"limit {limit}: states differ"
