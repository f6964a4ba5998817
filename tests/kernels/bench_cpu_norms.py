"""Benchmark cases for the cpu backend's row norms, rotary and pointwise maths
(luce/cpu/norms.c, rotary.c, pointwise.c) at Qwen2.5-Coder-1.5B shapes (hidden 1536, 12 / 2
heads of 128, ffn 8960) and Qwen3.6-27B GDN shapes (gated RMSNorm over 48 value heads of 128).

CPU_BENCH_CASES: callables returning (run_fn, bytes_moved, flops); run_fn() runs the backend
op once, synchronously (Python included). bytes_moved: inputs read once, outputs written once."""
from __future__ import annotations

import functools

import numpy as np


def _backend():
    from luce.ops.cpu_backend import CpuBackend

    return CpuBackend()


def rmsnorm_case(rows: int, cols: int):
    b, rng = _backend(), np.random.default_rng(0)
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    w = rng.standard_normal(cols, dtype=np.float32)
    return (lambda: b.rmsnorm(x, w, 1e-6)), 2 * x.nbytes + w.nbytes, 4 * x.size


def gated_rmsnorm_case(rows: int, heads: int, d: int):
    b, rng = _backend(), np.random.default_rng(1)
    x = rng.standard_normal((rows, heads, d), dtype=np.float32)
    z = rng.standard_normal((rows, heads, d), dtype=np.float32)
    w = rng.standard_normal(d, dtype=np.float32)
    return (lambda: b.gated_rmsnorm(x, z, w, 1e-6)), 3 * x.nbytes + w.nbytes, 10 * x.size


def l2norm_case(rows: int, heads: int, d: int):
    b, rng = _backend(), np.random.default_rng(2)
    x = rng.standard_normal((rows, heads, d), dtype=np.float32)
    return (lambda: b.l2norm(x, 1e-6)), 2 * x.nbytes, 3 * x.size


def rope_case(rows: int, heads: int, d: int, rope_dim: int, sections=()):
    b, rng = _backend(), np.random.default_rng(3)
    x = rng.standard_normal((rows, heads, d), dtype=np.float32)
    pos = np.arange(1000, 1000 + rows)
    return (lambda: b.rope(x, pos, rope_dim, 1e6, sections)), 2 * x.nbytes + pos.nbytes, 6 * rows * heads * rope_dim // 2


def swiglu_case(rows: int, ffn: int):
    b, rng = _backend(), np.random.default_rng(4)
    g = rng.standard_normal((rows, ffn), dtype=np.float32)
    u = rng.standard_normal((rows, ffn), dtype=np.float32)
    return (lambda: b.swiglu(g, u)), 3 * g.nbytes, 25 * g.size


def unary_case(op: str, rows: int, cols: int):
    b, rng = _backend(), np.random.default_rng(5)
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    fn = getattr(b, op)
    return (lambda: fn(x)), 2 * x.nbytes, 25 * x.size


def _case(name, fn, *args):
    case = functools.partial(fn, *args)
    case.__name__ = name
    return case


CPU_BENCH_CASES = [
    _case("cpu_rmsnorm_1x1536", rmsnorm_case, 1, 1536),
    _case("cpu_rmsnorm_64x1536", rmsnorm_case, 64, 1536),
    _case("cpu_rmsnorm_512x1536", rmsnorm_case, 512, 1536),
    _case("cpu_rmsnorm_1x5120", rmsnorm_case, 1, 5120),
    _case("cpu_gated_rmsnorm_1x48x128", gated_rmsnorm_case, 1, 48, 128),
    _case("cpu_gated_rmsnorm_512x48x128", gated_rmsnorm_case, 512, 48, 128),
    _case("cpu_l2norm_1x16x128", l2norm_case, 1, 16, 128),
    _case("cpu_l2norm_512x16x128", l2norm_case, 512, 16, 128),
    _case("cpu_rope_1x12x128", rope_case, 1, 12, 128, 128),
    _case("cpu_rope_512x12x128", rope_case, 512, 12, 128, 128),
    _case("cpu_rope_27b_1x24x256_mrope", rope_case, 1, 24, 256, 64, (11, 11, 10, 0)),
    _case("cpu_swiglu_1x8960", swiglu_case, 1, 8960),
    _case("cpu_swiglu_512x8960", swiglu_case, 512, 8960),
    _case("cpu_sigmoid_1x48", unary_case, "sigmoid", 1, 48),
    _case("cpu_sigmoid_1x6144", unary_case, "sigmoid", 1, 6144),
    _case("cpu_softplus_512x48", unary_case, "softplus", 512, 48),
]
