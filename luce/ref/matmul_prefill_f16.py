"""Prompt-row matmul reference of the f16 tensor-core GEMM (kernel: cuda/matmul_prefill_f16.cu,
LUCE_PREFILL_GEMM=f16; DESIGN 5 rule 1, prefill rows). The int8 GEMM's is luce/ref/matmul_prefill.py.
x: per row a power of two 2^e brings max|x| into [2^14, 2^15), then f16 (scale_x_f16);
weights: f16 per value, w = f16(q * s + o) with s = f16(scale), o = f16(offset) (decode_f16);
the tensor cores sum exact f16 products in f32 (order unspecified: a tolerance, f32_sum_bound).
"""
from __future__ import annotations

import numpy as np

EXP_LIMIT = 100


def scale_x_f16(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [T, K] f32 -> (xh [T, K] f16, out_scale [T] f32): bit for bit the kernel's
    scale_x_f16_kernel (natural k order). xh = f16(x * 2^e), out_scale = 2^-e, e = 15 - E with
    max|x| in [2^(E-1), 2^E), clamped to +-100, 0 for an all-zero row; a row holding inf or NaN
    gets xh = 0, out_scale = NaN."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        bad = ~np.isfinite(x).all(axis=1)
        amax = np.where(bad, 0, np.abs(np.where(np.isfinite(x), x, 0)).max(axis=1))
        _, big_e = np.frexp(amax.astype(np.float32))              # amax in [2^(E-1), 2^E)
        e = np.where(amax > 0, np.clip(15 - big_e, -EXP_LIMIT, EXP_LIMIT), 0)
        up = np.ldexp(np.float32(1), e).astype(np.float32)
        xh = np.where(bad[:, None], 0, x * up[:, None]).astype(np.float16)
        out_scale = np.where(bad, np.nan, np.ldexp(np.float32(1), -e)).astype(np.float32)
    return xh, out_scale


def _f16(v) -> np.ndarray:
    return np.asarray(v).astype(np.float16)


def decode_parts(raw: np.ndarray, qtype, n: int, k: int):
    """GGUF rows raw [n, row bytes] u8 -> (q [n, k] small integers, s [n, k] f16, o [n, k] f16):
    each value's integer, its (sub-)block's f16 scale and f16 offset as the kernel's decode
    (cuda/matmul_prefill_f16_decode.cuh) forms them; o = 0 for types without one."""
    from gguf import GGMLQuantizationType as Q

    from luce.gguf.quants_iq import TABLE
    from luce.gguf.quants_k import _nibbles, unpack_k_scales

    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    per = {Q.Q4_K: (256, 144), Q.Q5_K: (256, 176), Q.Q6_K: (256, 210), Q.IQ4_XS: (256, 136),
           Q.Q8_0: (32, 34), Q.Q5_0: (32, 22)}[qtype]
    b = raw.reshape(n * (k // per[0]), per[1])
    nb = b.shape[0]
    f16_at = lambda off: b[:, off:off + 2].copy().view(np.float16).astype(np.float32)  # [nb, 1]
    zero = np.zeros((nb, 1), np.float16)
    if qtype in (Q.Q4_K, Q.Q5_K):
        sc, m = unpack_k_scales(b[:, 4:16])
        s = _f16(f16_at(0) * sc.astype(np.float32))                  # [nb, 8] per 32 values
        o = _f16(-f16_at(2) * m.astype(np.float32))
        if qtype == Q.Q4_K:
            q = _nibbles(b[:, 16:144])
        else:
            q = _nibbles(b[:, 48:176])
            for j in range(8):
                q[:, j] |= ((b[:, 16:48] >> j) & 1) << 4
        q, s, o = q.astype(np.int32), np.repeat(s, 32, axis=1), np.repeat(o, 32, axis=1)
    elif qtype == Q.Q6_K:
        ql = b[:, 0:128].reshape(nb, 2, 2, 32)
        qh = b[:, 128:192].reshape(nb, 2, 32)
        q = np.empty((nb, 2, 4, 32), np.int32)
        q[:, :, 0:2] = ql & 15
        q[:, :, 2:4] = ql >> 4
        for g in range(4):
            q[:, :, g] |= ((qh >> 2 * g) & 3) << 4
        q = q - 32
        s = np.repeat(_f16(f16_at(208) * b[:, 192:208].view(np.int8).astype(np.float32)), 16, axis=1)
        o = np.repeat(zero, 256, axis=1)
    elif qtype == Q.IQ4_XS:
        scales_h = b[:, 2:4].copy().view(np.uint16).astype(np.int32)
        ls = np.stack([b[:, 4:8] & 15, b[:, 4:8] >> 4], axis=2).reshape(nb, 8).astype(np.int32)
        ls |= ((scales_h >> (2 * np.arange(8))) & 3) << 4
        s = np.repeat(_f16(f16_at(0) * (ls - 32).astype(np.float32)), 32, axis=1)
        qs = b[:, 8:136].reshape(nb, 8, 16)
        q = TABLE[np.concatenate([qs & 15, qs >> 4], axis=2)].astype(np.int32)
        o = np.repeat(zero, 256, axis=1)
    elif qtype == Q.Q8_0:
        q = b[:, 2:].view(np.int8).astype(np.int32)
        s = np.repeat(_f16(f16_at(0)), 32, axis=1)
        o = np.repeat(zero, 32, axis=1)
    else:  # Q5_0: d (q - 16) as q d + (-16 d)
        bits = np.unpackbits(b[:, 2:6], axis=1, bitorder="little").astype(np.int32) << 4
        qs = b[:, 6:22].astype(np.int32)
        q = bits + np.concatenate([qs & 15, qs >> 4], axis=1)
        s = np.repeat(_f16(f16_at(0)), 32, axis=1)
        o = np.repeat(_f16(-16 * f16_at(0)), 32, axis=1)
    return q.reshape(n, k), s.reshape(n, k), o.reshape(n, k)


def decode_f16(raw: np.ndarray, qtype, n: int, k: int) -> np.ndarray:
    """[n, k] f16: the kernel's weights, f16(q * s + o) with one rounding (exact in float64)."""
    q, s, o = decode_parts(raw, qtype, n, k)
    return _f16(q.astype(np.float64) * s.astype(np.float64) + o.astype(np.float64))


def matmul_prefill_f16(x: np.ndarray, raw: np.ndarray, qtype, n: int,
                       bias: np.ndarray | None = None) -> np.ndarray:
    """[T, n] f32: sum over k of xh * wh exactly (float64), times out_scale (+ bias): the f16
    GEMM's result up to its f32 accumulation (f32_sum_bound)."""
    xh, out_scale = scale_x_f16(x)
    wh = decode_f16(raw, qtype, n, x.shape[1]).astype(np.float64)
    with np.errstate(invalid="ignore"):
        y = ((xh.astype(np.float64) @ wh.T) * out_scale[:, None]).astype(np.float32)
    return y if bias is None else y + bias.astype(np.float32)


def f32_sum_bound(x: np.ndarray, raw: np.ndarray, qtype, n: int) -> np.ndarray:
    """[T, n] float64: |kernel - matmul_prefill_f16| stays within this: (k / 16 + 16) f32
    roundings of at most 2^-23 of sum |xh * wh| (one per m16n8k16 accumulation, plus the
    tensor core's own inside one), doubled, plus the output's f32 rounding."""
    xh, out_scale = scale_x_f16(x)
    wh = decode_f16(raw, qtype, n, x.shape[1]).astype(np.float64)
    mag = (np.abs(xh.astype(np.float64)) @ np.abs(wh).T) * np.where(np.isfinite(out_scale), out_scale, 0)[:, None]
    return (x.shape[1] / 16 + 16) * 2.0 ** -22 * mag
