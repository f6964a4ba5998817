"""DFlash drafter: one draft pass over a slot's captured target features proposes a block.

Wraps `luce.models.dflash.DFlashDraft`. Per slot it keeps the draft's context cache: the
fused target features of positions 0..n_context-1 as draft K/V in its own pages. At every
commit the engine hands over the target features of the committed rows (`add_context`: the
target captures `feature_layers` on every row it runs; the features stay backend arrays
from capture to the draft pass), so a lane's context always reaches its root; every lane's
block `[root, MASK x (B-1)]` at positions root.. then runs in one batched pass, whose
rows lie past n_context (nothing of a dropped step's pass is ever read); block row i > 0
gives depth i's distribution, of which the top-k are reported. Only the rows up to the
deepest lane's depth (rounded up: `logit_rows`) reach the LM head.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from luce.models.packer import SegmentSpec, build_batch
from luce.models.graphed_forward import GraphedForward
from luce.models.kv_cache import PAGE_SIZE, pages_needed
from luce.spec.drafters.base import DraftLane
from luce.spec.proposal import DraftProposal


def logit_rows(depth: int, most: int) -> int:
    """Block rows a pass takes to the LM head for drafts of `depth`: the next power of two, at
    most `most` (block - 1). Rows past the depth drafted are not scored (at C5 the 27B draft's
    head is a fifth of the pass); a few sizes keep the pass's graph keys few."""
    n = 1
    while n < depth:
        n *= 2
    return min(n, most)


class DFlashDrafter:
    kind = "dflash"

    def __init__(self, draft, max_slots: int, ctx: int):
        """draft: a DFlashDraft (load_model(path, backend, target_model=target));
        ctx: the longest target sequence a slot holds."""
        if max_slots < 1 or ctx < 1:
            raise ValueError(f"DFlash drafter needs max_slots >= 1 and ctx >= 1, got {max_slots}, {ctx}")
        self.draft, self.backend = draft, draft.backend
        self.forward = GraphedForward(draft)   # block passes replay graphs on GPUs
        self.block_size = int(draft.block_size)
        self.max_depth = self.block_size - 1
        self.feature_layers = tuple(draft.target_layers)
        self.pages_per_slot = pages_needed(ctx + self.block_size)
        self.state = draft.new_state(max_pages=max_slots * self.pages_per_slot, max_slots=max_slots)
        self.n_context = [0] * max_slots

    def pages(self, slot: int) -> list[int]:
        return list(range(slot * self.pages_per_slot, (slot + 1) * self.pages_per_slot))

    def release(self, slot: int) -> None:
        self.n_context[slot] = 0

    def check_context(self, segments: Sequence[tuple[int, int, int]]) -> None:
        """ValueError (nothing changed) unless add_context(segments, ...) can take them."""
        for slot, start, count in segments:
            if not 0 <= slot < len(self.n_context) or self.n_context[slot] != start \
                    or start + count + self.block_size > self.pages_per_slot * PAGE_SIZE:
                held = self.n_context[slot] if 0 <= slot < len(self.n_context) else None
                raise ValueError(f"DFlash drafter, slot {slot}: it holds features of {held} positions, the commit "
                                 f"adds {count} from position {start}: hand over the target features of every "
                                 "committed position exactly once")

    def add_context(self, segments: Sequence[tuple[int, int, int]], features) -> None:
        """Cache committed target features: segments (slot, first position, count) of
        features [N, feature_width] (backend array, rows in segment order). Each segment
        must start at its slot's n_context (every committed position exactly once)."""
        self.check_context(segments)
        specs = [SegmentSpec(slot, [0] * count, start, self.pages(slot), logits="none") for slot, start, count in segments]
        if not specs:
            return
        self.draft.inject_context(build_batch(specs), features, self.state)
        for slot, start, count in segments:
            self.n_context[slot] = start + count

    def propose(self, lanes: Sequence[DraftLane]) -> list[DraftProposal]:
        lanes = list(lanes)
        for lane in lanes:
            if not 0 <= lane.slot < len(self.n_context):
                raise IndexError(f"DFlash drafter serves slots 0..{len(self.n_context) - 1}, got {lane.slot}")
            if self.n_context[lane.slot] != lane.root_position:
                raise ValueError(f"DFlash drafter, slot {lane.slot}: it holds features of {self.n_context[lane.slot]} "
                                 f"positions but the root is at position {lane.root_position}: hand over the target "
                                 "features of every committed position exactly once (add_context)")
        drafting = [lane for lane in lanes if lane.root_position > 0 and lane.depth > 0]
        out = {id(lane): DraftProposal.empty() for lane in lanes}
        if drafting:
            B = self.block_size
            n = logit_rows(max(lane.depth for lane in drafting), B - 1)
            block = build_batch([SegmentSpec(lane.slot, self.draft.block_tokens(lane.tokens[-1], B),
                                             lane.root_position, self.pages(lane.slot), logits="block", block_logits=n)
                                 for lane in drafting], pad_pages=True)
            logits = self.forward(block, self.state).logits            # [lanes * n, V]
            k = max(lane.top_k for lane in drafting)
            ids, lps = self.backend.top_k_logprobs(logits, k)
            for i, lane in enumerate(drafting):
                rows = slice(i * n, i * n + min(lane.depth, n))
                out[id(lane)] = DraftProposal(ids[rows, :lane.top_k], np.minimum(lps[rows, :lane.top_k], 0.0))
        return [out[id(lane)] for lane in lanes]
