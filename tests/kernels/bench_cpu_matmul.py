"""Benchmark cases of the cpu backend's quantized matmul (luce/cpu/matmul.c) at the shapes of
the default pair: Qwen2.5-Coder-1.5B (hidden 1536, FFN 8960, 2 KV heads x 128, vocab 151,936;
Q4_K and Q6_K) and 0.5B (hidden 896, FFN 4864; Q5_0 and Q8_0), at 1 row (decode), 9 (a
depth-8 chain verify), 23 (a DDTree verify) and 128 (a prompt chunk). CPU_BENCH_CASES entries
return (run_fn, bytes_moved, flops) for tools/bench_cpu.py; run_fn() runs once, synchronously.
The `_packed` cases multiply the weight's packed copy (luce/cpu/packed.h) as a model step does
on the AVX-512 and AVX2 paths; the others its row-major bytes.
Each case cycles through enough copies of its weight to exceed the last-level cache, so the
weights stream from memory as in a model step."""
from __future__ import annotations

import functools

import numpy as np

LLC_BYTES = 64 << 20   # copies of a weight until their total exceeds this


def matmul_case(qtype_name: str, n: int, k: int, rows: int, packed: bool = False):
    from gguf import GGMLQuantizationType as Q

    from luce import _cpu
    from luce.gguf import quants
    from luce.ops.cpu_backend import CpuWeight

    qtype = getattr(Q, qtype_name)
    rng = np.random.default_rng(0)
    raw = np.ascontiguousarray(quants.quantize((rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32), qtype))
    raw = raw.reshape(n, -1)
    copies = max(1, -(-LLC_BYTES // raw.nbytes))
    weights = [CpuWeight(raw.copy(), int(qtype), n, k, raw.shape[1]) for _ in range(copies)]
    if packed:
        weights = [CpuWeight(w.raw, w.qtype, n, k, w.row_bytes, _cpu.pack(w)) for w in weights]
    w_bytes = weights[0].packed.nbytes if packed else raw.nbytes
    x = rng.standard_normal((rows, k)).astype(np.float32)
    y = np.empty((rows, n), np.float32)
    turn = [0]

    def run():
        w = weights[turn[0] % copies]
        turn[0] += 1
        _cpu.matmuls(x, [w], [None], [y])
    return run, w_bytes + x.nbytes + y.nbytes, 2 * rows * n * k


def _case(name, *args):
    case = functools.partial(matmul_case, *args)
    case.__name__ = name
    return case


SHAPES = [
    ("1.5b_gate_q4k", "Q4_K", 8960, 1536),
    ("1.5b_down_q6k", "Q6_K", 1536, 8960),
    ("1.5b_qo_q4k", "Q4_K", 1536, 1536),
    ("1.5b_lm_head_q6k", "Q6_K", 151936, 1536),
    ("0.5b_gate_q5_0", "Q5_0", 4864, 896),
    ("0.5b_down_q8_0", "Q8_0", 896, 4864),
]
CPU_BENCH_CASES = [_case(f"matmul_{name}_T{rows}{'_packed' if packed else ''}", q, n, k, rows, packed)
                   for packed in (False, True) for name, q, n, k in SHAPES
                   for rows in ((1, 9, 23, 128) if "lm_head" not in name else (1, 9))]
