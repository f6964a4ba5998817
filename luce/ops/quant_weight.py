"""A weight on the GPU backends: a matrix in its GGUF blocks on the device (luce.ops.cuda_backend)."""
from __future__ import annotations

from dataclasses import dataclass

from luce.ops.cuda_array import Block


@dataclass
class QuantWeight:
    """A matrix [n, k] in GGUF blocks of ggml type `qtype` on the device (row r at
    ptr + r * row_bytes). decode_tune: the luce_matmul tune of its decode-family calls of more
    than 16 rows (0: the kernel library's choice by shape, as for every call of fewer rows; every
    tune gives the same bits, cuda/luce_ops_weights.h); prompt_tune: the same for its prompt-row
    calls (luce_matmul_prefill; 0: the library's choice; 81 splits k, bits of its own)."""

    block: Block
    ptr: int
    qtype: int
    n: int
    k: int
    row_bytes: int
    decode_tune: int = 0
    prompt_tune: int = 0

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.k)

