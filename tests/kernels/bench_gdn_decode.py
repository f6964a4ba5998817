"""Benchmark cases for the fused GDN decode chain (cuda/gdn_decode.cu, two launches) at the
Qwen3.6-27B GDN shape: 16 key / 48 value heads of 128, conv 4 taps over 10240 channels, one
AR row per segment, each segment its own slot (the unfused chain is conv1d + 12 pointwise
and gather launches + gdn_recurrent + gated_rmsnorm: compare with bench_conv1d and
bench_gdn_recurrent). BENCH_CASES entries return (launch_fn, bytes_moved, flops); both states
evolve in place across replays (g < 0 keeps the recurrent state bounded). bytes_moved is the
floor: each segment's conv and recurrent state read and written once, its projections read,
the output written. gdn_tree_prepare cases: the tree verify's first launch (luce_gdn_tree_prepare)
over trees of 23 rows (a chain's depth 8, then siblings) on 1 or 5 slots; floor: the rows'
projections read, q, k, v, g, beta written. gdn_decode_quant cases: the chain also quantizing
normed for the out projection (its norm epilogue; the 27B's AR step): floor plus the
quantized x written."""
from __future__ import annotations

import functools

import numpy as np

HK, HV, DK, DV, TAPS = 16, 48, 128, 128, 4
CHANNELS = 2 * HK * DK + HV * DV


def gdn_decode_case(n_segments: int, quant: bool = False):
    from luce import _cuda_gdn as kg
    from luce import _cuda_matmul as km
    from luce.ops.gdn_inputs import gdn_q_scale
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.bench_attention import random_device_buffer

    load_kernels()
    T, rng = n_segments, np.random.default_rng(0)
    up = DeviceBuffer.from_numpy
    b = {"qkv": random_device_buffer(T * CHANNELS, 1), "conv": random_device_buffer(CHANNELS * TAPS, 2, scale=0.3),
         "conv_state": random_device_buffer(n_segments * (TAPS - 1) * CHANNELS, 3),
         "b": random_device_buffer(T * HV, 4), "a": random_device_buffer(T * HV, 5),
         "dt_bias": random_device_buffer(HV, 6), "ssm_a": up(-np.exp(rng.standard_normal(HV)).astype(np.float32)),
         "z": random_device_buffer(T * HV * DV, 7), "norm": random_device_buffer(DV, 8),
         "state": random_device_buffer(n_segments * HV * DK * DV, 9, scale=0.1),
         "q": DeviceBuffer(T * HV * DK * 4), "k": DeviceBuffer(T * HV * DK * 4), "v": DeviceBuffer(T * HV * DV * 4),
         "g": DeviceBuffer(T * HV * 4), "beta": DeviceBuffer(T * HV * 4), "out": DeviceBuffer(T * HV * DV * 4),
         "normed": DeviceBuffer(T * HV * DV * 4),
         "arrivals": DeviceBuffer(n_segments * (HV + HV * DV // 256) * 4),
         "qo": up(np.arange(n_segments + 1, dtype=np.int32)),
         "slots": up(rng.permutation(n_segments).astype(np.int32))}
    scale = gdn_q_scale(DK)
    ws_bytes = km.workspace_bytes(T, HV * DV) if quant else 0
    b["workspace"] = DeviceBuffer(max(ws_bytes, 16))

    def launch(stream: int = 0, b=b):
        kg.gdn_decode(*(b[n].ptr for n in ("qkv", "conv", "conv_state", "b", "a", "dt_bias", "ssm_a", "z", "norm",
                                           "state", "q", "k", "v", "g", "beta", "out", "normed", "arrivals", "qo",
                                           "slots")),
                      n_segments, n_segments, HK, HV, DK, DV, TAPS, scale, 1e-6, 1e-6, CHANNELS, HV * DV, HV, HV,
                      stream, b["workspace"].ptr if quant else 0, ws_bytes, T)

    state_bytes = n_segments * (HV * DK * DV + (TAPS - 1) * CHANNELS) * 4 * 2
    io_bytes = T * (CHANNELS + 2 * HV + 2 * HV * DV) * 4 + CHANNELS * TAPS * 4
    flops = T * (HV * DK * DV * 8 + CHANNELS * TAPS * 2)
    return launch, state_bytes + io_bytes + ws_bytes, flops


BENCH_CASES = [functools.partial(gdn_decode_case, n) for n in (1, 8, 32, 64)]
for _c in BENCH_CASES:
    _c.__name__ = f"gdn_decode_{_c.args[0]}x{HK}x{HV}x{DK}"
_QUANT_CASES = [functools.partial(gdn_decode_case, n, True) for n in (1, 8)]
for _c in _QUANT_CASES:
    _c.__name__ = f"gdn_decode_quant_{_c.args[0]}x{HK}x{HV}x{DK}"
BENCH_CASES += _QUANT_CASES


def gdn_tree_prepare_case(n_trees: int, rows: int = 23):
    from luce import _cuda_gdn as kg
    from luce.ops.gdn_inputs import gdn_q_scale
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.bench_attention import random_device_buffer

    load_kernels()
    T, up = n_trees * rows, DeviceBuffer.from_numpy
    local = [-1] + [i - 1 for i in range(1, 8)] + [(i * 5) % 8 for i in range(8, rows)]   # a chain, then siblings
    parents = np.concatenate([[p + t * rows if p >= 0 else -1 for p in local] for t in range(n_trees)])
    b = {"qkv": random_device_buffer(T * CHANNELS, 1), "conv": random_device_buffer(CHANNELS * TAPS, 2, scale=0.3),
         "conv_state": random_device_buffer(n_trees * (TAPS - 1) * CHANNELS, 3),
         "b": random_device_buffer(T * HV, 4), "a": random_device_buffer(T * HV, 5),
         "dt_bias": random_device_buffer(HV, 6), "ssm_a": up(-np.ones(HV, np.float32)),
         "z": random_device_buffer(T * HV * DV, 7),
         "q": DeviceBuffer(T * HV * DK * 4), "k": DeviceBuffer(T * HV * DK * 4), "v": DeviceBuffer(T * HV * DV * 4),
         "g": DeviceBuffer(T * HV * 4), "beta": DeviceBuffer(T * HV * 4),
         "qo": up(np.arange(0, T + 1, rows, dtype=np.int32)), "slots": up(np.arange(n_trees, dtype=np.int32)),
         "parents": up(parents.astype(np.int32)), "stage": DeviceBuffer(T * CHANNELS * 4)}
    scale = gdn_q_scale(DK)

    def launch(stream: int = 0, b=b):
        kg.gdn_tree_prepare(*(b[n].ptr for n in ("qkv", "conv", "conv_state", "b", "a", "dt_bias", "ssm_a", "z", "q",
                                                 "k", "v", "g", "beta", "qo", "slots", "parents")),
                            n_trees, n_trees, HK, HV, DK, DV, TAPS, scale, 1e-6, CHANNELS, HV * DV, HV, HV, rows,
                            stream, conv_stage=b["stage"].ptr)   # the commit's conv inputs, as the engine's

    io_bytes = T * (2 * CHANNELS + 2 * HV + 2 * HV * DK + HV * DV + 2 * HV) * 4 + CHANNELS * TAPS * 4
    return launch, io_bytes, T * CHANNELS * TAPS * 2


_TREE_CASES = [functools.partial(gdn_tree_prepare_case, n) for n in (1, 5)]
for _c in _TREE_CASES:
    _c.__name__ = f"gdn_tree_prepare_{_c.args[0]}x23x{HK}x{HV}x{DK}"
BENCH_CASES += _TREE_CASES
