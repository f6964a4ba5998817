"""The GDN chunked-prefill kernels' own source on the CPU (tests/kernels/emu): the tensor-core
kernel (cuda/gdn_chunked_tc.cuh through luce_gdn_chunked) with its shuffle fallback of the mma
(cuda/gdn_mma.cuh), against luce/ref/gdn_chunked.py; bitwise: a prompt cut on chunk multiples,
a segment alone or among others and padding, one-token chunks equal to the recurrent kernel.
The emulation runs a block's CUDA threads as fibers on one host thread (about 0.1 s a
chunk and column block at Dk 64), so the shapes are small; tests/kernels/test_gdn_chunked.py runs the full set on a GPU. The fallback
computes the default (3xTF32) products in exact f32 and the "tf32" variant with its operands
rounded to tf32, as the device does.
"""
from __future__ import annotations

import ctypes as C

import numpy as np
import pytest

from luce.ref.gdn_chunked import gdn_chunked
from tests.kernels.emu import build as emu
from tests.kernels.gdn_harness import gdn_inputs, random_states
from tests.kernels.tolerances import tolerance

pytestmark = pytest.mark.slow
_P = C.c_void_p


class Params(C.Structure):
    """luce_gdn_chunked_params / luce_gdn_recurrent_params (cuda/luce_ops_sequence.h)."""
    _fields_ = ([(n, _P) for n in "q k v g beta state out qo slots start".split()]
                + [("n_slots", C.c_int64)] + [(n, C.c_int32) for n in "n_seg h dk dv".split()])


class RecurrentParams(C.Structure):
    _fields_ = ([(n, _P) for n in "q k v g beta state out qo slots".split()]
                + [("n_slots", C.c_int64)] + [(n, C.c_int32) for n in "n_seg h dk dv".split()])


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = emu.load(["gdn_chunked.cu", "gdn_recurrent.cu"], tmp_path_factory.mktemp("emu_gdn"), "the GDN kernels")
    lib.emu_last_launch_smem.restype = C.c_size_t
    return lib


def run(lib, inputs, states, qo, slots, starts, fill=np.nan, recurrent=False):
    """One launch on copies: (out [T, H, Dv], states after)."""
    q, k, v, g, beta = (np.ascontiguousarray(a) for a in inputs)
    T, H, dk = q.shape
    dv = v.shape[2]
    st = np.ascontiguousarray(states).copy()
    out = np.full((T, H, dv), fill, np.float32)
    meta = [np.ascontiguousarray(a, np.int32) for a in ((qo, slots) if recurrent else (qo, slots, starts))]
    ptrs = [a.ctypes.data for a in (q, k, v, g, beta, st, out, *meta)]
    if recurrent:
        p = RecurrentParams(*ptrs, len(st), len(slots), H, dk, dv)
        assert lib.luce_gdn_recurrent(C.byref(p), None) == 0
    else:
        p = Params(*ptrs, len(st), len(slots), H, dk, dv)
        assert lib.luce_gdn_chunked(C.byref(p), None) == 0
    return out, st


def rows(inputs, begin, end):
    return tuple(a[begin:end] for a in inputs)


def assert_close(got, want, mode="tf32x3"):
    if mode == "tf32":
        rtol, atol = tolerance("gdn_chunked_tf32")
        atol *= float(np.abs(want).max())
    else:
        rtol, atol = tolerance("gdn_chunked_tc" if mode == "tf32x3" else "gdn_chunked")
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("mode", ["tf32x3", "tf32"])
def test_segments_match_reference_with_padding_and_untouched_slots(lib, monkeypatch, mode):
    # Dv 64: one 64-column block (Dv 32 runs in the next test). Segment 0: chunks 54 + 16 from
    # position 10; a padding segment; a one-token segment; 2 tokens at position 64.
    monkeypatch.setenv("LUCE_GDN_CHUNKED", mode)
    H, dk, dv = 1, 64, 64
    rng = np.random.default_rng(3)
    lengths, slots, starts = [70, 3, 1, 2], [2, -1, 0, 3], [10, 0, 7, 64]
    qo = np.concatenate([[0], np.cumsum(lengths)])
    inputs = gdn_inputs(rng, int(qo[-1]), H, dk, dv)
    states = random_states(rng, 5, H, dk, dv)
    got_o, got_s = run(lib, inputs, states, qo, slots, starts, fill=-777.25)
    for s, slot in enumerate(slots):
        r = slice(qo[s], qo[s + 1])
        if slot < 0:
            assert (got_o[r] == np.float32(-777.25)).all(), "a padding row was written"
            continue
        want_o, want_h = gdn_chunked(*rows(inputs, qo[s], qo[s + 1]), states[slot], start_pos=starts[s])
        assert_close(got_o[r], want_o, mode)
        assert_close(got_s[slot], want_h, mode)
    for slot in (1, 4):
        assert np.array_equal(got_s[slot], states[slot]), "a slot no segment names changed"


