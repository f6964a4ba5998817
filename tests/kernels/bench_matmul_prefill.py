"""Benchmark cases for the prompt-row GEMM (cuda/matmul_prefill.cu) at Qwen3.6-27B shapes
(bench_matmul.SHAPES: gate/up 5120 -> 17408, down 17408 -> 5120, qkv 5120 -> 10240, out
6144 -> 5120): every goal type at 4096 rows (the prefill chunk of docs/PERF.md), IQ4_XS also
at 512 and 1024, and the decode family on the same prompt rows (`_decode`: the path prompt rows
took before) for IQ4_XS and Q4_K, so one run gives before and after. `_f16` cases run the f16
tensor-core GEMM (cuda/matmul_prefill_f16.cu, LUCE_PREFILL_GEMM=f16) beside the int8 one at
the 27B shapes at 512 rows (one prefill chunk) and gate at 4096; its `pct_peak` is over the
same int8 figure (the dense f16 peak is half of it: 989 TFLOP/s).

A launch is x quantization (8-bit, per 32 values) + the GEMM; flops = 2 * rows * n * k.
`pct_peak` (tools/bench.py) is TFLOP/s over INT8_PEAK_OPS, NVIDIA's dense int8 tensor-core
figure for the H200 SXM (not measured here). Expected (counted in the kernel's header): the
f32 combine, about 15-19 issue slots per m16n8k32, bounds it near 20-25% of that peak.
"""
from __future__ import annotations

import functools
import os

import numpy as np

from tests.kernels.bench_matmul import GOAL_TYPES, SHAPES, random_bytes

INT8_PEAK_OPS = 1979e12


def prefill_case(qtype_name: str, shape: str, rows: int, decode: bool = False, gemm: str = "int8", tune: int = 0):
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
            return
        before = os.environ.get("LUCE_PREFILL_GEMM")
        os.environ["LUCE_PREFILL_GEMM"] = gemm  # read by luce_matmul_prefill at each call
        try:
            km.matmul_prefill(x.ptr, w.ptr, 0, y.ptr, ws.ptr, ws_bytes, rows, n, k, qtype, 0, stream, tune)
        finally:
            if before is None:
                del os.environ["LUCE_PREFILL_GEMM"]
            else:
                os.environ["LUCE_PREFILL_GEMM"] = before

    launch()
    return launch, n * km.row_bytes(qtype, k) + rows * (k + n) * 4, 2 * rows * n * k


def _case(qtype_name, shape, rows, decode=False, gemm="int8", tune=0):
    c = functools.partial(prefill_case, qtype_name, shape, rows, decode, gemm, tune)
    c.__name__ = f"matmul_prefill_{qtype_name}_{shape}_t{rows}" + ("_decode" if decode else "") + \
        ("_f16" if gemm == "f16" else "") + (f"_tune{tune}" if tune else "")
    c.peak_ops_per_s = INT8_PEAK_OPS
    return c


BENCH_CASES = [_case(q, "gate", 4096) for q in GOAL_TYPES]
BENCH_CASES += [_case("IQ4_XS", s, 4096) for s in ("down", "qkv", "out")]
BENCH_CASES += [_case("IQ4_XS", "gate", r) for r in (512, 1024)]
BENCH_CASES += [_case(q, "gate", 4096, decode=True) for q in ("IQ4_XS", "Q4_K")]
BENCH_CASES += [_case("IQ4_XS", "down", 4096, decode=True)]
# the f16 GEMM beside the int8 one: 27B shapes at one 512-row chunk, gate at 4096 rows
BENCH_CASES += [_case("IQ4_XS", s, 512) for s in ("down", "qkv", "out")]
BENCH_CASES += [_case("IQ4_XS", s, 512, gemm="f16") for s in ("gate", "down", "qkv", "out")]
BENCH_CASES += [_case(q, "gate", 512, gemm="f16") for q in GOAL_TYPES if q != "IQ4_XS"]
BENCH_CASES += [_case("IQ4_XS", "gate", 4096, gemm="f16")]
# launch shapes of the f16 GEMM (tune 8: 256 x 64 tiles, the default on an H200; 16: 128 x 128;
# 4: 128 x 32, two blocks an SM)
BENCH_CASES += [_case("IQ4_XS", s, 512, gemm="f16", tune=t) for t in (16, 4) for s in ("gate", "down")]
BENCH_CASES += [_case("IQ4_XS", "gate", 4096, gemm="f16", tune=16)]
# sm_90a warpgroup MMAs (H100/H200 only): tune 32 128 x 128 tiles, 64 256 x 128
BENCH_CASES += [_case("IQ4_XS", s, r, gemm="f16", tune=t) for t in (32, 64) for s in ("gate", "down", "qkv", "out")
                for r in (512, 4096)]
BENCH_CASES += [_case(q, "gate", 512, gemm="f16", tune=t) for t in (16, 32, 64) for q in GOAL_TYPES if q != "IQ4_XS"]
# A DFlash pass of 3-5 lanes (48-80 block rows) takes this GEMM: its launch shapes at those rows on
# the draft's Q8_0 matrices (bench_matmul.DRAFT_SHAPES, its gate|up and down) and the LM head;
# tunes 48 / 80: the warpgroup MMAs on 48- / 80-token tiles.
BENCH_CASES += [_case("Q8_0", s, r, gemm="f16", tune=t) for s in ("dq", "dk", "dout", "down", "gateup")
                for r in (48, 80) for t in (0, 2, 4, 8, 16, 32, 64, r)]
BENCH_CASES += [_case("Q6_K", "lmhead", r, gemm="f16", tune=t) for r in (48, 80) for t in (0, 4, 32, 64, r)]
# tune 81: the same 80-token tiles with k split over a cluster (Z by the matrix; the draft's own weights)
BENCH_CASES += [_case("Q8_0", s, r, gemm="f16", tune=81) for s in ("dq", "dk", "dout", "down", "gateup") for r in (16, 48, 80)]
BENCH_CASES += [_case("Q6_K", "lmhead", 80, gemm="f16", tune=81)]
# ... and on the int8 GEMM (measured as a route for the draft's own weights, session 41; 80 rows: the
# second 64-token tile's 2 live 8-token sub-tiles) beside the exact decode family it replaces.
BENCH_CASES += [_case("Q8_0", s, r, tune=t) for s in ("dq", "dk", "dout", "down") for r in (48, 80) for t in (0, 4, 8)]
BENCH_CASES += [_case("Q8_0", s, r, decode=True) for s in ("dq", "dk", "dout", "down") for r in (48, 80)]


if __name__ == "__main__":
    import sys

    from tests.kernels.bench_attention import run_cases

    for r in run_cases(BENCH_CASES, sys.argv[1] if len(sys.argv) > 1 else None):
        if "us" in r:
            print(f"{r['case']:44s} {r['TFLOP/s']:7.1f} TFLOP/s {100 * r['TFLOP/s'] * 1e12 / INT8_PEAK_OPS:5.1f}% of int8 peak")
