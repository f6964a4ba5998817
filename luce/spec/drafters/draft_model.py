"""Draft-model drafter: a small model sharing the target's tokenizer drafts autoregressively.

It keeps its own state (KV pages and, for a hybrid draft, recurrent state) with one lane
per target slot, and batches every lane into each of its steps:
1. catch-up: each lane feeds the tokens its draft state has not seen, root included (one
   segment per lane, padded to its bucket past two rows: graph keys repeat); the last row's
   logits give depth 1. An attention-only draft feeds a short catch-up (up to CHAIN_CATCH_UP
   tokens: the accepted drafts and the bonus token) as a chain of tree rows, whose KV rows land
   where prompt rows would put them but which run the decode kernels: prompt rows take the
   prompt GEMM, built for long prompts (a 2-row catch-up of the 0.5B draft on an H200: 3.7 ms
   against 1.3 ms for a decode row). A hybrid draft's short catch-up stays prompt rows (its
   recurrent state advances in place) whose matmuls take the decode family
   (ForwardBatch.prompt_gemm False). Drafts only steer speed, so their bits need not match;
2. depth d > 1: each lane feeds its top-1 token of depth d - 1 (one AR row per lane).
Per depth it reports the top-k log-probs; the chain follows the top-1 token. On a backend
that queues its launches (a GPU) the chain is fed on the device: each pass keeps its argmax
by slot (GraphedForward.keep_ids_for, every segment's last row) and the next depth's rows
take it (fed), the top-k of every depth is queued and read once, after the last pass, so the
device runs the passes back to back (a host read between depths left it idle: on an H200 a
0.5B draft's one-row pass took 1.20 ms so, plus 0.17-0.24 ms for the read, against 0.96 ms a
step for the same model decoding ahead). The tokens are the same: the argmax is top-k's first.
After drafting, a lane's draft state covers the sequence up to the root: drafted rows lie
beyond it (KV rows nothing reads; a hybrid draft's recurrent state is restored from a
snapshot taken after the catch-up), so the next call only catches up on what the target
committed. An attention-only draft also keeps the KV rows of the drafted tokens it fed: the
ones the target accepted are exactly what a catch-up would write there (same tokens, same
positions, same prefix), so the next catch-up starts after them (usually one row: the bonus
token).
With `head_vocab`, the draft scores only token ids below it: its output matrix cut to its first
rows (byte-level BPE ids are ranked by merge order, roughly by frequency, so the rare tail goes).
On a 0.5B draft the output matrix is over a third of the bytes a draft token reads; a token the
cut head cannot propose is a rejected draft, never a wrong output (the target verifies).
"""
from __future__ import annotations

import copy
import os
from typing import Sequence

import numpy as np

from luce.models.packer import SegmentSpec, build_batch
from luce.models.graphed_forward import GraphedForward
from luce.models.kv_cache import bucket, pages_needed
from luce.spec.drafters.base import DraftLane
from luce.spec.proposal import DraftProposal

CHAIN_CATCH_UP = 16   # longest catch-up an attention-only draft feeds as tree rows (decode kernels)


