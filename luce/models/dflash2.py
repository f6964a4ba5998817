"""DFlash2 draft: DFlash plus grouped dynamic causal convolutions and a candidate selector
(z-lab `dflash` package, `DFlash2DraftModel`; llama.cpp src/models/dflash.cpp).

Convolution (`DynamicCausalConv`, one around each layer's attention and one around its
FFN): after the pre-norm, `dyn = x @ conv_proj^T` viewed [T, 2, K, G] (G = hidden / group
channels); "prepare" convolves the normed rows with side 0, "finish" convolves the block's
output with side 1 (the same row's coefficients). Causal over the block rows only, zero
before the block's first row:

    y[t, c] = sum_{o < K} (base[side, o, c] + dyn[t, side, o, c // group]) * x[t - o, c]

Selector (`CandidateSelector`): per block position p the k best draft logits are the
candidates; walking p = 0, 1, ... from the anchor (the block's last committed token),
    score[p, j] = logit[p, cand_j] + <pred[prev] * (hidden[p] @ W_h^T), succ[cand_j]>
and greedy takes the best candidate as the next predecessor. The chain of picks is the
proposal (it replaces the per-position argmax of DFlash).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from luce.models.batch import ForwardBatch
from luce.models.dflash import DFlashDraft, DraftSequence
from luce.models.layers import blk


@dataclass
class DynamicCausalConv:
    """One grouped dynamic causal convolution. base[side][o]: backend [G, group] arrays;
    proj: Weight [2 * K * G, hidden]."""
    base: list
    proj: object
    kernel: int
    group: int

    @classmethod
    def load(cls, backend, gguf, il: int, prefix: str, kernel: int, group: int) -> "DynamicCausalConv":
        """prefix 'attn_conv' | 'ffn_conv': blk.{il}.{prefix}_base [2, K, hidden], {prefix}_proj.weight."""
        base = gguf.dequantize(blk(il, f"{prefix}_base"))
        hidden = base.shape[-1]
        if base.shape != (2, kernel, hidden) or hidden % group:
            raise ValueError(f"{blk(il, prefix + '_base')}: shape {base.shape}, expected (2, {kernel}, hidden) "
                             f"with hidden a multiple of conv_group_size={group}")
        sides = [[backend.asarray(base[s, o].reshape(hidden // group, group)) for o in range(kernel)]
                 for s in range(2)]
        return cls(sides, backend.load_weight(gguf, blk(il, f"{prefix}_proj.weight")), kernel, group)

    def prepare(self, be, x, batch: ForwardBatch):
        """x [T, hidden] -> (side-0 convolution of x [T, hidden], side-1 coefficients for finish)."""
        n_groups = x.shape[1] // self.group
        chunks = be.split(be.matmul(x, self.proj), [n_groups] * (2 * self.kernel))  # [T, G] each
        return self._convolve(be, x, chunks[:self.kernel], 0, batch), chunks[self.kernel:]

    def finish(self, be, x, coefficients, batch: ForwardBatch):
        """x [T, hidden] (the attention / FFN output) -> side-1 convolution [T, hidden]."""
        return self._convolve(be, x, coefficients, 1, batch)

    def _convolve(self, be, x, coefficients, side: int, batch: ForwardBatch):
        T, hidden = x.shape
        n_groups = hidden // self.group
        in_block = _row_in_segment(batch)
        out = None
        for o in range(min(self.kernel, int(in_block.max()) + 1)):
            src = np.arange(T) - o
            live = (in_block >= o).astype(np.float32)[:, None, None]          # zero before the block
            values = be.mul(be.take_rows(x, np.maximum(src, 0)).reshape(T, n_groups, self.group),
                            be.asarray(live))
            weight = be.add(self.base[side][o], coefficients[o].reshape(T, n_groups, 1))
            term = be.mul(weight, values)
            out = term if out is None else be.add(out, term)
        return out.reshape(T, hidden)


def _row_in_segment(batch: ForwardBatch) -> np.ndarray:
    """[T] int: each row's index inside its segment (its block)."""
    out = np.zeros(batch.n_rows, dtype=np.int64)
    for s in range(batch.n_segments):
        r0, r1 = batch.segment_rows(s)
        out[r0:r1] = np.arange(r1 - r0)
    return out


