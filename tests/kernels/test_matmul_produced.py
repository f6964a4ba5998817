"""luce_matmul_produced on a GPU (cuda/matmul_gemv_x.cuh): a one-row decode matmul that forms its x
in lane from RMSNorm(a + residual) * weight or silu(gate) * up gives the bits of the producer's own
launch (luce_add_rmsnorm / luce_swiglu_quant into the workspace) followed by luce_matmul, and
stores the same a + residual. tests/kernels/test_matmul_produced_emulated.py runs the same source
on the host, with the launch counts."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from tests.kernels.test_matmul import weights

EPS = 1e-6


def _same(a, b) -> bool:
    return np.array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["norm", "swiglu"])
@pytest.mark.parametrize("qtype, k, n", [(Q.Q4_K, 1024, 4864), (Q.Q4_K, 1536, 1792), (Q.Q6_K, 1536, 256),
                                         (Q.Q8_0, 896, 1152), (Q.Q5_0, 896, 896), (Q.Q5_K, 1536, 300),
                                         (Q.Q4_K, 8960, 1536), (Q.Q6_K, 4864, 896)])
def test_x_formed_in_lane_gives_the_producers_bits(kind, qtype, k, n):
    from luce import _cuda_fused as kf
    from luce import _cuda_matmul as km
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.harness import GuardedOutput

    lib = load_kernels()
    rng = np.random.default_rng(k + n)
    raw = weights(qtype, n, k, seed=3)[0]
    bias = rng.standard_normal(n).astype(np.float32)
    a = rng.standard_normal((1, 2 * k if kind == "swiglu" else k)).astype(np.float32)
    a[0, : k // 2] *= 30.0
    b = rng.standard_normal((1, k)).astype(np.float32)
    norm_w = (1.0 + 0.1 * rng.standard_normal(k)).astype(np.float32)
    da, db, dnw, dw, dbias = (DeviceBuffer.from_numpy(v) for v in (a, b, norm_w, raw, bias))
    ws_bytes = km.workspace_bytes(1, k)
    ws1, ws2 = DeviceBuffer(ws_bytes), DeviceBuffer(ws_bytes)
    x1, x2 = GuardedOutput((1, k)), GuardedOutput((1, k))
    y1, y2 = GuardedOutput((1, n)), GuardedOutput((1, n))
    s1, s2 = GuardedOutput((1, k)), GuardedOutput((1, k))
    if kind == "norm":
        src = (km.X_ADD_RMSNORM, da.ptr, db.ptr, dnw.ptr, s1.ptr, k, k, EPS)
        kf.add_rmsnorm(da.ptr, db.ptr, dnw.ptr, s2.ptr, x2.ptr, ws2.ptr, ws_bytes, 1, k, EPS)
    else:   # a gate|up row read in place
        src = (km.X_SWIGLU, da.ptr, da.ptr + 4 * k, 0, 0, 2 * k, 2 * k, 0.0)
        kf.swiglu_quant(da.ptr, da.ptr + 4 * k, x2.ptr, ws2.ptr, ws_bytes, 1, k, 2 * k, 2 * k)
    km.matmul_produced(*src, x1.ptr, dw.ptr, dbias.ptr, y1.ptr, ws1.ptr, ws_bytes, 1, n, k, int(qtype))
    km.matmul(x2.ptr, dw.ptr, dbias.ptr, y2.ptr, ws2.ptr, ws_bytes, 1, n, k, int(qtype), flags=km.REUSE_X)
    lib.synchronize()
    assert _same(y1.result(), y2.result())
    assert np.isfinite(y1.result()).all()
    if kind == "norm":
        assert _same(s1.result(), s2.result())
