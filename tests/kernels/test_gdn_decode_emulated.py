"""cuda/gdn_decode.cu's own source on the CPU (tests/kernels/emu): qkv, z, b and a read as column
blocks of one merged projection [T, W] with row strides give bitwise the outputs and states of
the same values in dense arrays, and stay close to luce/ref/gdn_decode.py. A stride below its
block's width is refused. With a workspace, normed is also quantized for the out projection:
luce_matmul (cuda/matmul.cu's source, the same build) reusing it gives bitwise its result on
normed, heads straddling 256-value chunks included. tests/kernels/test_gdn_decode.py checks the
kernel on a GPU."""
from __future__ import annotations

import ctypes as C

import numpy as np
import pytest

from gguf import GGMLQuantizationType as Q

from luce.ops.gdn_inputs import gdn_q_scale
from luce.ref.gdn_decode import gdn_decode as ref_gdn_decode
from tests.kernels.emu import build as emu
from tests.kernels.emu.matmul_params import MatmulParams
from tests.kernels.test_fused_decode_emulated import dequantize_x
from tests.kernels.test_matmul import weights

pytestmark = pytest.mark.slow
_P = C.c_void_p
HK, HV, DK, DV, K = 2, 4, 64, 32, 4
CH = 2 * HK * DK + HV * DV
SLOTS = [2, -1, 0]   # AR rows on slots 2 and 0, a padding row between
EPS = 1e-6


class Params(C.Structure):
    """luce_gdn_decode_params (cuda/luce_ops_sequence.h), field for field."""
    _fields_ = [(n, _P) for n in ("qkv conv_weight conv_state b a dt_bias ssm_a z norm_weight state q k v g beta "
                                  "out normed arrivals qo_indptr seq_slots").split()] + \
               [("n_slots", C.c_int64)] + [(n, C.c_int32) for n in "n_segments hk hv dk dv kernel_size".split()] + \
               [(n, C.c_float) for n in "q_scale l2_eps rms_eps".split()] + \
               [(n, C.c_int64) for n in "qkv_stride z_stride b_stride a_stride".split()] + \
               [("conv_stage", _P), ("stage_row0", C.c_int64), ("workspace", _P)] + \
               [(n, C.c_int64) for n in "workspace_bytes rows".split()]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = emu.load(["gdn_decode.cu"], tmp_path_factory.mktemp("emu_gdn_decode"), "the GDN decode kernels")
    lib.luce_gdn_decode.argtypes = [C.POINTER(Params), _P]
    return lib


@pytest.fixture(scope="module")
def lib_mm(tmp_path_factory):
    lib = emu.load(["gdn_decode.cu", "matmul.cu"], tmp_path_factory.mktemp("emu_gdn_decode_mm"),
                   "the GDN decode kernels and the quantized matmul")
    lib.luce_gdn_decode.argtypes = [C.POINTER(Params), _P]
    lib.luce_matmul.argtypes = [C.POINTER(MatmulParams), _P]
    lib.luce_matmul_workspace_bytes.restype = C.c_int64
    lib.luce_matmul_workspace_bytes.argtypes = [C.c_int64, C.c_int64]
    return lib


def inputs(seed: int, hv: int = HV, dv: int = DV):
    rng = np.random.default_rng(seed)
    T, ch = len(SLOTS), 2 * HK * DK + hv * dv
    x = dict(qkv=rng.standard_normal((T, ch)), z=rng.standard_normal((T, hv * dv)),
             b=rng.standard_normal((T, hv)), a=rng.standard_normal((T, hv)))
    w = dict(conv=rng.standard_normal((ch, K)) * 0.5, dt_bias=rng.standard_normal(hv),
             ssm_a=-np.exp(rng.standard_normal(hv) * 0.5), norm=1.0 + 0.1 * rng.standard_normal(dv))
    pools = (rng.standard_normal((3, K - 1, ch)), rng.standard_normal((3, hv, DK, dv)) * 0.1)
    f32 = lambda d: {k: np.ascontiguousarray(v, np.float32) for k, v in d.items()}  # noqa: E731
    return f32(x), f32(w), tuple(np.ascontiguousarray(p, np.float32) for p in pools)


