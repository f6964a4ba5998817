"""Benchmark cases for the GDN recurrent step (cuda/gdn_recurrent.cu) at Qwen3.6-27B shapes:
48 value heads, Dk = Dv = 128, f32 state [slots, 48, 128, 128] (3 MiB per slot and layer).

BENCH_CASES: callables returning (launch_fn, bytes_moved, flops); launch_fn(stream: int = 0)
launches once (the state is updated in place, so replays keep evolving it; g < 0 keeps it
bounded). bytes_moved is the floor: each segment's state read and written once plus its
q, k, v, g, beta and out. Run with `python -m tests.kernels.bench_attention` (both families).
"""
from __future__ import annotations

import functools

import numpy as np

HV, DK, DV = 48, 128, 128


def gdn_case(n_segments: int, tokens_per_segment: int = 1):
    """n_segments slots (AR rows when tokens_per_segment == 1), each its own state."""
    from luce import _cuda_gdn as kg
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.bench_attention import random_device_buffer

    load_kernels()
    T = n_segments * tokens_per_segment
    rng = np.random.default_rng(0)
    qk = rng.standard_normal((2, T, HV, DK))
    qk /= np.linalg.norm(qk, axis=-1, keepdims=True)
    q = DeviceBuffer.from_numpy((qk[0] / np.sqrt(DK)).astype(np.float32))
    k = DeviceBuffer.from_numpy(qk[1].astype(np.float32))
    v = DeviceBuffer.from_numpy(rng.standard_normal((T, HV, DV)).astype(np.float32))
    g = DeviceBuffer.from_numpy((-np.abs(rng.standard_normal((T, HV))) * 0.3).astype(np.float32))
    beta = DeviceBuffer.from_numpy(rng.uniform(0.05, 1, (T, HV)).astype(np.float32))
    state = random_device_buffer(n_segments * HV * DK * DV, 5, scale=0.1)
    out = DeviceBuffer(T * HV * DV * 4)
    qo = DeviceBuffer.from_numpy(np.arange(n_segments + 1, dtype=np.int32) * tokens_per_segment)
    slots = DeviceBuffer.from_numpy(rng.permutation(n_segments).astype(np.int32))
    keep = (q, k, v, g, beta, state, out, qo, slots)

    def launch(stream: int = 0, _keep=keep):
        kg.gdn_recurrent(q.ptr, k.ptr, v.ptr, g.ptr, beta.ptr, state.ptr, out.ptr, qo.ptr, slots.ptr,
                         n_segments, n_segments, HV, DK, DV, stream)

    state_bytes = n_segments * HV * DK * DV * 4 * 2
    io_bytes = T * HV * (2 * DK + 2 * DV + 2) * 4
    flops = T * HV * DK * DV * 8  # decay, predict, write, read: ~4 multiply-adds per element
    return launch, state_bytes + io_bytes, flops


BENCH_CASES = [functools.partial(gdn_case, n, t) for n, t in [(1, 1), (8, 1), (32, 1), (64, 1), (1, 64)]]
for _c in BENCH_CASES:
    _c.__name__ = "gdn_recurrent_" + "_".join(map(str, _c.args))
