"""Benchmark cases for the prompt-row GEMM (cuda/matmul_prefill.cu) at Qwen3.6-27B shapes
(bench_matmul.SHAPES: gate/up 5120 -> 17408, down 17408 -> 5120, qkv 5120 -> 10240, out
6144 -> 5120): every goal type at 4096 rows (the prefill chunk of docs/PERF.md), IQ4_XS also
at 512 and 1024, and the decode family on the same prompt rows (`_decode`: the path prompt rows
took before) for IQ4_XS and Q4_K, so one run gives before and after.

A launch is x quantization (8-bit, per 32 values) + the GEMM; flops = 2 * rows * n * k.
`pct_peak` (tools/bench.py) is TFLOP/s over INT8_PEAK_OPS, NVIDIA's dense int8 tensor-core
figure for the H200 SXM (not measured here). Expected (counted in the kernel's header): the
f32 combine, about 15-19 issue slots per m16n8k32, bounds it near 20-25% of that peak.
"""
from __future__ import annotations

import functools

import numpy as np

from tests.kernels.bench_matmul import GOAL_TYPES, SHAPES, random_bytes

INT8_PEAK_OPS = 1979e12


def prefill_case(qtype_name: str, shape: str, rows: int, decode: bool = False):
    from luce import _cuda_matmul as km
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels

    load_kernels()
    n, k = SHAPES[shape]
    qtype = km.QTYPES[qtype_name]
    w = random_bytes(n * km.row_bytes(qtype, k), 0)  # fits in L2 or not: prefill reads it once per 64 rows
    x = DeviceBuffer.from_numpy(np.random.default_rng(1).standard_normal((rows, k)).astype(np.float32))
    y = DeviceBuffer(rows * n * 4)
    ws_bytes = (km.workspace_bytes if decode else km.prefill_workspace_bytes)(rows, k)
    ws = DeviceBuffer(max(ws_bytes, 16))

    def launch(stream: int = 0, _keep=(w, x, y, ws)):
        if decode:
            km.matmul(x.ptr, w.ptr, 0, y.ptr, ws.ptr, ws_bytes, rows, n, k, qtype, km.PATH_PREFILL, 0, 0, stream)
        else:
            km.matmul_prefill(x.ptr, w.ptr, 0, y.ptr, ws.ptr, ws_bytes, rows, n, k, qtype, 0, stream)

    launch()
    return launch, n * km.row_bytes(qtype, k) + rows * (k + n) * 4, 2 * rows * n * k


def _case(qtype_name, shape, rows, decode=False):
    c = functools.partial(prefill_case, qtype_name, shape, rows, decode)
    c.__name__ = f"matmul_prefill_{qtype_name}_{shape}_t{rows}" + ("_decode" if decode else "")
    c.peak_ops_per_s = INT8_PEAK_OPS
    return c


BENCH_CASES = [_case(q, "gate", 4096) for q in GOAL_TYPES]
BENCH_CASES += [_case("IQ4_XS", s, 4096) for s in ("down", "qkv", "out")]
BENCH_CASES += [_case("IQ4_XS", "gate", r) for r in (512, 1024)]
BENCH_CASES += [_case(q, "gate", 4096, decode=True) for q in ("IQ4_XS", "Q4_K")]
BENCH_CASES += [_case("IQ4_XS", "down", 4096, decode=True)]


if __name__ == "__main__":
    import sys

    from tests.kernels.bench_attention import run_cases

    for r in run_cases(BENCH_CASES, sys.argv[1] if len(sys.argv) > 1 else None):
        if "us" in r:
            print(f"{r['case']:44s} {r['TFLOP/s']:7.1f} TFLOP/s {100 * r['TFLOP/s'] * 1e12 / INT8_PEAK_OPS:5.1f}% of int8 peak")
