"""Benchmark cases for the quantized matmul (cuda/matmul.cu) at Qwen3.6-27B shapes:
FFN gate/up 5120 -> 17408, down 17408 -> 5120, GDN qkv 5120 -> 10240, attention/GDN out
6144 -> 5120, LM head 5120 -> 248320. Every goal type at 1, 16 and 32 rows, each also with
tune 3 (`_tune3`: one block per row tile, no overlap with the kernel ahead: the launch before
the one-wave ring grid), so one run gives before and after, and at 1 row with tune 1 (the ring
with 5 blocks per SM). One-row cases of the dp4a kernel (tune 5 / 6) against the tile kernel
(tune 4), also at Qwen2.5-Coder-1.5B and Qwen2.5-0.5B shapes (Q5_0 / Q8_0 at k = 896). IQ4_XS one
row: the staged form (tune 0, 6, 8) against the register form (tune 7), also at the merged gate|up.
IQ4_XS at 2, 4, 5 and 8 rows: the few-row kernel (tune 9; tune 0 takes it at k <= 6144, down its
large-k form) against the tile kernel (tune 4), at the 27B shapes and the merged gate|up;
Q5_K qkv, Q4_K gate / qkv / out and Q6_K qkv at 5 rows likewise, Q4_K and Q6_K down at 2, 5 and 8.

BENCH_CASES: callables that allocate and fill device buffers and return
(launch_fn, bytes_moved, flops); launch_fn(stream: int = 0) launches once (x quantization +
matmul, or the matmul alone for the `_reusex` cases). Weights are random bytes (random f16
scales included: the kernel's speed does not depend on values); matrices smaller than 4x the
60 MB L2 rotate over several copies, one per launch, so each launch reads its weights from
DRAM. bytes_moved is the floor: weights + x + y once. `python -m tests.kernels.bench_matmul
[out.json]` runs them with the graph-replay timer of bench_attention and prints the row-count
ratios the decode goal is stated in (16 and 32 rows vs 1 row).
"""
from __future__ import annotations

import functools
import sys

import numpy as np

SHAPES = {"gate": (17408, 5120), "down": (5120, 17408), "qkv": (10240, 5120), "out": (5120, 6144),
          "lmhead": (248320, 5120)}
BIG_SHAPES = list(SHAPES)   # the 27B decode step's matrices; the dicts below add other models' shapes
# Qwen2.5-Coder-1.5B: merged gate/up 1536 -> 2 x 8960, down, merged q/k/v 1536 -> 2048, v alone
# (Q6_K in half the layers of a Q4_K_M file), out, LM head; Qwen2.5-0.5B's down 4864 -> 896 (Q6_K
# in half its layers).
SMALL_SHAPES = {"c15gateup": (17920, 1536), "c15down": (1536, 8960), "c15qkv": (2048, 1536), "c15v": (256, 1536),
                "c15out": (1536, 1536), "c15lmhead": (151936, 1536), "q05down": (896, 4864)}
SHAPES.update(SMALL_SHAPES)
# Qwen2.5-0.5B-Instruct Q4_K_M decode (hidden 896: Q5_0 / Q8_0, k not whole 256-value chunks):
# q / out 896 -> 896, k / v 896 -> 128, gate / up 896 -> 4864 and merged 896 -> 2 x 4864.
QWEN05B_SHAPES = {"q05q": (896, 896), "q05kv": (128, 896), "q05gate": (4864, 896), "q05gateup": (9728, 896)}
SHAPES.update(QWEN05B_SHAPES)
# The 27B decode step's merged gate|up (2 x 17408 -> 34816 rows): IQ4_XS one-row cases only.
MERGED_SHAPES = {"gateup": (34816, 5120)}
SHAPES.update(MERGED_SHAPES)
# The 27B DFlash draft's layer matrices (hidden 5120, 32 / 8 heads x 128, FFN 17408; Q8_0): q, k (and
# v), out, down; its gate|up is the merged 34816-row shape. Prompt-GEMM cases at draft pass rows.
DRAFT_SHAPES = {"dq": (4096, 5120), "dk": (1024, 5120), "dout": (5120, 4096)}
SHAPES.update(DRAFT_SHAPES)
GOAL_TYPES = ("IQ4_XS", "Q4_K", "Q6_K", "Q8_0", "Q5_K", "Q5_0")
L2_BYTES = 60 << 20


