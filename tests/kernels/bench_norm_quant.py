"""Benchmark cases for the fused kernels (cuda/norm_quant.cu; cuda/rope_kv.cu's cases are
here too, one file for the fused family) at the dense decode shapes of Qwen2.5-Coder-1.5B (hidden 1536, FFN 8960, 12 query / 2 KV heads of 128)
and the 27B width (hidden 5120, FFN 17408). BENCH_CASES entries return
(launch_fn, bytes_moved, flops)."""
from __future__ import annotations

import functools

import numpy as np


def _workspace(rows: int, k: int):
    from luce import _cuda_matmul as km
    from luce.ops.cuda_memory import DeviceBuffer

    n = km.workspace_bytes(rows, k)
    return DeviceBuffer(n), n


def add_rmsnorm_case(tokens: int, hidden: int):
    """Residual add + RMSNorm + quantization for the next matmul."""
    from luce import _cuda_fused as kf
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.bench_attention import random_device_buffer

    load_kernels()
    x, res = random_device_buffer(tokens * hidden, 1), random_device_buffer(tokens * hidden, 2)
    weight = random_device_buffer(hidden, 3)
    s, out = DeviceBuffer(tokens * hidden * 4), DeviceBuffer(tokens * hidden * 4)
    ws, ws_bytes = _workspace(tokens, hidden)

    def launch(stream: int = 0, _keep=(x, res, weight, s, out, ws)):
        kf.add_rmsnorm(x.ptr, res.ptr, weight.ptr, s.ptr, out.ptr, ws.ptr, ws_bytes, tokens, hidden, 1e-6, stream)
    return launch, tokens * hidden * 16 + hidden * 4 + ws_bytes, tokens * hidden * 5


def swiglu_quant_case(tokens: int, ffn: int):
    """SwiGLU of a fused gate|up projection + quantization for the down projection."""
    from luce import _cuda_fused as kf
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.bench_attention import random_device_buffer

    load_kernels()
    gate_up = random_device_buffer(tokens * 2 * ffn, 1)
    out = DeviceBuffer(tokens * ffn * 4)
    ws, ws_bytes = _workspace(tokens, ffn)

    def launch(stream: int = 0, _keep=(gate_up, out, ws)):
        kf.swiglu_quant(gate_up.ptr, gate_up.ptr + 4 * ffn, out.ptr, ws.ptr, ws_bytes, tokens, ffn, 2 * ffn,
                        2 * ffn, stream)
    return launch, tokens * ffn * 12 + ws_bytes, tokens * ffn * 4


def rope_kv_case(tokens: int, qk_norm: bool, hq: int = 12, hkv: int = 2, d: int = 128):
    """q/k norm (qwen3) + rotary + KV write from a merged qkv projection, rows at KV rows 0.."""
    from luce import _cuda_fused as kf
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.bench_attention import random_device_buffer

    load_kernels()
    width = (hq + 2 * hkv) * d
    qkv = random_device_buffer(tokens * width, 1)
    norms = random_device_buffer(2 * d, 2)
    q_out = DeviceBuffer(tokens * hq * d * 4)
    k_pages, v_pages = DeviceBuffer(tokens * hkv * d * 4), DeviceBuffer(tokens * hkv * d * 4)
    dst = DeviceBuffer.from_numpy(np.arange(tokens, dtype=np.int64))
    pos = DeviceBuffer.from_numpy(np.arange(1000, 1000 + tokens, dtype=np.int32))
    qn, kn = (norms.ptr, norms.ptr + 4 * d) if qk_norm else (0, 0)

    def launch(stream: int = 0, _keep=(qkv, norms, q_out, k_pages, v_pages, dst, pos)):
        kf.rope_kv(qkv.ptr, qkv.ptr + 4 * hq * d, qkv.ptr + 4 * (hq + hkv) * d, qn, kn, q_out.ptr, k_pages.ptr,
                   v_pages.ptr, dst.ptr, pos.ptr, tokens, width, width, width, hq, hkv, d, d, 1e6, (), 1, 1e-6,
                   stream)
    return launch, tokens * width * 8 + tokens * 12, tokens * (hq + hkv) * d * 6


def matmul_norm_case(qtype_name: str, n: int, k: int, tail: bool):
    """A decode projection [n, k] at one row and the add + RMSNorm + quantization of its output
    (the out or down projection, then the next norm): `tail`, one luce_matmul_add_rmsnorm (the
    norm as the matmul's tail); else luce_matmul then luce_add_rmsnorm. x quantized in lane where
    k <= 4,096 (X_ONCE, as the backend flags the out projection), else read from a workspace the
    SwiGLU wrote (REUSE_X, the down projection)."""
    from luce import _cuda_fused as kf
    from luce import _cuda_matmul as km
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.bench_attention import random_device_buffer
    from tests.kernels.bench_matmul import random_bytes

    load_kernels()
    qtype = km.QTYPES[qtype_name]
    weights = random_bytes(n * km.row_bytes(qtype, k), 4)
    x, res, norm_w = random_device_buffer(k, 1), random_device_buffer(n, 2), random_device_buffer(n, 3)
    y, s, out = (DeviceBuffer(n * 4) for _ in range(3))
    (x_ws, x_bytes), (ws, ws_bytes) = _workspace(1, k), _workspace(1, n)
    counter = DeviceBuffer.from_numpy(np.zeros(1, np.int32))
    flags = km.X_ONCE if k <= 4096 else km.REUSE_X
    if flags == km.REUSE_X:   # the workspace holds x, as swiglu_quant leaves it
        km.matmul(x.ptr, weights.ptr, 0, y.ptr, x_ws.ptr, x_bytes, 1, n, k, qtype, km.PATH_DECODE, 0)

    def launch(stream: int = 0, _keep=(weights, x, res, norm_w, y, s, out, x_ws, ws, counter)):
        if tail:
            km.matmul_add_rmsnorm(x.ptr, weights.ptr, 0, y.ptr, x_ws.ptr, x_bytes, 1, n, k, qtype, flags, res.ptr,
                                  norm_w.ptr, s.ptr, out.ptr, ws.ptr, ws_bytes, 1e-6, counter.ptr, stream)
        else:
            km.matmul(x.ptr, weights.ptr, 0, y.ptr, x_ws.ptr, x_bytes, 1, n, k, qtype, km.PATH_DECODE, flags, 0, stream)
            kf.add_rmsnorm(y.ptr, res.ptr, norm_w.ptr, s.ptr, out.ptr, ws.ptr, ws_bytes, 1, n, 1e-6, stream)
    return launch, n * km.row_bytes(qtype, k) + 4 * k + 16 * n + ws_bytes, 2 * n * k + 5 * n


