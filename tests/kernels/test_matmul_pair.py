"""luce_matmul_pair on a GPU (cuda/matmul_gemv_pair.cuh): one launch for a decode row of q|k and v
in two types (the Coder-1.5B's Q4_K_M layers) gives luce_matmul's two calls' bits.
tests/kernels/test_matmul_pair_emulated.py runs the same source on the host."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from tests.kernels.test_matmul import activations, run_kernel, weights


@pytest.mark.gpu
@pytest.mark.parametrize("qtype_a", [Q.Q4_K, Q.Q5_K])
@pytest.mark.parametrize("k, n_a, n_b", [(1536, 1792, 256), (1024, 17, 130)])
def test_a_pair_launch_gives_the_two_calls_bits(qtype_a, k, n_a, n_b):
    """luce_matmul_pair (one launch for a decode row of q|k and v in two types: the Coder-1.5B's
    Q4_K_M layers) against luce_matmul twice, with a bias on the first."""
    from luce import _cuda_matmul as km
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.harness import GuardedOutput

    lib = load_kernels()
    raw_a, raw_b = weights(qtype_a, n_a, k, seed=1)[0], weights(Q.Q6_K, n_b, k, seed=2)[0]
    bias = np.random.default_rng(k).standard_normal(n_a).astype(np.float32)
    x = activations(1, k, seed=k)
    dx, dwa, dwb, db = (DeviceBuffer.from_numpy(a) for a in (x, raw_a, raw_b, bias))
    ws_bytes = km.workspace_bytes(1, k)
    ws = DeviceBuffer(max(ws_bytes, 16))
    ya, yb = GuardedOutput((1, n_a)), GuardedOutput((1, n_b))
    km.matmul_pair(dx.ptr, dwa.ptr, db.ptr, ya.ptr, n_a, int(qtype_a), dwb.ptr, 0, yb.ptr, n_b, int(Q.Q6_K),
                   ws.ptr, ws_bytes, 1, k)
    lib.synchronize()
    want_a = run_kernel(x, raw_a, qtype_a, n_a, bias=bias)
    want_b = run_kernel(x, raw_b, Q.Q6_K, n_b)
    assert np.array_equal(ya.result().view(np.uint32), want_a.view(np.uint32))
    assert np.array_equal(yb.result().view(np.uint32), want_b.view(np.uint32))
