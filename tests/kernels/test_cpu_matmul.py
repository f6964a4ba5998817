"""The cpu backend's quantized matmul (luce/cpu/matmul.c, dot_*.c) for every GGUF type:
decoding exact against luce.gguf.quants, the stated error of 8-bit activations, bitwise
equality of every instruction-set path with the portable C, and bitwise batch invariance
(a row alone, at any position of 1..129 rows, on 1, 2 or 4 threads)."""
from __future__ import annotations

import functools

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from luce import _cpu
from luce.gguf import quants
from luce.ops.cpu_backend import CpuBackend, CpuWeight

BLOCK_TYPES = [Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_XS, Q.Q8_0, Q.Q5_0]
FLOAT_TYPES = [Q.F32, Q.F16, Q.BF16]
ALL_TYPES = BLOCK_TYPES + FLOAT_TYPES
K_OF = {Q.Q4_K: 512, Q.Q5_K: 512, Q.Q6_K: 768, Q.IQ4_XS: 512, Q.Q8_0: 352, Q.Q5_0: 608,
        Q.F32: 100, Q.F16: 96, Q.BF16: 130}
N_ODD = 97


@pytest.fixture(autouse=True)
def restore_kernel_settings():
    isa, threads = _cpu.get_isa(), _cpu.get_threads()
    yield
    _cpu.set_isa(isa)
    _cpu.set_threads(threads)


