"""Packed (column-interleaved) Q4_K / Q6_K / Q5_0 / Q8_0 weights of the cpu backend (luce/cpu/packed.h,
pack.c, gemv_packed_avx512.c, gemv_packed_avx2.c): the layout holds exactly the GGUF blocks'
values (decoded here in numpy, independently of the C), the AVX-512 and AVX2 kernels over it
are bitwise the portable row-major kernel for any row count, position and thread count, and a
packed weight stays correct on every other path (which multiplies its row-major bytes)."""
from __future__ import annotations

import mmap

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from luce import _cpu
from luce.gguf import quants
from luce.ops.cpu_backend import CpuBackend, CpuWeight

PACKED_TYPES = [Q.Q4_K, Q.Q6_K, Q.Q5_0, Q.Q8_0]
K_OF = {Q.Q4_K: 512, Q.Q6_K: 768, Q.Q5_0: 352, Q.Q8_0: 608}
PACKED_ISAS = [isa for isa in ("avx2", "avx512") if isa in _cpu.supported_isas()]   # paths with packed kernels


@pytest.fixture(autouse=True)
def restore_kernel_settings():
    isa, threads = _cpu.get_isa(), _cpu.get_threads()
    yield
    _cpu.set_isa(isa)
    _cpu.set_threads(threads)