class DraftModelDrafter:
    kind = "model"
    feature_layers: tuple[int, ...] = ()

    def __init__(self, model, max_slots: int, ctx: int, max_depth: int = 8, target_vocab: int | None = None,
                 head_vocab: int | None = None, fed_chain: bool | None = None):
        """model: a luce model (luce.models.loader.load_model) sharing the target's
        tokenizer; max_slots: target slots it may serve; ctx: longest sequence plus drafts;
        head_vocab: propose only ids below this (None or >= the vocabulary: all); fed_chain:
        depths fed on the device (None: where the backend queues its launches, unless
        LUCE_DRAFT_FED=0)."""
        if target_vocab is not None and int(model.config.vocab) != int(target_vocab):
            raise ValueError(f"draft model vocabulary ({model.config.vocab}) differs from the target's "
                             f"({target_vocab}): a draft model must share the target's tokenizer")
        if max_slots < 1 or ctx < 2 or max_depth < 1:
            raise ValueError(f"draft model needs max_slots >= 1, ctx >= 2, max_depth >= 1; got "
                             f"{max_slots}, {ctx}, {max_depth}")
        if head_vocab is not None and not 1 <= head_vocab:
            raise ValueError(f"draft head vocabulary must be >= 1, got {head_vocab}")
        if head_vocab is not None and head_vocab < int(model.config.vocab):
            model = copy.copy(model)     # the caller's model keeps its whole output matrix
            model.output = model.backend.weight_rows(model.output, head_vocab)
        self.model, self.backend = model, model.backend
        self.forward = GraphedForward(model)   # draft passes replay graphs on GPUs
        self.fed_chain = _feeds_on_device(self.backend) if fed_chain is None else bool(fed_chain)
        if self.fed_chain:
            self.forward.keep_ids_for(max_slots, every_segment=True)
        self.max_depth, self.ctx = max_depth, ctx
        self.pages_per_slot = pages_needed(ctx + max_depth)
        self.state = model.new_state(max_pages=max_slots * self.pages_per_slot, max_slots=max_slots)
        self.seen = [0] * max_slots          # tokens of each lane's sequence the draft state covers
        self.history: list[list[int]] = [[] for _ in range(max_slots)]
        self.fed: list[list[int]] = [[] for _ in range(max_slots)]   # drafted tokens whose KV rows follow `seen`

    def pages(self, slot: int) -> list[int]:
        return list(range(slot * self.pages_per_slot, (slot + 1) * self.pages_per_slot))

    def release(self, slot: int) -> None:
        self.seen[slot] = 0
        self.history[slot] = []
        self.fed[slot] = []
        self.state.reset_slot(slot)

    def prefill(self, lanes: Sequence[tuple[int, Sequence[int]]]) -> None:
        """(slot, prompt) of prompts the target finished prefilling: the draft state catches up
        on them now, so the lane's first draft feeds one row. The draft's share of the prompt is
        then paid where the target's is (time to first token), not inside the first decode step."""
        self.propose([DraftLane(slot, tokens, 1, 1) for slot, tokens in lanes])

    def _sync(self, lane: DraftLane) -> None:
        """Forget the lane's draft state from the first token that differs from `tokens`."""
        tokens, hist, seen = list(lane.tokens), self.history[lane.slot], self.seen[lane.slot]
        if tokens[:seen] == hist[:seen]:   # the usual case, compared at C speed (the context grows)
            common = seen
        else:
            common = 0
            for a, b in zip(hist[:seen], tokens):
                if a != b:
                    break
                common += 1
        if common == self.seen[lane.slot] and self.state.recurrent is None:
            for t in self.fed[lane.slot]:      # accepted drafts: their KV rows are already right
                if common >= len(tokens) or tokens[common] != t:
                    break
                common += 1
        self.fed[lane.slot] = []
        common = min(common, len(tokens) - 1)   # the root is always fed: its logits give depth 1
        if common != self.seen[lane.slot]:
            if common < self.seen[lane.slot] and self.state.recurrent is not None:
                self.state.reset_slot(lane.slot)   # a recurrent state cannot be cut back: start over
                common = 0
            self.seen[lane.slot] = common
        self.history[lane.slot] = tokens

    def propose(self, lanes: Sequence[DraftLane]) -> list[DraftProposal]:
        lanes = list(lanes)
        if not lanes:
            return []
        for lane in lanes:
            if not 0 <= lane.slot < len(self.seen):
                raise IndexError(f"draft model serves slots 0..{len(self.seen) - 1}, got {lane.slot}")
            if not 1 <= len(lane.tokens) <= self.ctx:
                raise ValueError(f"slot {lane.slot}: sequence of {len(lane.tokens)} tokens does not fit "
                                 f"the draft context of {self.ctx}")
            self._sync(lane)
        depths = [min(lane.depth, self.max_depth) for lane in lanes]
        ids = [np.full((d, lane.top_k), -1, np.int64) for d, lane in zip(depths, lanes)]
        lps = [np.full((d, lane.top_k), -np.inf, np.float32) for d, lane in zip(depths, lanes)]

        chain = self.state.recurrent is None   # a recurrent state would need the tree commit
        segments = [_catch_up(lane.slot, list(lane.tokens[self.seen[lane.slot]:]), self.seen[lane.slot],
                              self.pages(lane.slot), chain) for lane in lanes]
        # a prompt's catch-up takes the prompt GEMM; a short one (a hybrid draft's few prompt rows)
        # the decode family, as tree rows do: the GEMM built for long prompts costs a 2-row pass
        # about 3x a one-row pass, and a draft's bits only steer speed
        short = any(seg.parents is None and 1 < len(seg.token_ids) <= CHAIN_CATCH_UP for seg in segments)
        decode_matmuls = short and all(len(seg.token_ids) <= CHAIN_CATCH_UP for seg in segments)
        snapshots, reads = {}, []       # reads: (depth, lanes in row order, top-k handle)
        active = list(range(len(lanes)))
        for d in range(max(depths, default=0)):
            active = [i for i in active if d < depths[i]]
            if not active:
                break
            if d == 0:       # tree segments go last; each lane's logits row is its last token's
                active.sort(key=lambda i: segments[i].parents is not None)
            batch = build_batch([segments[i] for i in active], pad_pages=True,   # keys repeat: graphs replay
                                prompt_gemm=not (decode_matmuls and d == 0))
            out = self.forward(batch, self.state, greedy_ids=self.fed_chain, fed=self.fed_chain and d > 0)
            logits = out.logits
            if d == 0 and batch.has_trees:
                logits = self.backend.take_rows(logits, _last_rows(batch))
            if d == 0:
                for i in active:
                    self.seen[lanes[i].slot] = len(lanes[i].tokens)
                    if self.state.recurrent is not None:
                        snapshots[lanes[i].slot] = self.state.recurrent.snapshot(lanes[i].slot)
            k = min(max(lanes[i].top_k for i in active), int(logits.shape[-1]))
            reads.append((d, active, self.backend.top_k_logprobs_start(logits, k)))
            top1 = [0] * len(active)      # fed: the graph's own argmax, kept by slot, is the token
            if not self.fed_chain:
                top1 = self._read(*reads.pop(), lanes, ids, lps)
            for row, i in enumerate(active):
                lane = lanes[i]
                segments[i] = SegmentSpec(lane.slot, [top1[row]], len(lane.tokens) + d, self.pages(lane.slot))
        for slot, snap in snapshots.items():
            self.state.recurrent.restore(slot, snap)
        for read in reads:                # one wait for the whole chain
            self._read(*read, lanes, ids, lps)
        for i, lane in enumerate(lanes):  # the drafts fed at depths 1..: their KV rows follow `seen`
            self.fed[lane.slot] = ids[i][:depths[i] - 1, 0].tolist()
        return [DraftProposal(a, b) for a, b in zip(ids, lps)]

    def _read(self, d: int, active: list[int], handle, lanes, ids, lps) -> list[int]:
        """Depth d's top-k (handle: top_k_logprobs_start) into the lanes' ids / lps; -> each
        active lane's top-1 token, in row order."""
        top_ids, top_lps = self.backend.top_k_logprobs_wait(handle)
        for row, i in enumerate(active):
            kk = min(lanes[i].top_k, top_ids.shape[1])
            ids[i][d, :kk] = top_ids[row, :kk]
            lps[i][d, :kk] = np.minimum(top_lps[row, :kk], 0.0)
        return top_ids[:, 0].tolist()


