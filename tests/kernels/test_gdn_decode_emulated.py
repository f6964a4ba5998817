"""cuda/gdn_decode.cu's own source on the CPU (tests/kernels/emu): qkv, z, b and a read as column
blocks of one merged projection [T, W] with row strides give bitwise the outputs and states of
the same values in dense arrays, and stay close to luce/ref/gdn_decode.py. A stride below its
block's width is refused. tests/kernels/test_gdn_decode.py checks the kernel on a GPU."""
from __future__ import annotations

import ctypes as C

import numpy as np
import pytest

from luce.ops.gdn_inputs import gdn_q_scale
from luce.ref.gdn_decode import gdn_decode as ref_gdn_decode
from tests.kernels.emu import build as emu

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
               [("conv_stage", _P), ("stage_row0", C.c_int64)]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = emu.load(["gdn_decode.cu"], tmp_path_factory.mktemp("emu_gdn_decode"), "the GDN decode kernels")
    lib.luce_gdn_decode.argtypes = [C.POINTER(Params), _P]
    return lib


def inputs(seed: int):
    rng = np.random.default_rng(seed)
    T = len(SLOTS)
    x = dict(qkv=rng.standard_normal((T, CH)), z=rng.standard_normal((T, HV * DV)),
             b=rng.standard_normal((T, HV)), a=rng.standard_normal((T, HV)))
    w = dict(conv=rng.standard_normal((CH, K)) * 0.5, dt_bias=rng.standard_normal(HV),
             ssm_a=-np.exp(rng.standard_normal(HV) * 0.5), norm=1.0 + 0.1 * rng.standard_normal(DV))
    pools = (rng.standard_normal((3, K - 1, CH)), rng.standard_normal((3, HV, DK, DV)) * 0.1)
    f32 = lambda d: {k: np.ascontiguousarray(v, np.float32) for k, v in d.items()}  # noqa: E731
    return f32(x), f32(w), tuple(np.ascontiguousarray(p, np.float32) for p in pools)


def run(lib, blocks, w, pools, strides=None):
    """blocks: qkv, z, b, a arrays (views of a merged array or dense) -> (status, normed, conv
    pool, gdn pool); strides: the row strides given (default: each block's own)."""
    T = len(SLOTS)
    conv_pool, gdn_pool = (p.copy() for p in pools)
    bufs = {n: np.full(shape, np.nan, np.float32) for n, shape in
            dict(q=(T, HV, DK), k=(T, HV, DK), v=(T, HV, DV), g=(T, HV), beta=(T, HV), out=(T, HV, DV),
                 normed=(T, HV, DV)).items()}
    arrivals = np.zeros((T, HV), np.int32)
    qo, slots = np.arange(T + 1, dtype=np.int32), np.asarray(SLOTS, np.int32)
    addr = lambda a: a.ctypes.data  # noqa: E731
    qkv, z, b, a = blocks
    strides = strides or [blk.strides[0] // 4 for blk in blocks]
    p = Params(addr(qkv), addr(w["conv"]), addr(conv_pool), addr(b), addr(a), addr(w["dt_bias"]), addr(w["ssm_a"]),
               addr(z), addr(w["norm"]), addr(gdn_pool), *(addr(bufs[n]) for n in "q k v g beta out normed".split()),
               addr(arrivals), addr(qo), addr(slots), len(gdn_pool), T, HK, HV, DK, DV, K, gdn_q_scale(DK), EPS, EPS,
               *strides)
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
