"""The one-row kernels' x quantized in lane (cuda/matmul_gemv_x.cuh, LUCE_MATMUL_X_ONCE) on the
GPU through the real library: a one-row decode call flagged X_ONCE gives bitwise the y of the
two-launch path (quantize_x, then the same one-row kernel: flags 0) and of the tile kernel (tune
4), leaving the workspace unwritten; and a captured decode step of a tiny model runs fewer
kernels with it (one quantize_x launch fewer a lone-weight one-row call). The same checks on the
CPU from the kernels' source: tests/kernels/test_matmul_gemv_x_emulated.py."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from tests.kernels.test_matmul import weights
from tests.kernels.test_matmul_gemv_x_emulated import CASES, DEEP_IN_LANE, PATTERNS, patterned_x

pytestmark = pytest.mark.gpu
SENTINEL = 0x5A


def call(x, raw, qtype, n, flags, tune, bias=None):
    """(y [1, n], whether the workspace was written) of one decode-path luce_matmul call."""
    from luce import _cuda_matmul as km
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels

    lib = load_kernels()
    rows, k = x.shape
    nb = km.workspace_bytes(rows, k)
    ws = DeviceBuffer.from_numpy(np.full(nb, SENTINEL, np.uint8))
    dx, dw = DeviceBuffer.from_numpy(x), DeviceBuffer.from_numpy(raw)
    db = DeviceBuffer.from_numpy(bias.astype(np.float32)) if bias is not None else None
    y = DeviceBuffer.from_numpy(np.full((rows, n), np.nan, np.float32))
    km.matmul(dx.ptr, dw.ptr, db.ptr if db else 0, y.ptr, ws.ptr, nb, rows, n, k, int(qtype), 0, flags, tune)
    lib.synchronize()
    return y.download((rows, n), np.float32), bool((ws.download((nb,), np.uint8) != SENTINEL).any())


def same_bits(a, b) -> bool:
    return np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("qtype,k,n", CASES + [(Q.IQ4_XS, 17408, 9), (Q.IQ4_XS, 5120, 4101)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_in_lane_x_gives_the_same_bits(qtype, k, n):
    from luce import _cuda_matmul as km

    raw, _ = weights(qtype, n, k, seed=k % 7)
    bias = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    for pattern in PATTERNS:
        x = patterned_x(k, k + n, pattern)
        for tune in (0, 5, 6, 7):
            once, wrote = call(x, raw, qtype, n, km.X_ONCE, tune, bias)
            two, _ = call(x, raw, qtype, n, 0, tune, bias)
            tile, _ = call(x, raw, qtype, n, 0, 4, bias)
            what = f"{qtype.name} k={k} n={n} tune {tune} {pattern}"
            assert same_bits(once, two), f"{what}: in lane != quantize_x + the one-row kernel"
            assert same_bits(once, tile), f"{what}: in lane != the tile kernel"
            if tune in (5, 7) or (tune == 6 and qtype in DEEP_IN_LANE):
                assert not wrote, f"{what}: the in-lane path wrote the workspace"


def test_decode_step_launches_fewer_kernels(tmp_path, monkeypatch):
    """A captured one-slot decode step of a tiny q4_k_m qwen3 (and of qwen35): the kernel nodes
    drop by the number of matmul calls flagged X_ONCE that take the one-row kernel (at least one
    a layer: the out projections; the LM head too where its type takes the one-row kernel), and
    the logits stay bitwise the same."""
    from luce import _cuda_matmul as km
    from luce.models import load_model
    from luce.models.graphed_forward import GraphedForward
    from luce.models.packer import SegmentSpec, build_batch
    from luce.ops import get_backend
    from tests.ops.test_matmul_x_once import tiny_q4km

    backend = get_backend("cuda")
    for arch in ("qwen3", "qwen35"):
        model = load_model(tiny_q4km(tmp_path, arch), backend)
        got = {}
        for once in (0, 2):
            monkeypatch.setattr(km, "X_ONCE", once)
            state = model.new_state(max_pages=12, max_slots=2)
            forward = GraphedForward(model)
            batch = build_batch([SegmentSpec(0, [11], 0, [0])])
            logits = None
            for _ in range(3):   # warm, capture, replay
                out = forward(batch, state)
                logits = backend.to_numpy(out.logits)
            got[once] = (forward.cache.last_nodes, logits)
        before, after = got[0][0], got[2][0]
        assert before is not None and after is not None
        assert after.kernels <= before.kernels - model.config.n_layer, (arch, before, after)
        assert same_bits(np.asarray(got[0][1], np.float32), np.asarray(got[2][1], np.float32)), arch
