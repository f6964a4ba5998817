"""Benchmark cases for GDN chunked prefill (cuda/gdn_chunked.cu) at Qwen3.6-27B shapes:
48 value heads, Dk = Dv = 128. BENCH_CASES as in bench_gdn_recurrent.py: one prompt segment
per slot; bytes_moved is the floor (state read and written once per segment, q, k, v, g,
beta read and out written once); flops count the chunk form's matrix products (the same count
for every variant, so TFLOP/s compares them). Variants (LUCE_GDN_CHUNKED, set around the captured
launch): tf32x3 the default tensor-core kernel, tf32 its one-pass form, f32 the CUDA-core kernel:
`python3 tools/bench.py --filter gdn_chunked` times all of them in one run. Cases ending in _99k
and _64k run the shared-memory configurations of RTX 3090 / 4090 / 5090 and RDNA3/4
(LUCE_SMEM_LIMIT 101,376 and 65,536 B) on this GPU."""
from __future__ import annotations

import functools
import os

import numpy as np

from tests.kernels.bench_gdn_recurrent import DK, DV, HV, gdn_buffers


def gdn_chunked_case(n_segments: int, tokens: int, variant: str = "tf32x3", smem_limit: int | None = None):
    from luce import _cuda_gdn as kg
    from luce.ops.cuda_memory import DeviceBuffer

    b = gdn_buffers(n_segments, tokens)
    b["start"] = DeviceBuffer.from_numpy(np.zeros(n_segments, np.int32))

    settings = {"LUCE_GDN_CHUNKED": variant, "LUCE_SMEM_LIMIT": str(smem_limit) if smem_limit else None}

    def launch(stream: int = 0, b=b):
        before = {name: os.environ.get(name) for name in settings}
        for name, value in settings.items():
            _set_env(name, value)
        try:
            kg.gdn_chunked(b["q"].ptr, b["k"].ptr, b["v"].ptr, b["g"].ptr, b["beta"].ptr, b["state"].ptr,
                           b["out"].ptr, b["qo"].ptr, b["slots"].ptr, b["start"].ptr, n_segments,
                           n_segments, HV, DK, DV, stream)
        finally:
            for name, value in before.items():
                _set_env(name, value)

    L = 64
    per_chunk = HV * (2 * L * L * DK + 4 * L * DK * DV + L * L * DV)  # KK/QK, KS/QS + S update, UT solve
    flops = 2 * n_segments * (tokens // L) * per_chunk
    return launch, b["bytes"], flops


def _set_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


SHAPES = [(1, 4096), (4, 1024), (16, 256)]
BENCH_CASES = [functools.partial(gdn_chunked_case, n, t, v) for v in ("f32", "tf32x3") for n, t in SHAPES]
BENCH_CASES.append(functools.partial(gdn_chunked_case, 1, 4096, "tf32"))
for _c in BENCH_CASES:
    _c.__name__ = f"gdn_chunked_{_c.args[2]}_{_c.args[0]}_{_c.args[1]}"
for _v, _limit, _tag in [("tf32x3", 101_376, "99k"), ("tf32x3", 65_536, "64k"), ("f32", 65_536, "64k")]:
    _c = functools.partial(gdn_chunked_case, 1, 4096, _v, _limit)
    _c.__name__ = f"gdn_chunked_{_v}_{_tag}_1_4096"
    BENCH_CASES.append(_c)