def test_prompt_cut_on_chunk_multiples_and_among_others_is_bitwise(lib):
    H, dk, dv = 1, 64, 32
    rng = np.random.default_rng(5)
    inputs = gdn_inputs(rng, 80, H, dk, dv)
    states = random_states(rng, 2, H, dk, dv)
    # 80 tokens from position 10: chunks of 54 and 26.
    whole_o, whole_s = run(lib, inputs, states, [0, 80], [1], [10])
    want_o, want_h = gdn_chunked(*inputs, states[1], start_pos=10)
    assert_close(whole_o, want_o)
    assert_close(whole_s[1], want_h)
    head_o, mid_s = run(lib, rows(inputs, 0, 54), states, [0, 54], [1], [10])
    # the second half among a padding segment and another slot's segment of 4 tokens
    other = gdn_inputs(rng, 4, H, dk, dv)
    mixed = tuple(np.concatenate([o[:4], i[54:80], o]) for o, i in zip(other, inputs))
    mixed_o, end_s = run(lib, mixed, mid_s, [0, 4, 30, 34], [-1, 1, 0], [0, 64, 3])
    assert np.array_equal(whole_o, np.concatenate([head_o, mixed_o[4:30]]))
    assert np.array_equal(whole_s[1], end_s[1])
    assert_close(mixed_o[30:], gdn_chunked(*other, mid_s[0], start_pos=3)[0])


def test_one_token_chunk_is_the_recurrent_kernel_bitwise(lib):
    H, dk, dv = 1, 64, 64
    rng = np.random.default_rng(8)
    inputs = gdn_inputs(rng, 5, H, dk, dv)
    states = random_states(rng, 1, H, dk, dv)
    # 5 tokens from position 63: a one-token chunk, then a 4-token chunk.
    chunked_o, chunked_s = run(lib, inputs, states, [0, 5], [0], [63])
    one_o, one_s = run(lib, rows(inputs, 0, 1), states, [0, 1], [0], None, recurrent=True)
    rest_o, rest_s = run(lib, rows(inputs, 1, 5), one_s, [0, 4], [0], [64])
    assert np.array_equal(chunked_o, np.concatenate([one_o, rest_o]))
    assert np.array_equal(chunked_s, rest_s)


def test_unknown_variant_is_refused(lib, monkeypatch):
    monkeypatch.setenv("LUCE_GDN_CHUNKED", "fp8")
    rng = np.random.default_rng(0)
    inputs = gdn_inputs(rng, 2, 1, 64, 32)
    q, k, v, g, beta = inputs
    st, out = random_states(rng, 1, 1, 64, 32), np.zeros((2, 1, 32), np.float32)
    meta = [np.array(a, np.int32) for a in ([0, 2], [0], [0])]
    p = Params(*(a.ctypes.data for a in (q, k, v, g, beta, st, out, *meta)), 1, 1, 1, 64, 32)
    assert lib.luce_gdn_chunked(C.byref(p), None) != 0


# Shared memory a launch takes without a limit (the H200's configuration) and under each
# LUCE_SMEM_LIMIT: the 99 KB of sm_86/89/120, a limit between two compact layouts, RDNA's 64 KB
# (sizes: cuda/gdn_chunked.cu's header).
SMEM_27B = {"tf32x3": {None: 165_120, 101_376: 94_464, 94_463: 69_888, 65_536: 57_600},
            "f32": {None: 126_976, 65_536: 42_496}}


