"""luce.gguf.quants against the `gguf` package: bit-exact dequantization of random blocks,
quantization error bounds on Gaussian data (docs/QUANTS.md), exact round trips, errors."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q
from gguf import quants as gguf_quants

from luce.gguf import quants
from luce.gguf.quants import QuantError, block_info, dequantize, quantize, row_nbytes

QUANTIZED = (Q.Q8_0, Q.Q5_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_XS)
FLOATS = (Q.F32, Q.F16, Q.BF16)

# byte offsets of the f16 scales in each block (random bytes there could be NaN/inf)
F16_SCALE_OFFSETS = {Q.Q8_0: (0,), Q.Q5_0: (0,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2),
                     Q.Q6_K: (208,), Q.IQ4_XS: (0,)}

# relative RMS error bounds on Gaussian data, measured + ~5% (see docs/QUANTS.md)
RMS_BOUNDS = {Q.F32: 0.0, Q.F16: 0.00025, Q.BF16: 0.0019, Q.Q8_0: 0.0056, Q.Q5_0: 0.043,
              Q.Q4_K: 0.075, Q.Q5_K: 0.037, Q.Q6_K: 0.0185, Q.IQ4_XS: 0.079}

SHAPES = [(1,), (3,), (5, 2), (1, 1), (7, 3), (2, 3, 2)]   # in blocks; last axis = blocks per row


def bits(a: np.ndarray) -> np.ndarray:
    """f32 array as its u32 bit patterns (so -0.0 and NaN payloads compare exactly)."""
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def reference(raw: np.ndarray, qtype, shape) -> np.ndarray:
    return gguf_quants.dequantize(raw.reshape(-1), qtype).reshape(shape)


def random_blocks(rng, qtype, n_blocks: int) -> np.ndarray:
    """[n_blocks, bytes] u8: random bytes with finite f16 scales of both signs (zero too)."""
    _, nbytes = block_info(qtype)
    raw = rng.integers(0, 256, size=(n_blocks, nbytes), dtype=np.uint8)
    for offset in F16_SCALE_OFFSETS.get(qtype, ()):
        scale = rng.standard_normal(n_blocks) * 10.0 ** rng.integers(-6, 2, n_blocks)
        scale[rng.random(n_blocks) < 0.05] = 0.0
        raw[:, offset:offset + 2] = scale.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return raw


def gaussian(shape, seed: int, sigma: float = 0.02) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * sigma).astype(np.float32)


def relative_rms(y: np.ndarray, x: np.ndarray) -> float:
    x64 = x.astype(np.float64)
    return float(np.sqrt(np.mean((y - x64) ** 2) / np.mean(x64 ** 2)))


# ---- sizes -------------------------------------------------------------------------------

@pytest.mark.parametrize("qtype", QUANTIZED + FLOATS)
def test_block_info_matches_gguf(qtype):
    assert block_info(qtype) == GGML_QUANT_SIZES[qtype]
    values, nbytes = block_info(qtype)
    assert row_nbytes(qtype, 6 * values) == 6 * nbytes
    assert row_nbytes(int(qtype), 0) == 0


def test_supported_list():
    assert quants.SUPPORTED == (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q5_0, Q.Q4_K, Q.Q5_K, Q.Q6_K,
                                Q.IQ4_XS)


@pytest.mark.parametrize("qtype", QUANTIZED)
def test_row_not_whole_blocks_raises(qtype):
    values, _ = block_info(qtype)
    with pytest.raises(ValueError, match=qtype.name):
        row_nbytes(qtype, values + 16)
    with pytest.raises(QuantError, match=str(values)):
        quantize(np.zeros((2, values + 16), np.float32), qtype)
    with pytest.raises(QuantError):
        dequantize(np.zeros(1000, np.uint8), qtype, (values // 2,))


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q2_K, Q.IQ2_XXS, Q.Q8_1, 9999, "q4k"])
def test_unsupported_type_names_it_and_the_supported_list(qtype):
    for call in (lambda: block_info(qtype), lambda: row_nbytes(qtype, 256),
                 lambda: dequantize(np.zeros(256, np.uint8), qtype, (256,)),
                 lambda: quantize(np.zeros((1, 256), np.float32), qtype)):
        with pytest.raises(QuantError) as info:
            call()
        message = str(info.value)
        assert (qtype.name if isinstance(qtype, Q) else str(qtype)) in message
        assert "IQ4_XS" in message and "Q8_0" in message
    assert issubclass(QuantError, ValueError)


def test_wrong_byte_count_raises():
    raw = np.zeros((3, 144), np.uint8)
    with pytest.raises(QuantError, match="432"):
        dequantize(raw[:, :-1], Q.Q4_K, (3, 256))
    with pytest.raises(QuantError):
        dequantize(raw, Q.Q4_K, (4, 256))


# ---- dequantize: bit-exact against gguf ---------------------------------------------------

@pytest.mark.parametrize("qtype", QUANTIZED + FLOATS)
@pytest.mark.parametrize("block_shape", SHAPES)
def test_dequantize_random_blocks_bit_exact(qtype, block_shape):
    values, nbytes = block_info(qtype)
    rng = np.random.default_rng([int(qtype), len(block_shape), block_shape[-1]])
    if values == 1:                       # float types: a block is one value; use wide rows
        block_shape = block_shape[:-1] + (block_shape[-1] * 33,)
    shape = block_shape[:-1] + (block_shape[-1] * values,)
    raw = random_blocks(rng, qtype, int(np.prod(block_shape))).reshape(
        block_shape[:-1] + (block_shape[-1] * nbytes,))
    got = dequantize(raw, qtype, shape)
    assert got.dtype == np.float32 and got.shape == shape
    np.testing.assert_array_equal(bits(got), bits(reference(raw, qtype, shape)))


@pytest.mark.parametrize("qtype", QUANTIZED + FLOATS)
def test_dequantize_across_chunk_boundaries(qtype, monkeypatch):
    values, nbytes = block_info(qtype)
    # 3 blocks (or 7 values) per chunk: 41 blocks leave a ragged last chunk
    monkeypatch.setattr(quants, "DEQUANTIZE_CHUNK_VALUES", 3 * values if values > 1 else 7)
    raw = random_blocks(np.random.default_rng(7), qtype, 41)
    got = dequantize(raw.reshape(-1), qtype, (41 * values,))
    np.testing.assert_array_equal(bits(got), bits(reference(raw, qtype, (41 * values,))))


def test_dequantize_from_memmap_slice(tmp_path):
    rng = np.random.default_rng(3)
    blocks = random_blocks(rng, Q.Q6_K, 6)
    path = tmp_path / "t.bin"
    path.write_bytes(b"\x00" * 13 + blocks.tobytes())            # misaligned offset
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    got = dequantize(mm[13:], Q.Q6_K, (3, 512))
    np.testing.assert_array_equal(bits(got), bits(reference(blocks, Q.Q6_K, (3, 512))))


def test_dequantize_special_float_values_exact():
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -3.4e38], np.float32)
    nan_payload = np.array([0x7FC01234, 0xFF800001], np.uint32).view(np.float32)
    x = np.concatenate([special, nan_payload])
    got = dequantize(x.view(np.uint8), Q.F32, x.shape)
    np.testing.assert_array_equal(bits(got), bits(x))
    halves = np.array([0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E01, 0x0001, 0x8001], np.uint16)
    for qtype in (Q.F16, Q.BF16):
        got = dequantize(halves.view(np.uint8), qtype, halves.shape)
        np.testing.assert_array_equal(bits(got), bits(reference(halves.view(np.uint8), qtype,
                                                                halves.shape)))


# ---- quantize -----------------------------------------------------------------------------

@pytest.mark.parametrize("qtype", QUANTIZED + FLOATS)
@pytest.mark.parametrize("sigma", [0.02, 30.0])
def test_quantize_error_within_bound(qtype, sigma):
    x = gaussian((16, 1024), seed=int(qtype), sigma=sigma)
    raw = quantize(x, qtype)
    assert raw.dtype == np.uint8 and raw.shape == (16, row_nbytes(qtype, 1024))
    decoded = reference(raw, qtype, x.shape)                       # the gguf decoder
    assert relative_rms(decoded, x) <= RMS_BOUNDS[qtype]
    # round trip: our decoder reads our bytes exactly as gguf does
    np.testing.assert_array_equal(bits(dequantize(raw, qtype, x.shape)), bits(decoded))


# uniform quantizer each type is compared with: (group size, span of a group -> step)
UNIFORM_STEP = {
    Q.Q8_0: (32, lambda g: np.abs(g).max(axis=1) / 127),
    Q.Q5_0: (32, lambda g: np.abs(g).max(axis=1) / 16),
    Q.Q4_K: (32, lambda g: (g.max(axis=1) - np.minimum(g.min(axis=1), 0)) / 15),
    Q.Q5_K: (32, lambda g: (g.max(axis=1) - np.minimum(g.min(axis=1), 0)) / 31),
    Q.Q6_K: (16, lambda g: np.abs(g).max(axis=1) / 32),
    Q.IQ4_XS: (32, lambda g: np.abs(g).max(axis=1) * (240 / 127) / 15),   # table spans 240/127
}


@pytest.mark.parametrize("qtype", QUANTIZED)
def test_quantize_at_least_as_good_as_uniform_rounding(qtype):
    """The scale search must not lose to step/sqrt(12) of plain round-to-nearest with the
    scale set by each group's extremes (Q8_0 is that quantizer, so it gets a 2% margin)."""
    x = gaussian((8, 2048), seed=99, sigma=1.0)
    decoded = dequantize(quantize(x, qtype), qtype, x.shape)
    group, step = UNIFORM_STEP[qtype]
    uniform_rms = np.sqrt(np.mean(step(x.reshape(-1, group)) ** 2) / 12)
    margin = 1.02 if qtype == Q.Q8_0 else 1.0
    assert np.sqrt(np.mean((decoded - x) ** 2)) < uniform_rms * margin


