"""IQ4_XS: 256-value super-blocks of 4-bit indices into a fixed non-linear 16-entry table.

`dequantize_iq4_xs(blocks [nb, 136] u8, out [nb, 256] f32)`, `quantize_iq4_xs(x [nb, 256] f32)
-> [nb, 136] u8`. The dequantizer follows ggml's float32 operation order (bit-identical).

Layout (little-endian), 136 B: f16 d, u16 scales_h, u8 scales_l[4], u8 qs[128].
  8 sub-blocks of 32. Sub-block j scale: ls = (scales_l[j // 2] >> 4 (j % 2)) & 15
  | ((scales_h >> 2 j) & 3) << 4, a 6-bit value stored with bias 32;
  x = (d * (ls - 32)) * TABLE[i]. qs[16 j + l]: low nibble = index of value l, high nibble =
  index of value l + 16 of sub-block j.
"""
from __future__ import annotations

import numpy as np

from .quants_search import f16_scale, nearest_table_index, safe_inverse, signed_absmax, \
    table_grid_fit

TABLE = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                 dtype=np.float32)
_SCALE_H_SHIFTS = (2 * np.arange(8)).astype(np.uint16)             # [8]


def dequantize_iq4_xs(blocks: np.ndarray, out: np.ndarray) -> None:
    nb = blocks.shape[0]
    d = blocks[:, 0:2].view(np.float16).astype(np.float32)          # [nb, 1]
    scales_h = blocks[:, 2:4].view(np.uint16)                        # [nb, 1]
    scales_l = blocks[:, 4:8]
    ls = np.empty((nb, 4, 2), np.uint8)
    np.bitwise_and(scales_l, 15, out=ls[:, :, 0])
    np.right_shift(scales_l, 4, out=ls[:, :, 1])
    ls = ls.reshape(nb, 8) | (((scales_h >> _SCALE_H_SHIFTS) & 3).astype(np.uint8) << 4)
    sub_scale = d * (ls.view(np.int8) - np.int8(32)).astype(np.float32)  # [nb, 8]
    qs = blocks[:, 8:136].reshape(nb, 8, 1, 16)
    idx = np.empty((nb, 8, 2, 16), np.uint8)
    np.bitwise_and(qs, 15, out=idx[:, :, :1])
    np.right_shift(qs, 4, out=idx[:, :, 1:])
    o = out.reshape(nb, 8, 32)
    np.take(TABLE, idx.reshape(nb, 8, 32), out=o)
    o *= sub_scale[:, :, None]


# candidate multipliers (table units) for the value of largest magnitude: near either end
_TABLE_MULTIPLIERS = np.concatenate([np.linspace(-139, -115, 13), np.linspace(101, 125, 13)])


def quantize_iq4_xs(x: np.ndarray) -> np.ndarray:
    """Per 32-value sub-block scale search against TABLE, 6-bit scales against the
    super-block maximum, then every value takes the table entry nearest to it."""
    nb = x.shape[0]
    scale = table_grid_fit(x.reshape(nb * 8, 32), TABLE, _TABLE_MULTIPLIERS).reshape(nb, 8)
    d = f16_scale(-signed_absmax(scale) / np.float32(32))            # [nb, 1]
    ls_exact = scale * safe_inverse(d)
    xs = x.reshape(nb, 8, 32)
    best_err = np.full((nb, 8), np.inf, np.float32)
    ls, idx = np.zeros((nb, 8), np.int8), np.zeros((nb, 8, 32), np.uint8)
    for option in (np.floor(ls_exact), np.ceil(ls_exact)):          # 6-bit scale: down or up
        option = np.clip(option, -32, 31).astype(np.int8)
        sub_scale = d * option.astype(np.float32)                    # [nb, 8] as the decoder
        option_idx = nearest_table_index(xs * safe_inverse(sub_scale)[:, :, None], TABLE)
        err = np.square(sub_scale[:, :, None] * TABLE[option_idx] - xs).sum(axis=2)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        ls, idx = np.where(better, option, ls), np.where(better[:, :, None], option_idx, idx)
    stored = (ls + 32).view(np.uint8)                                # [nb, 8] in 0..63
    out = np.empty((nb, 136), np.uint8)
    out[:, 0:2] = d.astype(np.float16).view(np.uint8)
    scales_h = ((stored >> 4).astype(np.uint16) << _SCALE_H_SHIFTS).sum(axis=1, dtype=np.uint16)
    out[:, 2:4] = scales_h[:, None].view(np.uint8)
    out[:, 4:8] = (stored[:, 0::2] & 15) | ((stored[:, 1::2] & 15) << 4)
    out[:, 8:] = (idx[:, :, :16] | (idx[:, :, 16:] << 4)).reshape(nb, 128)
    return out