@pytest.mark.parametrize("mode", ["tf32x3", "f32"])
def test_smaller_shared_memory_configurations_give_the_same_bits_27b_shape(lib, monkeypatch, mode):
    # The 27B's GDN heads (Dk = Dv = 128), 2 of them. Segment 0: 100 tokens from position 40
    # (chunks of 24, 64 and 12); segment 1: 2 tokens from 127 (two one-token chunks); padding.
    monkeypatch.setenv("LUCE_GDN_CHUNKED", mode)
    H, dk, dv = 2, 128, 128
    rng = np.random.default_rng(27)
    lengths, slots, starts = [100, 2, 2], [1, 0, -1], [40, 127, 0]
    qo = np.concatenate([[0], np.cumsum(lengths)])
    inputs = gdn_inputs(rng, int(qo[-1]), H, dk, dv)
    states = random_states(rng, 2, H, dk, dv)
    results = {}
    for limit, smem in SMEM_27B[mode].items():
        if limit is None:
            monkeypatch.delenv("LUCE_SMEM_LIMIT", raising=False)
        else:
            monkeypatch.setenv("LUCE_SMEM_LIMIT", str(limit))
        results[limit] = run(lib, inputs, states, qo, slots, starts, fill=-777.25)
        assert lib.emu_last_launch_smem() == smem, f"limit {limit}: not the configuration expected"
    want_o, want_s = results.pop(None)
    for s in range(2):
        r = slice(qo[s], qo[s + 1])
        ref_o, ref_h = gdn_chunked(*rows(inputs, qo[s], qo[s + 1]), states[slots[s]], start_pos=starts[s])
        assert_close(want_o[r], ref_o, mode)
        assert_close(want_s[slots[s]], ref_h, mode)
    for limit, (got_o, got_s) in results.items():
        assert np.array_equal(got_o, want_o), f"limit {limit}: outputs differ from the H200 configuration"
        assert np.array_equal(got_s, want_s), f"limit {limit}: states differ from the H200 configuration"


# The other head dims: (variant, Dk, Dv) -> shared memory by limit (0: refused, nothing fits).
SMEM_OTHER = {("tf32x3", 64, 64): {None: 113_920, 101_376: 97_536, 65_536: 59_648},
              ("tf32x3", 256, 32): {None: 226_560, 101_376: 90_368, 65_536: 0},
              ("f32", 64, 32): {None: 86_016, 65_536: 34_304},
              ("f32", 256, 32): {None: 208_896, 65_536: 58_880}}


@pytest.mark.parametrize("mode, dk, dv", list(SMEM_OTHER))
def test_smaller_shared_memory_configurations_give_the_same_bits_other_head_dims(lib, monkeypatch, mode, dk, dv):
    # 2 heads; 70 tokens from position 10 (chunks of 54 and 16).
    monkeypatch.setenv("LUCE_GDN_CHUNKED", mode)
    H = 2
    rng = np.random.default_rng(dk + dv)
    inputs = gdn_inputs(rng, 70, H, dk, dv)
    states = random_states(rng, 1, H, dk, dv)
    results = {}
    for limit, smem in SMEM_OTHER[mode, dk, dv].items():
        if limit is None:
            monkeypatch.delenv("LUCE_SMEM_LIMIT", raising=False)
        else:
            monkeypatch.setenv("LUCE_SMEM_LIMIT", str(limit))
        if smem == 0:
            st = states.copy()
            q, k, v, g, beta = inputs
            out = np.zeros((70, H, dv), np.float32)
            meta = [np.array(a, np.int32) for a in ([0, 70], [0], [10])]
            p = Params(*(a.ctypes.data for a in (q, k, v, g, beta, st, out, *meta)), 1, 1, H, dk, dv)
            assert lib.luce_gdn_chunked(C.byref(p), None) != 0, f"limit {limit}: no configuration fits"
            assert np.array_equal(st, states), "a refused launch changed the state"
            continue
        results[limit] = run(lib, inputs, states, [0, 70], [0], [10])
        assert lib.emu_last_launch_smem() == smem, f"limit {limit}: not the configuration expected"
    want_o, want_s = results.pop(None)
    ref_o, ref_h = gdn_chunked(*inputs, states[0], start_pos=10)
    assert_close(want_o, ref_o, mode)
    assert_close(want_s[0], ref_h, mode)
    for limit, (got_o, got_s) in results.items():
        assert np.array_equal(got_o, want_o), f"limit {limit}: outputs differ from the H200 configuration"
        assert np.array_equal(got_s, want_s), f"limit {limit}: states differ from the H200 configuration"
