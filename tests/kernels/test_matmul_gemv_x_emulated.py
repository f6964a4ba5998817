"""The one-row kernels' x quantized in lane (cuda/matmul_gemv_x.cuh, LUCE_MATMUL_X_ONCE) on the
CPU, from the kernels' own source (tests/kernels/emu, as tests/kernels/test_matmul_emulated.py):
a one-row decode call flagged X_ONCE that takes the one-row kernel runs one launch (no
quantize_x_kernel) and leaves the workspace untouched, and its y is bitwise that of the
two-launch path (quantize_x, then the same one-row kernel: flags 0) and of the tile kernel (tune
4), for Q4_K, Q5_K, Q6_K, Q8_0, Q5_0 and IQ4_XS (its register form, tune 7, and its staged form
with bulk and with per-thread copies); k of whole and partial chunks, two chunk slots a lane;
n not a multiple of the rows a batch; x with a chunk of zeros, huge and tiny (subnormal)
magnitudes, a value past 3e38, inf and NaN. Calls of more rows, and REUSE_X | X_ONCE calls,
keep the workspace path. tests/kernels/test_matmul.py runs the same checks on a GPU.
"""
from __future__ import annotations

import ctypes as C

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from tests.kernels.emu import build as emu
from tests.kernels.emu.matmul_params import MatmulParams as Params
from tests.kernels.test_matmul import weights

pytestmark = pytest.mark.slow
_P = C.c_void_p
REUSE_X, X_ONCE = 1, 2   # LUCE_MATMUL_* (cuda/luce_ops_weights.h)


def _load(tmp_path_factory, name, defines=()):
    lib = emu.load(["matmul.cu"], tmp_path_factory.mktemp(name), "the quantized matmul", defines=defines)
    lib.luce_matmul_workspace_bytes.restype = C.c_int64
    lib.luce_matmul_workspace_bytes.argtypes = [C.c_int64, C.c_int64]
    lib.luce_matmul.argtypes = [C.POINTER(Params), _P]
    lib.emu_launches.restype = C.c_size_t
    return lib


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return _load(tmp_path_factory, "emu_gemv_x")


@pytest.fixture(scope="module")
def lib_cooperative(tmp_path_factory):
    """The staged form's copies by every thread (HIP, sm_80-89) instead of one bulk copy."""
    return _load(tmp_path_factory, "emu_gemv_x_coop", ("LUCE_GEMV_COOPERATIVE=1",))


SENTINEL = 0x5A


class Call:
    """One decode-path luce_matmul call: y, the kernels it launched, whether it wrote the workspace."""

    def __init__(self, lib, x, raw, qtype, n, flags=0, tune=0, bias=None, ws=None):
        x = np.ascontiguousarray(x, np.float32)
        rows, k = x.shape
        nbytes = lib.luce_matmul_workspace_bytes(rows, k)
        self.ws = ws if ws is not None else np.full(nbytes + 16, SENTINEL, np.uint8)
        w = np.ascontiguousarray(raw).reshape(-1)
        self.y = np.full((rows, n), np.nan, np.float32)
        b = None if bias is None else np.ascontiguousarray(bias, np.float32)
        p = Params(x.ctypes.data, w.ctypes.data, None if b is None else b.ctypes.data, self.y.ctypes.data,
                   self.ws.ctypes.data, nbytes, rows, n, k, int(qtype), 0, flags, tune)
        before = lib.emu_launches()
        assert lib.luce_matmul(C.byref(p), None) == 0
        self.launches = lib.emu_launches() - before
        self.wrote_workspace = bool((self.ws != SENTINEL).any())


def same_bits(a, b) -> bool:
    return np.array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))