@dataclass
class SelectorPath:
    """A DFlash2 proposal for block positions 1..n-1 (n - 1 rows, p = 0 .. n-2):
    tokens [n-1] int64 the greedy chain; candidates [n-1, k] int64 (best logit first);
    scores [n-1, k] f32 of each candidate given the chain's predecessor; logits [n-1, V]."""
    tokens: np.ndarray
    candidates: np.ndarray
    scores: np.ndarray
    logits: np.ndarray


@dataclass
class CandidateSelector:
    predecessor: object    # Weight [V, rank] (rows looked up)
    successor: object      # Weight [V, rank]
    hidden: object         # Weight [rank, hidden]
    top_k: int

    @classmethod
    def load(cls, backend, gguf, top_k: int) -> "CandidateSelector":
        w = lambda name: backend.load_weight(gguf, name)  # noqa: E731
        return cls(w("selector_predecessor.weight"), w("selector_successor.weight"), w("selector_hidden.weight"), top_k)

    def select(self, be, hidden, logits, anchor: int) -> SelectorPath:
        """hidden [n-1, hidden] (final-normed), logits [n-1, V] backend arrays -> SelectorPath."""
        candidates, _ = be.top_k_logprobs(logits, self.top_k)                  # ids, ties to the lowest id
        host_logits = be.to_numpy(logits)
        unary = np.take_along_axis(host_logits, candidates, axis=1).astype(np.float64)
        gate = be.to_numpy(be.matmul(hidden, self.hidden)).astype(np.float64)            # [n-1, rank]
        succ = be.to_numpy(be.embedding(self.successor, candidates.reshape(-1))).astype(np.float64)
        succ = succ.reshape(*candidates.shape, -1)                                     # [n-1, k, rank]
        n, prev = candidates.shape[0], int(anchor)
        tokens, scores = np.zeros(n, dtype=np.int64), np.zeros(candidates.shape, dtype=np.float32)
        for p in range(n):
            pred = be.to_numpy(be.embedding(self.predecessor, np.array([prev])))[0].astype(np.float64)
            scores[p] = unary[p] + succ[p] @ (pred * gate[p])
            prev = tokens[p] = int(candidates[p, int(np.argmax(scores[p]))])
        return SelectorPath(tokens, candidates.astype(np.int64), scores, host_logits)


class DFlash2Draft(DFlashDraft):
    """DFlashDraft with the convolutions in every layer and `propose_path` (the selector's
    chain); `propose` still returns the draft logits."""

    dflash2 = True

    def __init__(self, gguf_model_or_path, target_model, backend="numpy"):
        super().__init__(gguf_model_or_path, target_model, backend)
        extra = self.config.extra
        missing = [k for k in ("dflash_conv_kernel", "dflash_conv_group", "dflash_selector_rank",
                               "dflash_selector_top_k") if not extra.get(k)]
        if missing:
            raise ValueError(f"{self.gguf.path}: DFlash2 draft without metadata {missing} "
                             "(dflash.conv_kernel_size, conv_group_size, selector_rank, selector_top_k)")
        kernel, group = int(extra["dflash_conv_kernel"]), int(extra["dflash_conv_group"])
        for il, layer in enumerate(self.layers):
            layer.attn_conv = DynamicCausalConv.load(self.backend, self.gguf, il, "attn_conv", kernel, group)
            layer.ffn_conv = DynamicCausalConv.load(self.backend, self.gguf, il, "ffn_conv", kernel, group)
        self.selector = CandidateSelector.load(self.backend, self.gguf, int(extra["dflash_selector_top_k"]))

    def propose_path(self, seq: DraftSequence, new_features, last_token: int,
                     n_block: int | None = None) -> SelectorPath:
        """As DFlashDraft.propose, then the selector's greedy chain from last_token."""
        hidden = self._block_pass(seq, new_features, last_token, n_block)
        return self.selector.select(self.backend, hidden, self._logits(hidden), last_token)
