"""Benchmark cases for RMSNorm (cuda/rmsnorm.cu) at Qwen3.6-27B shapes: hidden 5120 for the
layer norms, head_dim 256 for the q/k norms.
BENCH_CASES entries return (launch_fn, bytes_moved, flops) for tools/bench.py; bytes_moved
counts each input read once and each output written once."""
from __future__ import annotations

import functools

HIDDEN, HQ, HEAD_DIM = 5120, 24, 256


def rmsnorm_case(rows: int, cols: int):
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.bench_attention import random_device_buffer

    k = load_kernels()
    x = random_device_buffer(rows * cols, 1)
    w = random_device_buffer(cols, 3)
    out = DeviceBuffer(rows * cols * 4)

    def launch(stream: int = 0, _keep=(x, w, out)):
        k.rmsnorm(x.ptr, w.ptr, out.ptr, rows, cols, 1e-6, stream)
    return launch, rows * cols * 8 + cols * 4, rows * cols * 3


def _case(name, *args):
    case = functools.partial(rmsnorm_case, *args)
    case.__name__ = name
    return case


BENCH_CASES = [
    _case("rmsnorm_hidden_1", 1, HIDDEN),
    _case("rmsnorm_hidden_64", 64, HIDDEN),
    _case("rmsnorm_hidden_4096", 4096, HIDDEN),
    _case("rmsnorm_qnorm_64x24x256", 64 * HQ, HEAD_DIM),
    _case("rmsnorm_qnorm_4096x24x256", 4096 * HQ, HEAD_DIM),
]