def random_bytes(nbytes: int, seed: int):
    """A DeviceBuffer of nbytes random bytes (a random 64 MiB tile repeated)."""
    from tests.kernels.bench_attention import random_device_buffer

    return random_device_buffer((nbytes + 3) // 4, seed)


def matmul_case(qtype_name: str, shape: str, rows: int, path: int = 0, reuse_x: bool = False, tune: int = 0):
    from luce import _cuda_matmul as km
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels

    load_kernels()
    n, k = SHAPES[shape]
    qtype = km.QTYPES[qtype_name]
    row_bytes = km.row_bytes(qtype, k)
    w_bytes = n * row_bytes
    copies = max(1, min(8, -(-4 * L2_BYTES // w_bytes)))
    weights = [random_bytes(w_bytes, seed) for seed in range(copies)]
    x = DeviceBuffer.from_numpy(np.random.default_rng(1).standard_normal((rows, k)).astype(np.float32))
    y = DeviceBuffer(rows * n * 4)
    ws_bytes = km.workspace_bytes(rows, k)
    ws = DeviceBuffer(max(ws_bytes, 16))
    km.matmul(x.ptr, weights[0].ptr, 0, y.ptr, ws.ptr, ws_bytes, rows, n, k, qtype, path)
    flags = km.REUSE_X if reuse_x else 0
    turn = [0]

    def launch(stream: int = 0, _keep=(weights, x, y, ws)):
        w = weights[turn[0] % copies]
        turn[0] += 1
        km.matmul(x.ptr, w.ptr, 0, y.ptr, ws.ptr, ws_bytes, rows, n, k, qtype, path, flags, tune, stream)

    return launch, w_bytes + rows * (k + n) * 4, 2 * rows * n * k


def _case(qtype_name, shape, rows, path=0, reuse_x=False, tune=0):
    c = functools.partial(matmul_case, qtype_name, shape, rows, path, reuse_x, tune)
    c.__name__ = (f"matmul_{qtype_name}_{shape}_t{rows}" + ("_prefill" if path else "") +
                  ("_reusex" if reuse_x else "") + (f"_tune{tune}" if tune else ""))
    return c


BENCH_CASES = [c for q in GOAL_TYPES for s in BIG_SHAPES for c in (
    _case(q, s, 1), _case(q, s, 1, tune=1), _case(q, s, 16), _case(q, s, 32),  # tune 1: the ring
    _case(q, s, 1, tune=3), _case(q, s, 16, tune=3), _case(q, s, 32, tune=3))]
# tune 5 / 6: the one-row kernel (matmul_gemv.cuh; 6: twice the rows a batch) for every
# integer-scale type (tune 0 takes it where it measured faster), beside tune 0 at the Coder-1.5B shapes.
# Tune 8 for Q4_K, Q5_K, Q6_K: their staged form (matmul_gemv_staged_readers.cuh; tune 0 takes it for
# Q4_K / Q5_K / Q6_K where the register form does not run), tune 4 the tile kernel.
BENCH_CASES += [_case(q, s, 1, tune=t) for t in (5, 6) for q in ("IQ4_XS", "Q4_K", "Q6_K", "Q5_K")
                for s in BIG_SHAPES + list(SMALL_SHAPES)]
# Q8_0 and Q5_0 at one row: tune 0 takes the one-row kernel (4 rows a batch, as tune 5; faster than
# the tile kernel at every 27B shape: cuda/matmul_gemv_launch.cuh kGemvGroupScaleByDefault), tune 4 the
# tile kernel, tune 6 the one-row kernel with 8 rows a batch; at the Qwen2.5-0.5B shapes, the 27B and
# Coder-1.5B ones.
BENCH_CASES += [_case(q, s, 1, tune=t) for q, shapes in (("Q5_0", QWEN05B_SHAPES), ("Q8_0", ("q05kv", "q05q")))
                for s in shapes for t in (0, 4, 6)]
BENCH_CASES += [_case(q, s, 1, tune=4) for q in ("Q8_0", "Q5_0") for s in BIG_SHAPES + list(SMALL_SHAPES)]
# Q8_0 / Q5_0 at one row, the one-row kernel forced (tune 5) beside tune 0 and the tile kernel (tune 4): at the
# down projection (k = 17,408, two chunk slots a lane) the one-row kernel took 2.2x / 1.9x its gate's time for
# the same bytes until its chain ran four chunks' combines side by side (docs/PERF.md sessions 45-46).
BENCH_CASES += [_case(q, s, 1, tune=5) for q in ("Q8_0", "Q5_0") for s in ("gate", "down", "qkv", "out")]
BENCH_CASES += [_case(q, s, 1, tune=t) for t in (4, 8) for q in ("Q4_K", "Q5_K", "Q6_K")
                for s in ("gate", "down", "qkv", "out")]
BENCH_CASES += [_case("Q4_K", s, 1, tune=8) for s in SMALL_SHAPES if s not in ("c15v", "c15lmhead", "q05down")]
BENCH_CASES += [_case(q, s, 1) for q in GOAL_TYPES for s in SMALL_SHAPES]
# x from the workspace (REUSE_X): the matmul alone, as the decode step runs a one-row call whose producer
# quantizes x (add_rmsnorm_quant, swiglu_quant, gate_quant, the GDN chain's norm epilogue). The _t1 cases
# also launch quantize_x_kernel where the kernel does not quantize x in lane (k > 4,096: out, down).
BENCH_CASES += [_case(q, s, 1, reuse_x=True) for q in GOAL_TYPES for s in BIG_SHAPES]
BENCH_CASES += [_case("Q4_K", "gate", 8), _case("Q4_K", "gate", 64), _case("Q4_K", "gate", 512, path=1),
                _case("F16", "gate", 1), _case("BF16", "gate", 1)]
BENCH_CASES += [_case(q, s, r, tune=2) for q in ("Q4_K", "Q6_K") for s in ("gate", "down") for r in (1, 32)]
# IQ4_XS one row, the staged form (matmul_gemv_staged.cuh; tune 0 and 5: 4 rows a batch, 6: 8 rows,
# 8: the three-prmt table lookup) against its register form (tune 7, the kernel before), at the 27B
# shapes and the merged gate|up: one run gives before and after.
BENCH_CASES += [_case("IQ4_XS", s, 1, tune=t) for s in BIG_SHAPES + list(MERGED_SHAPES) for t in (7, 8)]
BENCH_CASES += [_case("IQ4_XS", s, 1, tune=t) for s in MERGED_SHAPES for t in (0, 6)]


def ratio_table(results: list[dict]) -> list[str]:
    """Per type and shape, after (tune 0) and before (tune 3): the 1-row time, % of copy
    bandwidth at 1, 16 and 32 rows, and 16 and 32 rows vs 1 row (goal <= 1.3x and <= 1.6x)."""
    by = {}
    for r in results:  # rows of run_cases ("case", "us", "pct_copy_bw") or tools/bench.py ("name", ...)
        if "us" in r or "time_us" in r:
            by[r.get("case") or r["name"]] = {"us": r.get("us") or r["time_us"],
                                              "pct_copy_bw": r.get("pct_copy_bw") or r["pct_bw"]}
    lines = []
    for q in GOAL_TYPES:
        for s in BIG_SHAPES:
            for tag, sfx in (("after", ""), ("before", "_tune3")):
                one = by.get(f"matmul_{q}_{s}_t1{sfx}")
                if not one:
                    continue
                r16, r32 = by.get(f"matmul_{q}_{s}_t16{sfx}"), by.get(f"matmul_{q}_{s}_t32{sfx}")
                pct = "/".join(f"{r['pct_copy_bw']:.0f}" if r else "-" for r in (one, r16, r32))
                lines.append(f"{q:7s} {s:7s} {tag:6s} 1 row {one['us']:8.1f} us  % copy 1/16/32 {pct:>10s}"
                             f"  16 rows x{(r16['us'] if r16 else 0) / one['us']:5.2f}"
                             f"  32 rows x{(r32['us'] if r32 else 0) / one['us']:5.2f}")
    return lines


def torch_copy_bandwidth(n_bytes: int = 2 << 30, reps: int = 20) -> float | None:
    """Device-to-device copy through torch (a copy kernel), bytes read + written per second;
    None without torch. The roofline METHOD.md names (the cudaMemcpy graph node of
    bench_attention.copy_bandwidth read lower on this machine)."""
    try:
        import torch
    except ImportError:
        return None
    src = torch.empty(n_bytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * n_bytes / sorted(times)[len(times) // 2]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--table"]:  # the table from a `tools/bench.py --json-out` file
        import json

        for line in ratio_table(json.load(open(sys.argv[2]))["cases"]):
            print(line)
        sys.exit(0)
    from tests.kernels.bench_attention import run_cases

    bw = torch_copy_bandwidth()
    if bw:
        print(f"torch copy bandwidth: {bw / 1e9:.0f} GB/s (read + write)")

    names = sys.argv[2:]
    cases = [c for c in BENCH_CASES if not names or any(n in c.__name__ for n in names)]
    results = run_cases(cases, sys.argv[1] if len(sys.argv) > 1 else None)
    if bw:
        for r in results:
            if "us" in r:
                print(f"{r['case']:40s} {r['us']:9.2f} us {r['GB/s']:7.0f} GB/s {100 * r['GB/s'] * 1e9 / bw:5.1f}% of torch copy")
    for line in ratio_table(results):
        print(line)
# IQ4_XS at 2..8 rows: the few-row kernel (matmul_gemv_rows.cuh; tune 9, tune 0 where it runs: k <=
# 6144; down, k = 17408: its large-k form, matmul_gemv_rows_k.cuh) against the tile kernel (tune 4),
# at the 27B shapes and the merged gate|up. tools/bench.py --filter (substrings; `$`: at the end):
# _tune9$,_t2_tune4$,_t4_tune4$,_t5_tune4$,_t8_tune4$ and the one-row baselines IQ4_XS_gate_t1$ etc.
BENCH_CASES += [_case("IQ4_XS", s, r, tune=t) for s in ("gate", "qkv", "out", "down") + tuple(MERGED_SHAPES)
                for r in (2, 4, 5, 8) for t in (4, 9)]
# The few-row kernel for the K-quants (matmul_gemv_rows.cuh) at 5 rows (concurrency 5) against the tile
# kernel: Q5_K qkv (the IQ4_XS mix's GDN attn_qkv), Q4_K gate / qkv / out and Q6_K qkv (the Q4_K_M-like
# mix; its Q6_K attn_qkv of about half the layers, rows staged back to back). tools/bench.py --filter
# _K_qkv_t5_tune,_K_gate_t5_tune,_K_out_t5_tune,_K_lmhead_t5_tune (tune 9: the few-row kernel, tune 4: the
# tile kernel; the 27B's Q6_K LM head at C5).
BENCH_CASES += [_case(q, s, 5, tune=t) for q, s in (("Q5_K", "qkv"), ("Q4_K", "gate"), ("Q4_K", "qkv"),
                                                   ("Q4_K", "out"), ("Q6_K", "qkv"), ("Q6_K", "lmhead"))
                for t in (4, 9)]
# The large-k form (matmul_gemv_rows_k.cuh) for the Q4_K_M mix's down projection (Q4_K, and Q6_K in about
# half the layers) at 2, 5 and 8 rows against the tile kernel (IQ4_XS's down cases are above), Q5_K at 5:
# tools/bench.py --filter _K_down_t2_tune,_K_down_t5_tune,_K_down_t8_tune (one row: _K_down_t1$).
BENCH_CASES += [_case(q, "down", r, tune=t) for q in ("Q4_K", "Q6_K") for r in (2, 5, 8) for t in (4, 9)]
BENCH_CASES += [_case("Q5_K", "down", 5, tune=t) for t in (4, 9)]
# Q8_0 at 2, 5 and 8 rows (a Q8_0 27B at C2..C5): the few-row kernel at gate / q|k|v (k = 5120), its large-k
# form at out (k = 6144: the few-row kernel's stages do not fit) and down (tune 9), against the tile kernel
# (tune 4): tools/bench.py --filter _Q8_0_gate_t5_tune,_Q8_0_out_t5_tune,... (one row: _Q8_0_gate_t1$).
BENCH_CASES += [_case("Q8_0", s, r, tune=t) for s in ("gate", "qkv", "out", "down") for r in (2, 5, 8) for t in (4, 9)]
# Q5_0 at 5 rows (the few-row kernel only at tune 9: kGemvRowsQ50 is off, it lost at 5 rows on an H200 in
# docs/PERF.md session 48), the 27B's k = 5120 / 6144 shapes and the Coder-0.5B's (hidden 896, down 4864):
# --filter _Q5_0_gate_t5_tune,...; at 2 and 3 rows the Coder-0.5B's real Q5_0 calls (its C2 step gained
# 1.8% with Q5_0 on the few-row kernel at every row count, its C5 step lost 7.4%): --filter _Q5_0_q05q_t2_tune,...
BENCH_CASES += [_case("Q5_0", s, 5, tune=t) for s in ("gate", "qkv", "out", "q05q", "q05gateup", "q05down")
                for t in (4, 9)]
BENCH_CASES += [_case("Q5_0", s, r, tune=t) for s in ("q05q", "q05gateup") for r in (2, 3) for t in (4, 9)]
# Verify and draft-block row counts (issue 17, deliverable 3: 16-64 rows; a DFlash pass at C5 is 80
# rows): the tile kernel's launch shapes at tune 0 (by row count), 1 (the ring) and 2 (two row tiles
# a block), at the 27B shapes, a Q8_0 matrix of the DFlash draft's size and the LM head.
VERIFY_ROWS = (16, 23, 64, 80)
BENCH_CASES += [_case(q, s, r, tune=t) for q, s in (("IQ4_XS", "gate"), ("IQ4_XS", "down"), ("IQ4_XS", "out"),
                                                   ("Q8_0", "qkv"), ("Q6_K", "lmhead"))
                for r in VERIFY_ROWS for t in (0, 1, 2) if (r, t) != (16, 0)]  # 16 rows at tune 0: above
# The wide-token tile kernel (cuda/matmul_rows.cuh, tune 12: 4 warps of one m-tile, x staged once a
# block; tune 0's choice at 8,192+ rows and 17+ tokens; 13 / 14: its cluster form, the k parts shared
# by 2 / 4 blocks; 15: the cluster size counted) at the same shapes and row counts, against tune 2
# above and tune 0: tools/bench.py --filter _tune12$,_tune13$,_tune14$,_tune15$,_tune2$.
BENCH_CASES += [_case(q, s, r, tune=t) for q, s in (("IQ4_XS", "gate"), ("IQ4_XS", "down"), ("IQ4_XS", "out"),
                                                   ("Q8_0", "qkv"), ("Q6_K", "lmhead"))
                for r in VERIFY_ROWS for t in (12, 13, 14, 15)]
# The same forms on the Q4_K_M-like mix's Q4_K / Q6_K down and gate (a verify tree of 23 and 64 rows).
BENCH_CASES += [_case(q, s, r, tune=t) for q, s in (("Q4_K", "gate"), ("Q4_K", "down"), ("Q6_K", "down"))
                for r in (23, 64) for t in (0, 12, 13, 14, 15) if (q, s, r, t) != ("Q4_K", "gate", 64, 0)]  # above
# The DFlash draft's Q8_0 layer matrices at a C2 / C5 pass's 48 / 80 rows in the decode family: the
# wide-token kernel (tune 12) and its cluster forms (13 / 14 / 15), against the f16 prompt GEMM those passes
# take today (bench_matmul_prefill.py, `matmul_prefill_Q8_0_<shape>_t<rows>_f16`):
# tools/bench.py --filter '_Q8_0_dq_t80_tune,_Q8_0_dk_t80_tune,_Q8_0_dout_t80_tune,_Q8_0_down_t80_tune,_Q8_0_gateup_t80_tune'.
BENCH_CASES += [_case("Q8_0", s, r, tune=t) for s in ("dq", "dk", "dout", "down", "gateup") for r in (48, 80)
                for t in (12, 13, 14, 15)]


def pair_case(together: bool):
    """The Coder-1.5B's q|k (Q4_K, 1792 x 1536) and v (Q6_K, 256 x 1536) of a use_more_bits layer at
    one decode row, x already quantized (REUSE_X): luce_matmul_pair's one launch (`together`), or
    luce_matmul twice (LUCE_MATMUL_PAIR's A/B)."""
    from luce import _cuda_matmul as km
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels

    load_kernels()
    k, parts = 1536, ((km.QTYPES["Q4_K"], 1792), (km.QTYPES["Q6_K"], 256))
    w_bytes = [n * km.row_bytes(q, k) for q, n in parts]
    weights = [random_bytes(b, seed) for seed, b in enumerate(w_bytes)]
    x = DeviceBuffer.from_numpy(np.random.default_rng(1).standard_normal((1, k)).astype(np.float32))
    ys = [DeviceBuffer(n * 4) for _, n in parts]
    ws_bytes = km.workspace_bytes(1, k)
    ws = DeviceBuffer(max(ws_bytes, 16))
    km.matmul(x.ptr, weights[0].ptr, 0, ys[0].ptr, ws.ptr, ws_bytes, 1, parts[0][1], k, parts[0][0])
    (qa, na), (qb, nb) = parts

    def launch(stream: int = 0, _keep=(weights, x, ys, ws)):
        if together:
            km.matmul_pair(x.ptr, weights[0].ptr, 0, ys[0].ptr, na, qa, weights[1].ptr, 0, ys[1].ptr, nb, qb, ws.ptr,
                           ws_bytes, 1, k, km.REUSE_X, stream)
            return
        for w, y, (q, n) in zip(weights, ys, parts):
            km.matmul(x.ptr, w.ptr, 0, y.ptr, ws.ptr, ws_bytes, 1, n, k, q, km.PATH_DECODE, km.REUSE_X, 0, stream)

    return launch, sum(w_bytes) + (k + 2048) * 4, 2 * 2048 * k


for _together in (True, False):
    _c = functools.partial(pair_case, _together)
    _c.__name__ = "matmul_pair_c15qk_v_" + ("pair" if _together else "two")
    BENCH_CASES.append(_c)
# Small-n, deep-k matrices at verify / draft-pass rows, tune 0 (the tile kernel below 2^24 weights)
# against 15 (the wide-token kernel's cluster form): the 27B's attention k / v (1024 x 5120; IQ4_XS,
# Q5_K) and its draft's (Q8_0), the Coders' down and q|k|v; cuda/matmul.cu kRowsClusterMinWeights.
_names = {c.__name__ for c in BENCH_CASES}
BENCH_CASES += [c for q, s in (("Q8_0", "dk"), ("IQ4_XS", "dk"), ("Q5_K", "dk"), ("Q4_K", "c15down"),
                               ("Q6_K", "c15down"), ("Q4_K", "c15qkv"), ("Q5_0", "q05down"), ("Q8_0", "q05down"))
                for r in (23, 32, 64, 80) for t in (0, 15)
                for c in [_case(q, s, r, tune=t)] if c.__name__ not in _names]