@functools.lru_cache(maxsize=None)
def weight(qtype, n: int = N_ODD, seed: int = 0):
    """(CpuWeight, decoded f32 [n, k]) of random N(0, 1/k) weights of `qtype`."""
    k = K_OF[qtype]
    w = (np.random.default_rng(100 + seed).standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    raw = quants.quantize(w, qtype)
    row_bytes = _cpu.row_bytes(int(qtype), k)
    return CpuWeight(np.ascontiguousarray(raw).reshape(n, row_bytes), int(qtype), n, k, row_bytes), \
        quants.dequantize(raw, qtype, (n, k))


def activations(rows: int, k: int, seed: int) -> np.ndarray:
    """N(0, 1) rows, some scaled far up and down (per-block scales must not leak across rows)."""
    x = np.random.default_rng(seed).standard_normal((rows, k)).astype(np.float32)
    x[1::7] *= 1000.0
    x[3::11] *= 1e-3
    return x


def run(w: CpuWeight, x: np.ndarray, bias=None) -> np.ndarray:
    y = np.empty((x.shape[0], w.n), np.float32)
    _cpu.matmuls(np.ascontiguousarray(x, np.float32), [w], [bias], [y])
    return y


def quantized_error_bound(x: np.ndarray, wd: np.ndarray, qtype) -> np.ndarray:
    """|y - x wd^T| allowed per output: each x_i errs at most amax(its block) / 254 when
    quantized to 8 bits per block (luce/cpu/quantize_act.c), plus f32 accumulation slack."""
    block = 32 if qtype in (Q.Q8_0, Q.Q5_0) else 256
    T, k = x.shape
    amax = np.abs(x.reshape(T, k // block, block)).max(axis=2)
    per_value = np.repeat(amax / 254.0, block, axis=1)                     # [T, k]
    exact = np.abs(x.astype(np.float64)) @ np.abs(wd.astype(np.float64)).T
    return per_value @ np.abs(wd.astype(np.float64)).T * (1 + 1e-4) + 1e-6 * exact


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda q: q.name)
def test_block_decoding_is_exact(qtype):
    """Activations exactly representable in 8 bits (integers, 127 in every block): the only
    error left is f32 rounding of the combine, so the block decode must equal ggml's."""
    w, wd = weight(qtype)
    x = np.random.default_rng(1).integers(-127, 128, (5, w.k)).astype(np.float32)
    x[:, ::32] = 127.0
    want = x.astype(np.float64) @ wd.T.astype(np.float64)
    got = run(w, x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda q: q.name)
def test_block_types_err_within_the_8_bit_activation_bound(qtype):
    w, wd = weight(qtype)
    x = activations(9, w.k, seed=2)
    want = x.astype(np.float64) @ wd.T.astype(np.float64)
    err = np.abs(run(w, x).astype(np.float64) - want)
    bound = quantized_error_bound(x, wd, qtype)
    assert (err <= bound).all(), f"worst err/bound {np.max(err / bound):.3f}"
    # typically far inside it: about 0.5% of each row's RMS (llama.cpp's Q8_K / Q8_0 activations)
    rel = np.sqrt((err ** 2).mean(axis=1)) / np.sqrt((want ** 2).mean(axis=1))
    assert rel.max() < 0.012, rel


@pytest.mark.parametrize("qtype", FLOAT_TYPES, ids=lambda q: q.name)
def test_float_types_match_float64(qtype):
    w, wd = weight(qtype)
    x = activations(7, w.k, seed=3)
    want = x.astype(np.float64) @ wd.T.astype(np.float64)
    scale = np.abs(x).astype(np.float64) @ np.abs(wd).T.astype(np.float64)
    assert (np.abs(run(w, x) - want) <= 1e-6 * scale + 1e-30).all()


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda q: q.name)
def test_every_instruction_set_equals_portable_bitwise(qtype):
    w, _ = weight(qtype)
    for rows in (1, 2, 3, 5, 16, 17, 33):
        x = activations(rows, w.k, seed=rows)
        _cpu.set_isa("portable")
        want = run(w, x)
        for isa in _cpu.supported_isas():
            assert _cpu.set_isa(isa) == isa
            assert np.array_equal(run(w, x).view(np.uint32), want.view(np.uint32)), (isa, rows)


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda q: q.name)
def test_rows_are_batch_invariant_for_any_row_count_position_and_threads(qtype):
    w, _ = weight(qtype)
    probe = activations(3, w.k, seed=7)
    _cpu.set_threads(1)
    alone = np.concatenate([run(w, probe[i:i + 1]) for i in range(3)])
    for threads in (1, 2, 4):
        _cpu.set_threads(threads)
        for rows in (1, 2, 4, 15, 16, 17, 64, 129):
            batch = activations(rows, w.k, seed=1000 + rows)
            for i, pos in enumerate(sorted({0, rows // 2, rows - 1})):
                batch[pos] = probe[i % 3]
            y = run(w, batch)
            for i, pos in enumerate(sorted({0, rows // 2, rows - 1})):
                assert np.array_equal(y[pos].view(np.uint32), alone[i % 3].view(np.uint32)), (threads, rows, pos)


def test_matmuls_shares_one_quantization_and_equals_separate_calls():
    ws = [weight(Q.Q4_K)[0], weight(Q.Q4_K, n=33, seed=1)[0], weight(Q.IQ4_XS)[0], weight(Q.Q5_K)[0]]
    assert len({w.k for w in ws}) == 1
    x = activations(6, ws[0].k, seed=9)
    outs = [np.empty((6, w.n), np.float32) for w in ws]
    _cpu.matmuls(x, ws, [None] * len(ws), outs)
    for w, y in zip(ws, outs):
        assert np.array_equal(y, run(w, x))


def test_bias_is_added_once_after_the_reduction():
    w, _ = weight(Q.Q8_0)
    x = activations(4, w.k, seed=4)
    bias = np.random.default_rng(5).standard_normal(w.n).astype(np.float32)
    assert np.array_equal(run(w, x, bias), run(w, x) + bias)


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q8_0, Q.F16], ids=lambda q: q.name)
def test_a_non_finite_row_gives_nan_and_leaves_other_rows_alone(qtype):
    w, _ = weight(qtype)
    x = activations(3, w.k, seed=6)
    clean = run(w, x)
    x[1, 5] = np.inf
    y = run(w, x)
    assert np.isnan(y[1]).all() or qtype in FLOAT_TYPES and not np.isfinite(y[1]).any()
    assert np.array_equal(y[[0, 2]], clean[[0, 2]])


def test_zero_rows_and_zero_activations():
    w, _ = weight(Q.Q4_K)
    assert run(w, np.zeros((0, w.k), np.float32)).shape == (0, w.n)
    assert (run(w, np.zeros((2, w.k), np.float32)) == 0).all()


def test_backend_refuses_shape_mismatch_and_bad_types():
    be = CpuBackend(threads=1)
    w, _ = weight(Q.Q4_K)
    with pytest.raises(ValueError, match="does not match the weight"):
        be.matmul(np.zeros((2, w.k + 1), np.float32), w)
    with pytest.raises(TypeError, match="CpuWeight"):
        be.matmul(np.zeros((2, 4), np.float32), [[1.0] * 4] * 3)
    with pytest.raises(ValueError, match="does not take ggml type"):
        _cpu.row_bytes(2, 256)   # Q4_0: not a cpu matmul type
    with pytest.raises(ValueError, match="threads"):
        CpuBackend(threads=0)


def test_a_weight_type_the_cpu_backend_lacks_is_named_with_the_fix():
    """The GGUF reader already refuses types luce cannot decode (tests/gguf); the backend's own
    check names the type and the fix too, never falling back to an f32 copy."""
    from types import SimpleNamespace

    class FakeGGUF:
        def tensor_info(self, name):
            return SimpleNamespace(shape=(4, 32), qtype=Q.Q4_0)

        def raw(self, name):
            return np.zeros(4 * 18, np.uint8)

    with pytest.raises(ValueError, match=r"Q4_0.*not supported by the cpu backend.*Re-quantize.*--backend numpy"):
        CpuBackend(threads=1).load_weight(FakeGGUF(), "blk.0.attn_q.weight")


def test_a_truncated_weight_is_refused():
    be = CpuBackend(threads=1)
    with pytest.raises(ValueError, match="truncated or corrupt"):
        be._weight(np.zeros(100, np.uint8), int(Q.Q4_K), (2, 256), "w")


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda q: q.name)
def test_embedding_rows_decode_bitwise_as_ggml(qtype):
    w, _ = weight(qtype)
    ids = np.array([5, 0, N_ODD - 1, 5])
    got = CpuBackend(threads=1).embedding(w, ids)
    want = quants.dequantize(w.raw[ids], qtype, (len(ids), w.k))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
