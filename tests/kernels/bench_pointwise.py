"""Benchmark cases for the pointwise family (cuda/pointwise.cu) at Qwen3.6-27B shapes: the
residual add [T, 5120], the GDN gate maths on [T, 48] (softplus), and the q/k l2norm of 16
key heads x 128 per token; the gated attention's output gate (24 query heads x 256, the gate
read in place from the q | gate projection). BENCH_CASES entries return (launch_fn, bytes_moved, flops)."""
from __future__ import annotations

import functools

HIDDEN, V_HEADS, K_HEADS, HEAD = 5120, 48, 16, 128
Q_HEADS, Q_DIM = 24, 256


def add_case(tokens: int):
    from luce import _cuda_pointwise as kp
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.bench_attention import random_device_buffer

    load_kernels()
    a, b = random_device_buffer(tokens * HIDDEN, 1), random_device_buffer(tokens * HIDDEN, 2)
    out = DeviceBuffer(tokens * HIDDEN * 4)
    shape, strides = (1, 1, tokens, HIDDEN), (0, 0, HIDDEN, 1)

    def launch(stream: int = 0, _keep=(a, b, out)):
        kp.binary("add", a.ptr, b.ptr, out.ptr, shape, strides, strides, stream=stream)
    return launch, tokens * HIDDEN * 12, tokens * HIDDEN


def softplus_case(tokens: int):
    from luce import _cuda_pointwise as kp
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.bench_attention import random_device_buffer

    load_kernels()
    x, out = random_device_buffer(tokens * V_HEADS, 3), DeviceBuffer(tokens * V_HEADS * 4)

    def launch(stream: int = 0, _keep=(x, out)):
        kp.unary("softplus", x.ptr, out.ptr, tokens * V_HEADS, stream=stream)
    return launch, tokens * V_HEADS * 8, tokens * V_HEADS * 4


def l2norm_case(tokens: int):
    from luce import _cuda_pointwise as kp
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.bench_attention import random_device_buffer

    load_kernels()
    rows = tokens * K_HEADS
    x, out = random_device_buffer(rows * HEAD, 4), DeviceBuffer(rows * HEAD * 4)

    def launch(stream: int = 0, _keep=(x, out)):
        kp.l2norm(x.ptr, out.ptr, rows, HEAD, 1e-6, stream=stream)
    return launch, rows * HEAD * 8, rows * HEAD * 3


def gate_output_case(tokens: int):
    """out [T, Hq*D] = o * sigmoid(gate), the gates a strided view of qg [T, Hq, 2D]."""
    from luce import _cuda_pointwise as kp
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.bench_attention import random_device_buffer

    load_kernels()
    n = tokens * Q_HEADS * Q_DIM
    o, qg, out = random_device_buffer(n, 5), random_device_buffer(2 * n, 6), DeviceBuffer(n * 4)
    shape = (1, tokens, Q_HEADS, Q_DIM)

    def launch(stream: int = 0, _keep=(o, qg, out)):
        kp.binary("mul_sigmoid", o.ptr, qg.ptr + 4 * Q_DIM, out.ptr, shape, (0, Q_HEADS * Q_DIM, Q_DIM, 1),
                  (0, 2 * Q_HEADS * Q_DIM, 2 * Q_DIM, 1), stream=stream)
    return launch, n * 12, n * 5


BENCH_CASES = []
for _fn, _ts in ((add_case, (1, 4096)), (softplus_case, (4096,)), (l2norm_case, (1, 4096)),
                 (gate_output_case, (1, 23, 4096))):
    for _t in _ts:
        _c = functools.partial(_fn, _t)
        _c.__name__ = f"pointwise_{_fn.__name__[:-5]}_{_t}"
        BENCH_CASES.append(_c)