def matmul_swiglu_case(qtype_name: str, F: int, k: int, tail: bool):
    """A merged gate|up projection [2F, k] at one row (x from the norm's workspace) and the SwiGLU +
    quantization for the down projection: `tail`, one luce_matmul_swiglu_quant (the SwiGLU as the
    matmul's tail); else luce_matmul then luce_swiglu_quant."""
    from luce import _cuda_fused as kf
    from luce import _cuda_matmul as km
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.bench_attention import random_device_buffer
    from tests.kernels.bench_matmul import random_bytes

    load_kernels()
    qtype, n = km.QTYPES[qtype_name], 2 * F
    weights = random_bytes(n * km.row_bytes(qtype, k), 4)
    x, y, act = random_device_buffer(k, 1), DeviceBuffer(n * 4), DeviceBuffer(F * 4)
    (x_ws, x_bytes), (ws, ws_bytes) = _workspace(1, k), _workspace(1, F)
    counters = DeviceBuffer.from_numpy(np.zeros(256, np.int32))
    km.matmul(x.ptr, weights.ptr, 0, y.ptr, x_ws.ptr, x_bytes, 1, n, k, qtype, km.PATH_DECODE, 0)  # x quantized

    def launch(stream: int = 0, _keep=(weights, x, y, act, x_ws, ws, counters)):
        if tail:
            km.matmul_swiglu_quant(x.ptr, weights.ptr, 0, y.ptr, x_ws.ptr, x_bytes, 1, n, k, qtype, km.REUSE_X,
                                   act.ptr, ws.ptr, ws_bytes, counters.ptr, 256, stream)
        else:
            km.matmul(x.ptr, weights.ptr, 0, y.ptr, x_ws.ptr, x_bytes, 1, n, k, qtype, km.PATH_DECODE, km.REUSE_X, 0,
                      stream)
            kf.swiglu_quant(y.ptr, y.ptr + 4 * F, act.ptr, ws.ptr, ws_bytes, 1, F, n, n, stream)
    return launch, n * km.row_bytes(qtype, k) + 4 * k + 12 * F + ws_bytes, 2 * n * k + 4 * F


def _named(case, name):
    case.__name__ = name
    return case


BENCH_CASES = []
for _t in (1, 64):
    for _h in (1536, 5120):
        BENCH_CASES.append(_named(functools.partial(add_rmsnorm_case, _t, _h), f"add_rmsnorm_quant_{_t}x{_h}"))
    for _f in (8960, 17408):
        BENCH_CASES.append(_named(functools.partial(swiglu_quant_case, _t, _f), f"swiglu_quant_{_t}x{_f}"))
    for _n in (False, True):
        BENCH_CASES.append(_named(functools.partial(rope_kv_case, _t, _n),
                                  f"rope_kv_{'qwen3' if _n else 'qwen2'}_{_t}x12x2x128"))
# The decode step's projections before a norm (Qwen2.5-Coder 0.5B and 1.5B out and down), the norm as
# the matmul's tail (`_tail`) against the two launches (`_two`).
for _q, _n, _k, _what in (("Q5_0", 896, 896, "q05out"), ("Q6_K", 896, 4864, "q05down"), ("Q4_K", 896, 4864, "q05down"),
                          ("Q4_K", 1536, 1536, "c15out"), ("Q6_K", 1536, 8960, "c15down"),
                          ("Q4_K", 1536, 8960, "c15down")):
    for _tail in (False, True):
        BENCH_CASES.append(_named(functools.partial(matmul_norm_case, _q, _n, _k, _tail),
                                  f"matmul_norm_{_q}_{_what}_{'tail' if _tail else 'two'}"))
# The FFN's gate|up projection and the SwiGLU after it (Coder 0.5B: Q5_0 896 -> 2 x 4,864; 1.5B: Q4_K
# 1,536 -> 2 x 8,960), as the matmul's tail (`_tail`) against the two launches (`_two`).
for _q, _f, _k, _what in (("Q5_0", 4864, 896, "q05gateup"), ("Q4_K", 8960, 1536, "c15gateup")):
    for _tail in (False, True):
        BENCH_CASES.append(_named(functools.partial(matmul_swiglu_case, _q, _f, _k, _tail),
                                  f"matmul_swiglu_{_q}_{_what}_{'tail' if _tail else 'two'}"))
