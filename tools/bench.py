#!/usr/bin/env python3
"""Kernel benchmarks (`make bench`): every BENCH_CASES entry of tests/kernels/bench_*.py at
Qwen3.6-27B shapes, timed as CUDA-graph replays, against ceilings measured in the same run.

A case is a callable returning (launch_fn, bytes_moved, flops); launch_fn(stream: int)
launches once on `stream` (no sync, no allocation). For each case the launch is captured
`per_graph` times into one graph (sized to ~2 ms of work), the graph is replayed `repeats`
times between events, and the median replay time / per_graph is the launch time.
Ceilings, measured first: device copy bandwidth, the larger of a 1 GiB device-to-device
cudaMemcpyAsync replayed in a graph (a memcpy node: the copy engines, ~2.8 TB/s on an H200)
and a plain copy kernel over the same bytes (luce_gather), counting bytes read + written;
and, when CuPy is importable, the f32 (CUDA core) and f16 (tensor core) GEMM rates of
cuBLAS at 8192^3. A case's roofline time is
max(bytes / copy bandwidth, flops / f32 GEMM rate); "% roof" is that over the measured time.
Small working sets stay in the 50 MB L2 between replays, so they can beat the copy rate.

    python3 tools/bench.py [--filter SUBSTR] [--json] [--json-out FILE] [--repeats N] [--no-gemm]
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import json
import math
import os
import statistics
import subprocess
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TARGET_GRAPH_S = 2e-3
MAX_PER_GRAPH = 200
COPY_BYTES = 1 << 30


def rt():
    from cuda.bindings import runtime as cudart

    return cudart


def check(result, what: str):
    from luce.ops.gpu_runtime import check as _check

    return _check(result, what)


class GraphTimer:
    """Captures a launch function into a CUDA graph and times its replays with events."""

    def __init__(self):
        self.stream = check(rt().cudaStreamCreate(), "cudaStreamCreate")
        self.start = check(rt().cudaEventCreate(), "cudaEventCreate")
        self.end = check(rt().cudaEventCreate(), "cudaEventCreate")

    def _elapsed(self, fn) -> float:
        """Seconds `fn()` takes on the stream (between two events)."""
        r = rt()
        check(r.cudaEventRecord(self.start, self.stream), "cudaEventRecord")
        fn()
        check(r.cudaEventRecord(self.end, self.stream), "cudaEventRecord")
        check(r.cudaEventSynchronize(self.end), "cudaEventSynchronize")
        return check(r.cudaEventElapsedTime(self.start, self.end), "cudaEventElapsedTime") * 1e-3

    def time(self, launch, repeats: int) -> tuple[float, int]:
        """(median seconds per launch, launches per graph)."""
        r = rt()
        s = int(self.stream)
        launch(s)  # warm-up; launch errors surface here
        check(r.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
        eager = min(self._elapsed(lambda: launch(s)) for _ in range(3))
        per_graph = max(1, min(MAX_PER_GRAPH, math.ceil(TARGET_GRAPH_S / max(eager, 1e-7))))
        mode = r.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        check(r.cudaStreamBeginCapture(self.stream, mode), "cudaStreamBeginCapture")
        try:
            for _ in range(per_graph):
                launch(s)
        finally:
            graph = check(r.cudaStreamEndCapture(self.stream), "cudaStreamEndCapture")
        exe = check(r.cudaGraphInstantiate(graph, 0), "cudaGraphInstantiate")
        try:
            replay = lambda: check(r.cudaGraphLaunch(exe, self.stream), "cudaGraphLaunch")  # noqa: E731
            self._elapsed(replay)
            times = [self._elapsed(replay) for _ in range(repeats)]
        finally:
            r.cudaGraphExecDestroy(exe)
            r.cudaGraphDestroy(graph)
        return statistics.median(times) / per_graph, per_graph


def measure_copy_bandwidth(timer: GraphTimer, repeats: int) -> tuple[float, float]:
    """Device copy bandwidth in bytes/s (read + write) of 1 GiB: (cudaMemcpyAsync D2D, which
    a graph runs as a memcpy node, and luce_gather as a plain 16-byte-per-thread copy kernel
    over 1024 rows of 1 MiB)."""
    from luce import _cuda_gather as kg
    from luce.ops.cuda_memory import DeviceBuffer

    r = rt()
    src, dst = DeviceBuffer(COPY_BYTES), DeviceBuffer(COPY_BYTES)
    check(r.cudaMemset(src.ptr, 1, COPY_BYTES), "cudaMemset")
    kind = r.cudaMemcpyKind.cudaMemcpyDeviceToDevice

    def memcpy(stream):
        check(r.cudaMemcpyAsync(dst.ptr, src.ptr, COPY_BYTES, kind, stream), "cudaMemcpyAsync")

    def kernel(stream, rows=1024):
        kg.gather(src.ptr, dst.ptr, 0, 0, rows, COPY_BYTES // rows, COPY_BYTES // rows,
                  COPY_BYTES // rows, stream)

    memcpy_s, _ = timer.time(memcpy, repeats)
    kernel_s, _ = timer.time(kernel, repeats)
    src.free()
    dst.free()
    return 2 * COPY_BYTES / memcpy_s, 2 * COPY_BYTES / kernel_s


def measure_gemm(dtype_name: str, n: int = 8192, repeats: int = 5) -> float | None:
    """cuBLAS GEMM rate (FLOP/s) through CuPy on random data, or None without CuPy."""
    try:
        import cupy as cp
    except Exception:
        return None
    dtype = getattr(cp, dtype_name)
    cp.random.seed(0)
    a = cp.random.standard_normal((n, n), dtype=cp.float32).astype(dtype)
    b = cp.random.standard_normal((n, n), dtype=cp.float32).astype(dtype)
    out = cp.matmul(a, b)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(repeats):
        start.record()
        cp.matmul(a, b, out=out)
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) * 1e-3)
    return 2.0 * n ** 3 / statistics.median(times)


def discover(filter_text: str | None) -> list[tuple[str, object]]:
    """[(name, case)] from every tests/kernels/bench_*.py, in file order; filter_text: substrings
    separated by commas, a case is kept when its name or module contains any of them (one
    ending in '$' must end the name)."""
    wanted = filter_text.split(",") if filter_text else None
    cases = []
    for path in sorted((ROOT / "tests" / "kernels").glob("bench_*.py")):
        module = importlib.import_module(f"tests.kernels.{path.stem}")
        for case in getattr(module, "BENCH_CASES", []):
            name = getattr(case, "__name__", None) or repr(case)
            if wanted is None or any(name.endswith(w[:-1]) if w.endswith("$") else (w in name or w in path.stem)
                                     for w in wanted):
                cases.append((name, case))
    return cases


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        if out.returncode == 0:
            return out.stdout.strip() + ("+dirty" if dirty else "")
    except Exception:
        pass
    return os.environ.get("LUCE_BENCH_COMMIT", "unknown")  # a copied tree without .git


def device_name() -> str:
    props = check(rt().cudaGetDeviceProperties(0), "cudaGetDeviceProperties")
    name = props.name
    return (name.decode() if isinstance(name, bytes) else str(name)).rstrip("\x00")


def run_case(timer: GraphTimer, name: str, case, repeats: int, bw: float, f32: float | None) -> dict:
    launch, bytes_moved, flops = case()
    seconds, per_graph = timer.time(launch, repeats)
    floor = max(bytes_moved / bw, (flops / f32) if (f32 and flops) else 0.0)
    peak = getattr(case, "peak_ops_per_s", None)  # a case's own compute peak (int8 tensor cores)
    extra = {"pct_peak": 100.0 * flops / seconds / peak} if peak else {}
    return {**extra, "name": name, "time_us": seconds * 1e6, "per_graph": per_graph,
            "bytes": int(bytes_moved), "flops": int(flops),
            "GBps": bytes_moved / seconds / 1e9, "TFLOPs": flops / seconds / 1e12,
            "pct_bw": 100.0 * bytes_moved / bw / seconds,
            "pct_roofline": 100.0 * floor / seconds,
            "bound": "compute" if f32 and flops / f32 > bytes_moved / bw else "memory"}


def format_row(r: dict) -> str:
    if "error" in r:
        return f"{r['name']:<44} ERROR {r['error']}"
    return (f"{r['name']:<44} {r['time_us']:>10.2f} {r['bytes'] / 1e6:>10.3f} {r['GBps']:>9.1f} "
            f"{r['TFLOPs']:>8.3f} {r['pct_bw']:>7.1f} {r['pct_roofline']:>7.1f}  {r['bound']}" +
            (f"  {r['pct_peak']:.1f}% of int8 peak" if "pct_peak" in r else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--filter", help="only cases whose name or module contains this (or one of a,b,c; x$: names ending in x)")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    ap.add_argument("--json-out", help="also write the JSON document to this file")
    ap.add_argument("--repeats", type=int, default=25, help="timed graph replays per case (median)")
    ap.add_argument("--no-gemm", action="store_true", help="skip the CuPy GEMM ceilings")
    args = ap.parse_args(argv)

    from luce.ops.native import load_kernels

    load_kernels()
    timer = GraphTimer()
    bw_memcpy, bw_kernel = measure_copy_bandwidth(timer, args.repeats)
    bw = max(bw_memcpy, bw_kernel)
    f32 = None if args.no_gemm else measure_gemm("float32")
    f16 = None if args.no_gemm else measure_gemm("float16")
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "commit": git_commit(), "device": device_name(),
              "ceilings": {"copy_GBps": bw / 1e9, "memcpy_GBps": bw_memcpy / 1e9,
                           "copy_kernel_GBps": bw_kernel / 1e9, "f32_gemm_TFLOPs": f32 and f32 / 1e12,
                           "f16_gemm_TFLOPs": f16 and f16 / 1e12},
              "cases": []}
    if not args.json:
        c = report["ceilings"]
        gemm = (f"f32 GEMM {c['f32_gemm_TFLOPs']:.1f} TFLOP/s, f16 GEMM {c['f16_gemm_TFLOPs']:.1f} TFLOP/s"
                if f32 and f16 else "GEMM ceilings: CuPy missing or skipped (bandwidth roof only)")
        print(f"{report['device']}  commit {report['commit']}  {report['date']}")
        print(f"ceilings: copy {c['copy_GBps']:.0f} GB/s (1 GiB read+write; memcpy node "
              f"{c['memcpy_GBps']:.0f}, copy kernel {c['copy_kernel_GBps']:.0f}); {gemm}")
        print(f"{'case':<44} {'time_us':>10} {'MB':>10} {'GB/s':>9} {'TFLOP/s':>8} {'%bw':>7} "
              f"{'%roof':>7}  bound")
    failed = 0
    for name, case in discover(args.filter):
        try:
            row = run_case(timer, name, case, args.repeats, bw, f32)
        except Exception as exc:  # report and carry on with the other cases
            failed += 1
            row = {"name": name, "error": f"{type(exc).__name__}: {exc}"}
            if not args.json:
                traceback.print_exc()
        report["cases"].append(row)
        if not args.json:
            print(format_row(row), flush=True)
    if args.json:
        print(json.dumps(report, indent=1))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
