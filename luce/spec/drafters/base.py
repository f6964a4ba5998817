"""The drafter interface: per-depth top-k tokens and log-probs for each speculating slot.

One `propose` call serves every lane (slot) that speculates this step, so a model drafter
batches its work across lanes. A lane's `tokens` are its whole sequence, prompt then
output, ending with the root (the newest token, at absolute position len(tokens) - 1,
which the target has not run yet). Drafters that keep per-slot state (draft KV, DFlash
context) are told when a slot's sequence ends (`release`) and catch up on their own from
`tokens`; a drafter with `feature_layers` (DFlash) is handed the target features of every
committed row at the step's commit (`add_context`). A proposal writes only draft state
that a dropped step leaves harmless (rows beyond what the drafter holds as committed).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from luce.spec.proposal import DraftProposal


@dataclass(frozen=True)
class DraftLane:
    slot: int                      # the target slot the draft is for
    tokens: Sequence[int]          # prompt + output, root last
    depth: int                     # depths wanted (the drafter may return fewer)
    top_k: int                     # candidates per depth wanted

    @property
    def root_position(self) -> int:
        return len(self.tokens) - 1


class Drafter(Protocol):
    kind: str                      # 'ngram' | 'model' | 'dflash'
    feature_layers: tuple[int, ...]  # target layers whose outputs the drafter needs (DFlash)
    max_depth: int | None          # deepest proposal it can make (None: no limit)

    def propose(self, lanes: Sequence[DraftLane]) -> list[DraftProposal]:
        """One proposal per lane, in order."""

    def release(self, slot: int) -> None:
        """Forget what is kept for `slot` (its sequence ended or was reset)."""

    # drafters that keep a model's state of each sequence (a draft model) only:
    # def prefill(self, lanes: Sequence[tuple[int, Sequence[int]]]) -> None:
    #     """(slot, prompt) of prompts the target finished prefilling this step: catch up now."""

    # drafters with feature_layers only:
    # def add_context(self, segments: Sequence[tuple[int, int, int]], features) -> None:
    #     """(slot, first position, count) segments of committed rows and their target
    #     features [N, W] (backend array), in order."""