def _feeds_on_device(backend) -> bool:
    """Does the chain feed each depth from the last one's argmax on the device? Where the
    backend queues its launches (a GPU): a host read between depths would idle the device."""
    if os.environ.get("LUCE_DRAFT_FED", "1") == "0":
        return False
    ops = ("ids_store", "keep_ids", "put_ids", "feed_ids", "top_k_logprobs_start", "top_k_logprobs_wait")
    return bool(getattr(backend, "launches_async", False)) and all(hasattr(backend, op) for op in ops)


def _catch_up(slot: int, tokens: list[int], start: int, pages: list[int], chain: bool = False) -> SegmentSpec:
    """A lane's first pass: the tokens its draft state has not seen. One or two rows (a lane that
    drafted last step) as they are; more (a prompt, or a lane back from plain steps) padded to
    their bucket, so that catch-ups of other lengths replay one graph instead of each running
    eagerly and being captured (a switching cost the depth policy does not see). With `chain`,
    2 to CHAIN_CATCH_UP tokens form a chain of tree rows (node i at position start + i)."""
    n = len(tokens)
    pad = bucket(n) if n > 2 else None
    if chain and 2 <= n <= CHAIN_CATCH_UP:
        return SegmentSpec(slot, tokens, start, pages, parents=list(range(-1, n - 1)), pad_to=pad)
    return SegmentSpec(slot, tokens, start, pages, pad_to=pad)


def _last_rows(batch) -> np.ndarray:
    """The logits row of each live segment's last token, in segment order (a tree segment's
    rows all reach the LM head; logits rows follow the batch's rows)."""
    live = np.nonzero(batch.seq_slots >= 0)[0]
    return np.searchsorted(batch.logits_indices, batch.qo_indptr[live + 1] - 1).astype(np.int64)
