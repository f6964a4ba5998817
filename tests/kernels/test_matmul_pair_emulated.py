"""luce_matmul_pair (cuda/matmul.cu, cuda/matmul_gemv_pair.cuh) on the CPU (tests/kernels/emu): a
decode row of q|k (Q4_K or Q5_K) and v (Q6_K), the Q4_K_M / Q5_K_M mixes' projections that do not
merge, is one launch (with x already quantized) whose y are bitwise luce_matmul's two calls,
biases and k of one to four 256-value chunks included; calls it does not take (two rows, other
types, a tune set) make the two calls, the same bits. tests/kernels/test_matmul_pair.py runs it on a GPU."""
from __future__ import annotations

import ctypes as C

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from tests.kernels.emu.matmul_params import MatmulParams as Params
from tests.kernels.test_matmul import activations, weights
from tests.kernels.test_matmul_emulated import load_matmul

pytestmark = pytest.mark.slow
REUSE_X = 1


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return load_matmul(tmp_path_factory.mktemp("emu_matmul_pair"))


def calls(lib, x, parts, pair: bool, tune: int = 0, reuse: bool = False):
    """y of each (raw, qtype, n, bias) of `parts` (two) over x: luce_matmul_pair, or luce_matmul
    twice (the second with REUSE_X); reuse: x already quantized by a first call. -> (ys, launches)."""
    x = np.ascontiguousarray(x, np.float32)
    rows, k = x.shape
    nbytes = lib.luce_matmul_workspace_bytes(rows, k)
    ws = np.zeros(nbytes // 4 + 4, np.float32)
    keep, params, ys = [], [], []
    for i, (raw, qtype, n, bias) in enumerate(parts):
        w = np.ascontiguousarray(raw.reshape(-1))
        b = None if bias is None else np.ascontiguousarray(bias, np.float32)
        y = np.full((rows, n), np.nan, np.float32)
        keep += [w, b]
        ys.append(y)
        params.append(Params(x.ctypes.data, w.ctypes.data, None if b is None else b.ctypes.data, y.ctypes.data,
                             ws.ctypes.data, nbytes, rows, n, k, int(qtype), 0, REUSE_X if i or reuse else 0, tune))
    if reuse:     # a producer quantized x: the first part's own call, then the launches counted
        first = Params(*[getattr(params[0], f) for f, _ in Params._fields_])
        first.flags = 0
        assert lib.luce_matmul(C.byref(first), None) == 0
    before = lib.emu_launches()
    if pair:
        assert lib.luce_matmul_pair(C.byref(params[0]), C.byref(params[1]), None) == 0
    else:
        for p in params:
            assert lib.luce_matmul(C.byref(p), None) == 0
    return ys, lib.emu_launches() - before


def same_bits(a, b) -> bool:
    return np.array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))


@pytest.mark.parametrize("qtype_a", [Q.Q4_K, Q.Q5_K])
@pytest.mark.parametrize("k, n_a, n_b", [(1536, 1792, 256), (256, 40, 9), (1024, 17, 130)])
def test_a_pair_is_one_launch_with_the_two_calls_bits(lib, qtype_a, k, n_a, n_b):
    rng = np.random.default_rng(k + n_a)
    parts = [(weights(qtype_a, n_a, k, seed=1)[0], qtype_a, n_a, rng.standard_normal(n_a).astype(np.float32)),
             (weights(Q.Q6_K, n_b, k, seed=2)[0], Q.Q6_K, n_b, None)]
    x = activations(1, k, seed=k)
    for reuse in (False, True):
        got, launches = calls(lib, x, parts, pair=True, reuse=reuse)
        want, apart = calls(lib, x, parts, pair=False, reuse=reuse)
        assert launches == (1 if reuse else 2) and apart == launches + 1, (reuse, launches, apart)
        assert all(same_bits(g, w) for g, w in zip(got, want))
        assert not any(np.isnan(g).any() for g in got)


@pytest.mark.parametrize("case", ["two rows", "q8_0 and q6_k", "q6_k and q4_k", "tune 5"])
def test_calls_the_pair_does_not_take_are_the_two_calls(lib, case):
    k, types, rows, tune = 512, (Q.Q4_K, Q.Q6_K), 1, 0
    if case == "two rows":
        rows = 2
    elif case == "q8_0 and q6_k":
        types = (Q.Q8_0, Q.Q6_K)
    elif case == "q6_k and q4_k":
        types = (Q.Q6_K, Q.Q4_K)
    else:
        tune = 5
    parts = [(weights(t, n, k, seed=i)[0], t, n, None) for i, (t, n) in enumerate(zip(types, (24, 8)))]
    x = activations(rows, k, seed=7)
    got, launches = calls(lib, x, parts, pair=True, tune=tune, reuse=True)
    want, apart = calls(lib, x, parts, pair=False, tune=tune, reuse=True)
    assert launches == apart and all(same_bits(g, w) for g, w in zip(got, want))
