"""Benchmark cases for GDN chunked prefill (cuda/gdn_chunked.cu) at Qwen3.6-27B shapes:
48 value heads, Dk = Dv = 128. BENCH_CASES as in bench_gdn_recurrent.py: one prompt segment
per slot; bytes_moved is the floor (state read and written once per segment, q, k, v, g,
beta read and out written once); flops count the chunk form's matrix products."""
from __future__ import annotations

import functools

import numpy as np

from tests.kernels.bench_gdn_recurrent import DK, DV, HV, gdn_buffers


def gdn_chunked_case(n_segments: int, tokens: int):
    from luce import _cuda_gdn as kg
    from luce.ops.cuda_memory import DeviceBuffer

    b = gdn_buffers(n_segments, tokens)
    b["start"] = DeviceBuffer.from_numpy(np.zeros(n_segments, np.int32))

    def launch(stream: int = 0, b=b):
        kg.gdn_chunked(b["q"].ptr, b["k"].ptr, b["v"].ptr, b["g"].ptr, b["beta"].ptr, b["state"].ptr,
                       b["out"].ptr, b["qo"].ptr, b["slots"].ptr, b["start"].ptr, n_segments,
                       n_segments, HV, DK, DV, stream)

    L = 64
    per_chunk = HV * (2 * L * L * DK + 4 * L * DK * DV + L * L * DV)  # KK/QK, KS/QS + S update, UT solve
    flops = 2 * n_segments * (tokens // L) * per_chunk
    return launch, b["bytes"], flops


BENCH_CASES = [functools.partial(gdn_chunked_case, n, t) for n, t in [(1, 4096), (4, 1024), (16, 256)]]
for _c in BENCH_CASES:
    _c.__name__ = "gdn_chunked_" + "_".join(map(str, _c.args))
