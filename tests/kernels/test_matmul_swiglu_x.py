"""The down projection's SwiGLU in lane (LUCE_MATMUL_X_SWIGLU, cuda/matmul_gemv_x.cuh) on the GPU
through the real library: a one-row decode call whose x is [gate | up] gives bitwise the y of
luce_swiglu_quant then a REUSE_X matmul on the one-row kernel and on the tile kernel (tune 4),
leaving the workspace unwritten; a captured one-slot decode step of a tiny model runs one kernel
fewer a layer with it, the same logits. The CPU checks: tests/kernels/test_matmul_swiglu_x_emulated.py."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from tests.kernels.test_matmul import weights
from tests.kernels.test_matmul_swiglu_x_emulated import CASES, gate_up

pytestmark = pytest.mark.gpu
SENTINEL = 0x5A


def same_bits(a, b) -> bool:
    return np.array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))


def run(gu, raw, qtype, n, k, tune, fused: bool):
    """(y [1, n], whether the workspace was written): X_SWIGLU, or swiglu_quant + REUSE_X."""
    from luce import _cuda_fused as kf
    from luce import _cuda_matmul as km
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels

    lib = load_kernels()
    nb = km.workspace_bytes(1, k)
    ws = DeviceBuffer.from_numpy(np.full(nb, SENTINEL, np.uint8))
    dgu, dw = DeviceBuffer.from_numpy(gu), DeviceBuffer.from_numpy(raw)
    y = DeviceBuffer.from_numpy(np.full((1, n), np.nan, np.float32))
    if fused:
        km.matmul(dgu.ptr, dw.ptr, 0, y.ptr, ws.ptr, nb, 1, n, k, int(qtype), 0, km.X_SWIGLU, tune)
    else:
        act = DeviceBuffer(4 * k)
        kf.swiglu_quant(dgu.ptr, dgu.ptr + 4 * k, act.ptr, ws.ptr, nb, 1, k, 2 * k, 2 * k, 0)
        km.matmul(act.ptr, dw.ptr, 0, y.ptr, ws.ptr, nb, 1, n, k, int(qtype), 0, km.REUSE_X, tune)
    lib.synchronize()
    return y.download((1, n), np.float32), bool((ws.download((nb,), np.uint8) != SENTINEL).any())


@pytest.mark.parametrize("qtype,k,n", CASES + [(Q.Q4_K, 8960, 1536), (Q.Q6_K, 8960, 1536)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_swiglu_in_lane_gives_the_two_launch_bits(qtype, k, n):
    from luce import _cuda_matmul as km
    from luce.ops.cuda_memory import DeviceBuffer

    raw, _ = weights(qtype, n, k, seed=k % 5)
    w = DeviceBuffer.from_numpy(raw)
    for pattern in ("normal", "mixed", "sparse", "inf", "nan"):
        gu = gate_up(k, k + n, pattern)
        tile, _ = run(gu, raw, qtype, n, k, 4, fused=False)
        for tune in (0, 5, 7) if qtype == Q.IQ4_XS else (0, 5):
            what = f"{qtype.name} k={k} n={n} tune {tune} {pattern}"
            assert km.x_in_lane(w.ptr, n, k, int(qtype), tune), what
            fused, wrote = run(gu, raw, qtype, n, k, tune, fused=True)
            two, _ = run(gu, raw, qtype, n, k, tune, fused=False)
            assert not wrote, f"{what}: the in-lane path wrote the workspace"
            assert same_bits(fused, two), f"{what}: in lane != swiglu_quant + the one-row kernel"
            assert same_bits(fused, tile), f"{what}: in lane != the tile kernel"


def test_decode_step_launches_one_kernel_fewer_a_layer(tmp_path, monkeypatch):
    """A captured one-slot decode step of a tiny q4_k_m qwen3 and qwen35: a layer's swiglu_quant
    launch goes (LUCE_MATMUL_SWIGLU_X), the logits stay bitwise the same."""
    from luce.models import load_model
    from luce.models.graphed_forward import GraphedForward
    from luce.models.packer import SegmentSpec, build_batch
    from luce.ops import cuda_fused_ops, get_backend
    from tests.ops.test_matmul_x_once import tiny_q4km

    backend = get_backend("cuda")
    for arch in ("qwen3", "qwen35"):
        model = load_model(tiny_q4km(tmp_path, arch), backend)
        got = {}
        for on in (False, True):
            monkeypatch.setattr(cuda_fused_ops, "SWIGLU_X_ON", on)
            state = model.new_state(max_pages=12, max_slots=2)
            forward = GraphedForward(model)
            batch = build_batch([SegmentSpec(0, [11], 0, [0])])
            logits = None
            for _ in range(3):   # warm, capture, replay
                logits = backend.to_numpy(forward(batch, state).logits)
            got[on] = (forward.cache.last_nodes, logits)
        before, after = got[False][0], got[True][0]
        assert before is not None and after is not None
        assert after.kernels == before.kernels - model.config.n_layer, (arch, before, after)
        assert same_bits(np.asarray(got[False][1], np.float32), np.asarray(got[True][1], np.float32)), arch