def patterned_x(k: int, seed: int, pattern: str) -> np.ndarray:
    """One row of N(0, 1) with `pattern` applied chunk-wise (256 values; the last may be partial)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, k)).astype(np.float32)
    chunks = -(-k // 256)
    if pattern == "mixed":   # a chunk of zeros, chunks of huge, tiny and subnormal magnitudes
        x[0, 0:256] = 0.0
        for c in range(1, chunks):
            lo, hi = 256 * c, min(k, 256 * c + 256)
            x[0, lo:hi] *= np.float32([1e30, 1e-30, 1e-42, 1.0, 3e3][c % 5])
    elif pattern == "past3e38":   # finite but past the kernel's 3e38: its chunk counts as bad (NaN)
        x[0, k // 2] = -3.2e38
    elif pattern == "inf":
        x[0, min(k - 1, 300)] = np.inf
        x[0, 7] = -np.inf
    elif pattern == "nan":
        x[0, k - 1] = np.nan
        x[0, 40] = np.nan
    elif pattern == "sparse":   # mostly zeros: exact zero integers, chunks of one nonzero value
        x[0, np.abs(x[0]) < 1.5] = 0.0
    return x


def check_one_row(build, qtype, k, n, tune, pattern, bias=None, ran_in_lane=True):
    raw, _ = weights(qtype, n, k, seed=k % 7)
    x = patterned_x(k, k + n + tune, pattern)
    once = Call(build, x, raw, qtype, n, X_ONCE, tune, bias)
    two = Call(build, x, raw, qtype, n, 0, tune, bias)
    tile = Call(build, x, raw, qtype, n, X_ONCE, 4, bias)
    what = f"{qtype.name} k={k} n={n} tune {tune} {pattern}"
    assert two.launches == 2 and two.wrote_workspace, f"{what}: the two-launch path"
    assert tile.launches == 2 and tile.wrote_workspace, f"{what}: the tile kernel quantizes into the workspace"
    if ran_in_lane:
        assert once.launches == 1, f"{what}: quantize_x still launched"
        assert not once.wrote_workspace, f"{what}: the in-lane path wrote the workspace"
    else:
        assert once.launches == 2 and once.wrote_workspace, f"{what}: quantize_x did not run"
    assert same_bits(once.y, two.y), f"{what}: in lane != quantize_x + the one-row kernel"
    assert same_bits(once.y, tile.y), f"{what}: in lane != the tile kernel"
    if pattern in ("inf", "nan", "past3e38"):
        assert np.isnan(once.y).all()
    else:
        assert np.isfinite(once.y).any()
    return once


# (type, k, n): whole chunks and partial last chunks (Q8_0 / Q5_0: k = 896 three and a half, 352
# a last chunk of 3 groups, 288 of one), k = 1536 and 4864 (Qwen2.5-1.5B's hidden and FFN), n
# odd or not a multiple of the rows a batch (2, 4 or 8).
CASES = [(Q.Q5_0, 896, 37), (Q.Q8_0, 896, 21), (Q.Q5_0, 352, 13), (Q.Q8_0, 288, 11), (Q.Q5_0, 1536, 9),
         (Q.Q8_0, 4864, 7), (Q.Q4_K, 1536, 19), (Q.Q4_K, 4864, 7), (Q.Q5_K, 1536, 13), (Q.Q5_K, 4864, 5),
         (Q.Q6_K, 1536, 11), (Q.Q6_K, 4864, 6), (Q.IQ4_XS, 1536, 13), (Q.IQ4_XS, 4864, 10),
         (Q.IQ4_XS, 1280, 11)]
DEEP_IN_LANE = (Q.Q4_K, Q.Q5_K, Q.IQ4_XS)   # x in lane at twice the rows a batch too (kDeepInLane)
PATTERNS = ["normal", "mixed", "sparse", "inf", "nan", "past3e38"]


@pytest.mark.parametrize("qtype,k,n", CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_in_lane_x_gives_the_same_bits(lib, qtype, k, n):
    """Tune 5 (the one-row kernel for every block type; IQ4_XS staged), 6 (twice the rows a batch:
    Q6_K, Q8_0, Q5_0 keep quantize_x there), 7 (IQ4_XS: its register form) and 8 (the K types'
    staged forms where they run: Q4_K / Q5_K their own lane units), every x pattern; tune 0 (Q4_K,
    Q5_K at twice the rows) where it takes the one-row kernel."""
    bias = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    for pattern in PATTERNS:
        for tune in (5, 6, 7, 8):
            in_lane = tune != 6 or qtype in DEEP_IN_LANE
            check_one_row(lib, qtype, k, n, tune, pattern, bias if tune == 6 else None, in_lane)
    default_one_row = qtype != Q.Q6_K or n * k // 256 * 210 < 16 << 20
    check_one_row(lib, qtype, k, n, 0, "mixed", bias, ran_in_lane=default_one_row)


@pytest.mark.parametrize("qtype,k", [(Q.IQ4_XS, 16640), (Q.Q4_K, 16640), (Q.Q8_0, 16416)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_two_chunk_slots(lib, qtype, k):
    """k over 64 chunks: two chunk slots a lane (lanes of the second past k hold the last chunk's
    copies); Q8_0 at 64.125 chunks (a last chunk of one group in the second slot)."""
    for pattern in ("normal", "mixed", "nan"):
        for tune in (5, 7):
            check_one_row(lib, qtype, k, 7, tune, pattern)


@pytest.mark.parametrize("k,n", [(5120, 9), (17408, 9), (256, 801)])
def test_iq4_xs_staged_per_thread_copies(lib_cooperative, k, n):
    """The staged form with per-thread copies (k of the 27B; n = 801: 3 stages)."""
    for pattern in ("normal", "mixed", "inf"):
        for tune in (0, 6, 8):
            check_one_row(lib_cooperative, Q.IQ4_XS, k, n, tune, pattern)


def test_other_calls_keep_the_workspace(lib):
    """X_ONCE on calls that do not take the one-row kernel changes nothing: 3 rows (the tile
    kernel), tune 4, Q4_K past 256 MiB is not tried here; REUSE_X | X_ONCE reads the workspace
    (one launch, none written), the same bits as the weight's own call."""
    k, n = 896, 37
    raw, _ = weights(Q.Q5_0, n, k)
    raw2, _ = weights(Q.Q5_0, n, k, seed=3)
    x3 = np.random.default_rng(1).standard_normal((3, k)).astype(np.float32)
    three = Call(lib, x3, raw, Q.Q5_0, n, X_ONCE)
    assert three.launches == 2 and three.wrote_workspace
    assert same_bits(three.y, Call(lib, x3, raw, Q.Q5_0, n).y)
    x = x3[:1]
    first = Call(lib, x, raw, Q.Q5_0, n, 0)
    reused = Call(lib, x, raw2, Q.Q5_0, n, REUSE_X | X_ONCE, ws=first.ws.copy())
    assert reused.launches == 1
    assert same_bits(reused.y, Call(lib, x, raw2, Q.Q5_0, n, X_ONCE).y)
    assert same_bits(three.y[0], first.y[0])