@pytest.mark.parametrize("qtype", QUANTIZED + FLOATS)
@pytest.mark.parametrize("shape_in_blocks", [(1,), (3,), (1, 2), (5, 1), (2, 3, 2)])
def test_quantize_shapes_round_trip(qtype, shape_in_blocks):
    values, _ = block_info(qtype)
    values = max(values, 32)
    shape = shape_in_blocks[:-1] + (shape_in_blocks[-1] * values,)
    x = gaussian(shape, seed=len(shape) * 10 + shape[-1])
    raw = quantize(x, qtype)
    assert raw.shape == shape[:-1] + (row_nbytes(qtype, shape[-1]),)
    np.testing.assert_array_equal(bits(dequantize(raw, qtype, shape)),
                                  bits(reference(raw, qtype, shape)))
    assert relative_rms(reference(raw, qtype, shape), x) < 3 * RMS_BOUNDS[qtype] + 1e-9


@pytest.mark.parametrize("qtype", QUANTIZED + FLOATS)
def test_quantize_zeros_and_constant_rows(qtype):
    values = max(block_info(qtype)[0], 32)
    x = np.zeros((4, 2 * values), np.float32)
    x[1] = 0.5
    x[2] = -3.0
    x[3, ::7] = 1.25                                                 # sparse row
    decoded = dequantize(quantize(x, qtype), qtype, x.shape)
    assert np.array_equal(decoded[0], x[0])
    assert np.all(np.isfinite(decoded))
    np.testing.assert_allclose(decoded, x, rtol=0, atol=0.02 * 3.0)


