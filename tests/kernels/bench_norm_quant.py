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


def gate_quant_case(tokens: int, heads: int = 24, d: int = 256):
    """The gated attention's output gate (gates read in place from q | gate) + quantization for the
    out projection, at the 27B's 24 heads of 256."""
    from luce import _cuda_fused as kf
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.bench_attention import random_device_buffer

    load_kernels()
    cols = heads * d
    o, qg = random_device_buffer(tokens * cols, 1), random_device_buffer(tokens * 2 * cols, 2)
    out = DeviceBuffer(tokens * cols * 4)
    ws, ws_bytes = _workspace(tokens, cols)

    def launch(stream: int = 0, _keep=(o, qg, out, ws)):
        kf.gate_quant(o.ptr, qg.ptr, out.ptr, ws.ptr, ws_bytes, tokens, heads, d, 2 * cols, stream)
    return launch, tokens * cols * 12 + ws_bytes, tokens * cols * 4


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


def _named(case, name):
    case.__name__ = name
    return case


BENCH_CASES = []
for _t in (1, 64):
    for _h in (1536, 5120):
        BENCH_CASES.append(_named(functools.partial(add_rmsnorm_case, _t, _h), f"add_rmsnorm_quant_{_t}x{_h}"))
    for _f in (8960, 17408):
        BENCH_CASES.append(_named(functools.partial(swiglu_quant_case, _t, _f), f"swiglu_quant_{_t}x{_f}"))
    BENCH_CASES.append(_named(functools.partial(gate_quant_case, _t), f"gate_quant_{_t}x24x256"))
    for _n in (False, True):
        BENCH_CASES.append(_named(functools.partial(rope_kv_case, _t, _n),
                                  f"rope_kv_{'qwen3' if _n else 'qwen2'}_{_t}x12x2x128"))