def run(lib, blocks, w, pools, strides=None, workspace=None):
    """blocks: qkv, z, b, a arrays (views of a merged array or dense) -> (status, normed, conv
    pool, gdn pool); strides: the row strides given (default: each block's own); workspace: a
    uint8 array normed is also quantized into (the arrivals then count the chunks too)."""
    T, (hv, dv) = len(SLOTS), pools[1].shape[1::2]
    conv_pool, gdn_pool = (p.copy() for p in pools)
    bufs = {n: np.full(shape, np.nan, np.float32) for n, shape in
            dict(q=(T, hv, DK), k=(T, hv, DK), v=(T, hv, dv), g=(T, hv), beta=(T, hv), out=(T, hv, dv),
                 normed=(T, hv, dv)).items()}
    arrivals = np.full(T * (hv + -(-hv * dv // 256)), 7, np.int32)   # the kernel zeroes what it counts
    qo, slots = np.arange(T + 1, dtype=np.int32), np.asarray(SLOTS, np.int32)
    addr = lambda a: a.ctypes.data  # noqa: E731
    qkv, z, b, a = blocks
    strides = strides or [blk.strides[0] // 4 for blk in blocks]
    quant = (None, 0, 0) if workspace is None else (addr(workspace), workspace.size, T)
    p = Params(addr(qkv), addr(w["conv"]), addr(conv_pool), addr(b), addr(a), addr(w["dt_bias"]), addr(w["ssm_a"]),
               addr(z), addr(w["norm"]), addr(gdn_pool), *(addr(bufs[n]) for n in "q k v g beta out normed".split()),
               addr(arrivals), addr(qo), addr(slots), len(gdn_pool), T, HK, hv, DK, dv, K, gdn_q_scale(DK), EPS, EPS,
               *strides, None, 0, *quant)
    status = lib.luce_gdn_decode(C.byref(p), None)
    return status, bufs["normed"], conv_pool, gdn_pool


@pytest.mark.parametrize("layout", ["qkv_apart", "one_part"])
def test_strided_blocks_give_the_dense_bits(lib, layout):
    x, w, pools = inputs(4)
    order = ["qkv", "z", "b", "a"]
    merged = np.ascontiguousarray(np.concatenate([x[n] for n in (order if layout == "one_part" else order[1:])], 1))
    cols = np.cumsum([0] + [merged.shape[1] - (HV * DV + 2 * HV)] * (layout == "one_part") + [HV * DV, HV, HV])
    views = [merged[:, c0:c1] for c0, c1 in zip(cols[:-1], cols[1:])]
    blocks = views if layout == "one_part" else [x["qkv"]] + views
    dense = run(lib, [x[n] for n in order], w, pools)
    strided = run(lib, blocks, w, pools)
    assert dense[0] == strided[0] == 0
    live = [r for r, s in enumerate(SLOTS) if s >= 0]
    assert np.array_equal(strided[1][live], dense[1][live])
    assert np.array_equal(strided[2], dense[2]) and np.array_equal(strided[3], dense[3])
    for row in live:
        slot, r = SLOTS[row], slice(row, row + 1)
        want, want_conv, want_state = ref_gdn_decode(x["qkv"][r], x["z"][r], x["b"][r], x["a"][r], w["conv"],
                                                     w["dt_bias"], w["ssm_a"], w["norm"], pools[0][slot],
                                                     pools[1][slot], HK, EPS, EPS)
        np.testing.assert_allclose(strided[1][row], want[0], rtol=1e-4, atol=1e-5)
        assert np.array_equal(strided[2][slot], want_conv)
        np.testing.assert_allclose(strided[3][slot], want_state, rtol=1e-4, atol=1e-5)


def test_a_stride_below_the_width_is_refused(lib):
    x, w, pools = inputs(5)
    blocks = [x[n] for n in ("qkv", "z", "b", "a")]
    for i, width in enumerate((CH, HV * DV, HV, HV)):
        strides = [CH, HV * DV, HV, HV]
        strides[i] = width - 1
        status, *_ = run(lib, blocks, w, pools, strides)
        assert status != 0


def matmul(lib, x, raw, qtype, n, workspace, flags):
    """luce_matmul (decode path) of x [rows, k] by raw [n, k] in qtype, x from `workspace`
    (flags REUSE_X = 1) or quantized into it (flags 0) -> y [rows, n]."""
    rows, k = x.shape
    y = np.full((rows, n), np.nan, np.float32)
    p = MatmulParams(x.ctypes.data, raw.ctypes.data, None, y.ctypes.data, workspace.ctypes.data,
                     lib.luce_matmul_workspace_bytes(rows, k), rows, n, k, int(qtype), 0, flags, 0)
    assert lib.luce_matmul(C.byref(p), None) == 0
    return y


@pytest.mark.parametrize("hv,dv,qtype", [(4, 32, Q.Q8_0), (6, 96, Q.Q8_0), (8, 96, Q.IQ4_XS), (3, 256, Q.Q6_K),
                                         (4, 128, Q.Q4_K)])
def test_normed_quantized_in_the_chain_gives_the_out_projections_bits(lib_mm, hv, dv, qtype):
    """normed quantized by the last head of each 256-value chunk (heads of 32 and 96 columns share
    and straddle chunks; one of 256 is a chunk; 128 and 576 columns end in a partial chunk): the out
    projection reusing that workspace gives bitwise the live rows of luce_matmul on normed; normed
    itself is the unquantized chain's; the workspace's padding rows hold zeros."""
    x, w, pools = inputs(11 + dv, hv, dv)
    blocks = [x[n] for n in ("qkv", "z", "b", "a")]
    T, cols, n = len(SLOTS), hv * dv, 24
    ws = np.full(lib_mm.luce_matmul_workspace_bytes(T, cols) + 16, 0x5A, np.uint8)
    status, normed, conv_pool, gdn_pool = run(lib_mm, blocks, w, pools, workspace=ws)
    plain = run(lib_mm, blocks, w, pools)
    assert status == plain[0] == 0
    live = [r for r, s in enumerate(SLOTS) if s >= 0]
    assert np.array_equal(normed[live], plain[1][live])
    assert np.array_equal(conv_pool, plain[2]) and np.array_equal(gdn_pool, plain[3])
    raw, _ = weights(qtype, n, cols, seed=dv)
    rows = np.ascontiguousarray(normed.reshape(T, cols))
    fused = matmul(lib_mm, rows, raw, qtype, n, ws, flags=1)
    alone = matmul(lib_mm, rows, raw, qtype, n, np.zeros_like(ws), flags=0)
    assert np.array_equal(fused[live].view(np.uint32), alone[live].view(np.uint32))
    assert np.isfinite(fused[live]).all()
    xq = dequantize_x(ws, T, cols)
    np.testing.assert_allclose(xq[live], rows[live], rtol=0, atol=float(np.abs(rows[live]).max()) / 32767)
    assert not xq[T:].any(), "padding rows of the workspace hold zeros"


def test_a_workspace_too_small_or_without_rows_is_refused(lib_mm):
    x, w, pools = inputs(6)
    blocks = [x[n] for n in ("qkv", "z", "b", "a")]
    need = lib_mm.luce_matmul_workspace_bytes(len(SLOTS), HV * DV)
    assert run(lib_mm, blocks, w, pools, workspace=np.zeros(need, np.uint8))[0] == 0
    assert run(lib_mm, blocks, w, pools, workspace=np.zeros(need - 16, np.uint8))[0] != 0