def test_quantize_float_types_exact():
    x = gaussian((3, 64), seed=5, sigma=10.0)
    x[0, :6] = [np.inf, -np.inf, np.nan, -0.0, 1e-40, 7e4]
    np.testing.assert_array_equal(quantize(x, Q.F32).view(np.uint32), bits(x))
    with np.errstate(over="ignore"):                                # 7e4 -> inf, as ggml
        np.testing.assert_array_equal(quantize(x, Q.F16).view(np.uint16),
                                      x.astype(np.float16).view(np.uint16))
    np.testing.assert_array_equal(quantize(x, Q.BF16).reshape(-1),
                                  gguf_quants.quantize(x, Q.BF16).view(np.uint8).reshape(-1))
    assert quantize(x.astype(np.float64), Q.F32).shape == (3, 256)


def test_quantize_accepts_non_contiguous_and_float64():
    x = gaussian((6, 512), seed=11)
    for qtype in (Q.Q8_0, Q.Q4_K):
        expected = quantize(np.ascontiguousarray(x[::2]), qtype)
        np.testing.assert_array_equal(quantize(x[::2], qtype), expected)
        np.testing.assert_array_equal(quantize(x[::2].astype(np.float64), qtype), expected)


def test_quantize_scalar_raises():
    with pytest.raises(QuantError, match="reshape"):
        quantize(np.float32(1.0), Q.Q8_0)


def test_q5_0_blocks_are_q8_0_blocks_exactly():
    """quants_legacy.q5_0_as_q8_0: the same d, ints q - 16: gguf dequantizes both to the same bits
    (the CUDA backend merges Q5_0 projections with Q8_0 ones this way)."""
    from luce.gguf.quants_legacy import q5_0_as_q8_0

    raw = random_blocks(np.random.default_rng(50), Q.Q5_0, 257)
    raw[0, 2:] = 0                            # every int -16
    raw[1, 2:] = 255                          # every int 15
    as_q8 = q5_0_as_q8_0(raw)
    assert as_q8.shape == (257, 34)
    q = as_q8[:, 2:].view(np.int8)
    assert q.min() >= -16 and q.max() <= 15 and (q[0] == -16).all() and (q[1] == 15).all()
    np.testing.assert_array_equal(bits(reference(as_q8, Q.Q8_0, (257, 32))), bits(reference(raw, Q.Q5_0, (257, 32))))
