"""Shared pieces of the Gated DeltaNet kernel tests (test_gdn_recurrent, test_gdn_chunked,
test_gdn_tree): model-like inputs, state pools, and launching a luce._cuda_gdn kernel on
device copies."""
from __future__ import annotations

import numpy as np

SENTINEL = -777.25  # output fill that padding rows must leave untouched


def gdn_inputs(rng, T: int, H: int, dk: int, dv: int):
    """Model-like inputs: q, k L2-normed (q / sqrt(dk)), g <= 0, beta in (0, 1)."""
    def l2(x):
        return x / np.sqrt((x.astype(np.float64) ** 2).sum(-1, keepdims=True) + 1e-6)

    q = (l2(rng.standard_normal((T, H, dk))) / np.sqrt(dk)).astype(np.float32)
    k = l2(rng.standard_normal((T, H, dk))).astype(np.float32)
    v = rng.standard_normal((T, H, dv)).astype(np.float32)
    g = (-np.abs(rng.standard_normal((T, H))) * 0.3).astype(np.float32)
    beta = rng.uniform(0.05, 1.0, (T, H)).astype(np.float32)
    return q, k, v, g, beta


def random_states(rng, n_slots, H, dk, dv):
    return (rng.standard_normal((n_slots, H, dk, dv)) * 0.1).astype(np.float32)


def run_gdn_kernel(kernel: str, inputs, states, meta, out_fill=np.nan, raw_out=False):
    """Launch luce._cuda_gdn.<kernel> ('gdn_recurrent' | 'gdn_chunked') on device copies of
    inputs (q, k [T, Hv, Dk], v [T, Hv, Dv], g, beta [T, Hv] f32) and states
    [n_slots, Hv, Dk, Dv] f32; meta: the kernel's int32 arrays after `out` (qo_indptr,
    seq_slots[, start_pos]). Returns (out [T, Hv, Dv], states after)."""
    from luce import _cuda_gdn as kg
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.harness import GuardedOutput

    k = load_kernels()
    q, kk, v, g, beta = inputs
    T, H, dk = q.shape
    dv = v.shape[2]
    meta = [np.asarray(a, np.int32) for a in meta]
    bufs = [DeviceBuffer.from_numpy(a) for a in (q, kk, v, g, beta, *meta)]
    out = GuardedOutput((T, H, dv), fill=out_fill)
    state = GuardedOutput.holding(states)
    getattr(kg, kernel)(*(b.ptr for b in bufs[:5]), state.ptr, out.ptr, *(b.ptr for b in bufs[5:]),
                        states.shape[0], len(meta[1]), H, dk, dv)
    k.synchronize()
    return (out.raw() if raw_out else out.result()), state.result()


def assert_padded_segments(got_o, got_states, states, qo, slots, want, assert_close):
    """Rows of segments on slot -1 still hold SENTINEL; segment s on a slot matches
    want(s) -> (out rows, final state) within assert_close; slots no segment names kept their
    state bitwise."""
    for s, slot in enumerate(slots):
        rows = slice(qo[s], qo[s + 1])
        if slot < 0:
            assert (got_o[rows] == np.float32(SENTINEL)).all(), "a padding row was written"
            continue
        want_o, want_h = want(s)
        assert_close(got_o[rows], want_o)
        assert_close(got_states[slot], want_h)
    for slot in sorted(set(range(len(states))) - set(slots)):
        assert np.array_equal(got_states[slot], states[slot])