def weight(qtype, n: int = 48, k: int = 768, seed: int = 0):
    """(CpuWeight with its packed copy, decoded f32 [n, k])"""
    w = (np.random.default_rng(seed).standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    w[5] *= 40.0   # one column far larger: scales must stay per column
    raw = quants.quantize(w, qtype)
    rb = _cpu.row_bytes(int(qtype), k)
    plain = CpuWeight(np.ascontiguousarray(raw).reshape(n, rb), int(qtype), n, k, rb)
    return CpuWeight(plain.raw, plain.qtype, n, k, rb, _cpu.pack(plain)), quants.dequantize(raw, qtype, (n, k))


def f16(b: np.ndarray) -> np.ndarray:
    return b.view(np.float16).astype(np.float32)


def unpack_numpy(w: CpuWeight) -> np.ndarray:
    """The packed bytes decoded back to f32 [n, k] following packed.h's table, in numpy."""
    groups = w.n // 16
    out = np.empty((w.n, w.k), np.float32)
    if w.qtype in (Q.Q5_0, Q.Q8_0):
        nb = w.k // 32
        rec = w.packed.reshape(groups, nb, 352 if w.qtype == Q.Q5_0 else 544)
        d = f16(rec[:, :, :32].copy()).reshape(groups, nb, 16)
        if w.qtype == Q.Q8_0:
            u = rec[:, :, 32:].reshape(groups, nb, 8, 16, 4).astype(np.int32) - 128        # [g, b, grp, c, e]
        else:
            lo = rec[:, :, 32:288].reshape(groups, nb, 4, 16, 4)
            lo = np.stack([lo & 15, lo >> 4], axis=3).reshape(groups, nb, 8, 16, 4)
            hb = rec[:, :, 288:].reshape(groups, nb, 16, 4)
            hi = np.stack([(hb >> i) & 1 for i in range(8)], axis=2)                        # [g, b, grp, c, e]
            u = (lo | (hi << 4)).astype(np.int32) - 16
        q = u.transpose(0, 3, 1, 2, 4).reshape(groups, 16, nb, 32).astype(np.float32)
        out[:] = (d.transpose(0, 2, 1)[..., None] * q).reshape(w.n, w.k)
        return out
    nb = w.k // 256
    if w.qtype == Q.Q4_K:
        rec = w.packed.reshape(groups, nb, 2368)
        dd = rec[:, :, :64].reshape(groups, nb, 16, 4)
        d, dmin = f16(dd[..., :2].copy()).reshape(groups, nb, 16), f16(dd[..., 2:].copy()).reshape(groups, nb, 16)
        sc = rec[:, :, 64:192].reshape(groups, nb, 8, 16).astype(np.float32)            # [g, b, j, c]
        m = rec[:, :, 192:320].reshape(groups, nb, 4, 16, 2).transpose(0, 1, 2, 4, 3).reshape(groups, nb, 8, 16)
        qb = rec[:, :, 320:].reshape(groups, nb, 8, 4, 16, 4)                           # [g, b, j, h, c, e]
        q = np.stack([qb & 15, qb >> 4], axis=4)                                        # [g, b, j, h, nib, c, e]
        q = q.transpose(0, 5, 1, 2, 3, 4, 6).reshape(groups, 16, nb, 8, 32).astype(np.float32)
        vals = (d.transpose(0, 2, 1)[..., None, None] * sc.transpose(0, 3, 1, 2)[..., None] * q
                - dmin.transpose(0, 2, 1)[..., None, None] * m.transpose(0, 3, 1, 2)[..., None].astype(np.float32))
    else:
        rec = w.packed.reshape(groups, nb, 3360)
        d = f16(rec[:, :, :32].copy()).reshape(groups, nb, 16)
        sc = rec[:, :, 32:288].view(np.int8).reshape(groups, nb, 8, 16, 2).transpose(0, 1, 2, 4, 3).reshape(groups, nb, 16, 16)
        lo = rec[:, :, 288:2336].reshape(groups, nb, 4, 8, 16, 4)                      # [g, b, quarter, h, c, e]
        lo = np.stack([lo & 15, lo >> 4], axis=4).reshape(groups, nb, 4, 16, 16, 4)    # [.., group of 16 in quarter, c, e]
        hb = rec[:, :, 2336:].reshape(groups, nb, 4, 4, 16, 4)                         # [g, b, quarter, p, c, e]
        hi = np.stack([(hb >> (2 * i)) & 3 for i in range(4)], axis=4).reshape(groups, nb, 4, 16, 16, 4)
        u = (lo | (hi << 4)).astype(np.int32) - 32                                       # [g, b, quarter, grp, c, e]
        q = u.transpose(0, 4, 1, 2, 3, 5).reshape(groups, 16, nb, 16, 16).astype(np.float32)   # [g, c, b, sub, 16]
        vals = d.transpose(0, 2, 1)[..., None, None] * sc.transpose(0, 3, 1, 2).astype(np.float32)[..., None] * q
    out[:] = vals.reshape(w.n, w.k)
    return out


@pytest.mark.parametrize("qtype", PACKED_TYPES, ids=lambda q: q.name)
def test_the_packed_layout_holds_exactly_the_blocks_values(qtype):
    w, wd = weight(qtype, n=32, k=K_OF[qtype])
    assert w.packed.nbytes == _cpu.packed_bytes(int(qtype), 32, K_OF[qtype]) == w.raw.nbytes + (
        64 * 2 * (K_OF[qtype] // 256) if qtype == Q.Q4_K else 0)
    assert np.array_equal(unpack_numpy(w), wd)


@pytest.mark.skipif(not PACKED_ISAS, reason="the packed kernels are AVX2 / AVX-512; this CPU has neither")
@pytest.mark.parametrize("isa", PACKED_ISAS or ["none"])
@pytest.mark.parametrize("qtype", PACKED_TYPES, ids=lambda q: q.name)
def test_packed_kernel_is_bitwise_the_portable_kernel_for_any_rows_and_threads(qtype, isa):
    w, _ = weight(qtype, n=80, k=K_OF[qtype], seed=3)
    plain = CpuWeight(w.raw, w.qtype, w.n, w.k, w.row_bytes)
    for threads in (1, 2, 4):
        _cpu.set_threads(threads)
        for rows in (1, 2, 3, 4, 5, 8, 9, 17, 33, 129):
            x = np.random.default_rng(rows).standard_normal((rows, w.k)).astype(np.float32)
            x[1::7] *= 1000.0
            x[3::11] *= 1e-3
            _cpu.set_isa("portable")
            want = np.empty((rows, w.n), np.float32)
            _cpu.matmuls(x, [plain], [None], [want])
            assert _cpu.set_isa(isa) == isa
            got = np.empty_like(want)
            _cpu.matmuls(x, [w], [None], [got])
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (isa, threads, rows)


@pytest.mark.parametrize("qtype", PACKED_TYPES, ids=lambda q: q.name)
def test_a_packed_weight_is_right_on_every_path_with_bias(qtype):
    w, wd = weight(qtype, n=32, k=K_OF[qtype], seed=5)
    x = np.random.default_rng(6).integers(-127, 128, (3, w.k)).astype(np.float32)
    x[:, ::32] = 127.0   # exact in 8 bits: only the f32 combine rounds
    bias = np.random.default_rng(7).standard_normal(w.n).astype(np.float32)
    want = x.astype(np.float64) @ wd.T.astype(np.float64) + bias
    for isa in _cpu.supported_isas():
        _cpu.set_isa(isa)
        y = np.empty((3, w.n), np.float32)
        _cpu.matmuls(x, [w], [bias], [y])
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_shapes_and_types_without_a_packed_form():
    assert _cpu.packed_bytes(int(Q.Q4_K), 40, 512) == -1      # 40 columns: not whole groups of 16
    assert _cpu.packed_bytes(int(Q.IQ4_XS), 32, 512) == -1
    odd, _ = weight(Q.Q4_K, n=16, k=256)
    cut = CpuWeight(odd.raw[:8], odd.qtype, 8, 256, odd.row_bytes)
    assert _cpu.pack(cut) is None
    with pytest.raises(ValueError, match="packed bytes"):
        CpuWeight(odd.raw, odd.qtype, 16, 256, odd.row_bytes, odd.packed[:-1])


def test_weight_rows_keeps_the_packed_prefix_of_whole_groups():
    be = CpuBackend(threads=1)
    w, _ = weight(Q.Q6_K, n=64, k=256)
    cut = be.weight_rows(w, 32)
    assert np.array_equal(cut.packed, _cpu.pack(CpuWeight(w.raw[:32], w.qtype, 32, 256, w.row_bytes)))
    assert be.weight_rows(w, 20).packed is None


def test_released_file_pages_read_back_unchanged(tmp_path):
    data = np.random.default_rng(8).integers(0, 256, 5 * mmap.PAGESIZE + 123, dtype=np.uint8)
    path = tmp_path / "w.bin"
    data.tofile(path)
    view = np.memmap(path, dtype=np.uint8, mode="r")[100:]
    before = np.array(view)
    _cpu.release_file_pages(view)
    assert np.array_equal(np.array(view), before)
