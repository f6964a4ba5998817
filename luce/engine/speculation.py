"""The engine's side of speculative decoding (DESIGN.md sections 2 and 3): which decoding
lanes carry a draft tree this step, and what a verified tree leaves behind.

Per step, after the scheduler has placed every decoding lane as an AR row and the prompt
chunks: lanes are upgraded to trees, in order, while the token budget still holds a whole
tree (prefill never waits for speculation; a lane that does not fit, whose draft is empty,
or that is too close to its token or context limit stays an AR row). One batched drafter
call serves every upgraded lane. After the forward pass each tree is accepted losslessly
(greedy: the longest path equal to the target argmax; sampled: the engine's own draws at
absolute positions), its accepted root path is committed into the model state (KV rows
moved into place, recurrent state advanced by factor replay) and the transaction keeps
only the pages that path covers.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from luce.engine.step import Cohort, StepBatch, TreeChunk
from luce.spec.depth import DepthPolicy
from luce.spec.speculator import Speculator
from luce.spec.stats import SpecStats


class EngineSpeculation:
    def __init__(self, speculator: Speculator, token_budget: int, ctx: int):
        self.speculator = speculator
        self.token_budget = token_budget
        self.ctx = ctx
        self.max_nodes = speculator.max_nodes()
        self.trees: dict[int, Any] = {}        # slot -> DraftTree of the step being run
        config = speculator.config
        self.policy = DepthPolicy(speculator.max_depth,
                                  speculator.max_depth if config.draft_min is None else min(config.draft_min,
                                                                                            speculator.max_depth))
        self._drafted_at: float | None = None  # end of this step's drafting (the step's timing starts)

    @property
    def stats(self) -> SpecStats:
        return self.speculator.stats

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self.speculator.feature_layers

    def reserve_tokens(self) -> int:
        """KV rows a request needs beyond its own tokens (a tree's rows are written past the
        committed length before acceptance)."""
        return self.max_nodes

    # ---- before the forward pass ------------------------------------------------------------
    def upgrade(self, cohort: Cohort, requests: dict) -> Cohort:
        """`cohort` with the lanes that speculate this step turned from AR rows into trees."""
        self.trees = {}
        room = self.token_budget - cohort.n_rows
        lanes = []
        for row in cohort.decode:
            if room < self.max_nodes - 1:
                break
            r = requests[row.request_id]
            depth = min(r.params.max_tokens - len(r.output_ids), self.ctx - r.n_tokens) - 1
            if depth < 1 or row.position + self.max_nodes > self.ctx:
                continue
            lanes.append((row.slot, [*r.prompt_ids, *r.output_ids], depth))
            room -= self.max_nodes - 1
        depth = self.policy.choose([s for s, _, _ in lanes], max((d for _, _, d in lanes), default=0))
        if not lanes or depth == 0:
            self._drafted_at = time.perf_counter()
            return cohort
        lanes = [(s, t, min(d, depth)) for s, t, d in lanes]
        t0 = time.perf_counter()
        self.trees = self.speculator.draft_trees(lanes)
        self._drafted_at = time.perf_counter()
        self.policy.record_draft(depth, self._drafted_at - t0)
        decode, trees = [], []
        for row in cohort.decode:
            tree = self.trees.get(row.slot)
            if tree is None:
                decode.append(row)
            else:
                trees.append(TreeChunk(row.slot, row.request_id, tuple(int(t) for t in tree.tokens),
                                       tuple(int(p) for p in tree.parents), row.position))
        return Cohort(cohort.prefill, decode, trees)

    # ---- after the forward pass -------------------------------------------------------------
    def verify(self, step: StepBatch, logits, choice, slot_request) -> dict[int, Any]:
        """Accept every tree of the step: slot -> Acceptance. logits [L, V] host rows of the
        step (a tree's rows are consecutive, node order), or None when choice [L] (the
        target's token at every row, drawn on the backend) is given instead."""
        out = {}
        rows = {}
        for i, slot in enumerate(step.logits_slot.tolist()):
            if slot in self.trees:
                rows.setdefault(slot, []).append(i)
        for chunk in step.cohort.tree:
            r = slot_request(chunk.slot)
            tree = self.trees[chunk.slot]
            mine = rows[chunk.slot]
            acc = self.speculator.accept(tree, None if logits is None else logits[mine], r.params, r.seed,
                                         chunk.start, r.prompt_ids, r.output_ids,
                                         max_tokens=r.params.max_tokens - len(r.output_ids),
                                         target_choice=None if choice is None else choice[mine])
            self.policy.record_verify(chunk.slot, tree.max_depth, acc.n_accepted)
            out[chunk.slot] = acc
        return out

    def commit(self, step: StepBatch, accepted: dict[int, Any], state, pool, features) -> dict[int, int]:
        """Commit each tree's accepted path into the model state (before the transaction
        commit, while the step's new pages are still only planned); returns the rows kept per
        tree slot for Transaction.commit. features: [T, W] host target features or None."""
        kept = {}
        for s in range(step.forward.n_segments):
            slot = int(step.forward.seq_slots[s])
            if slot not in accepted:
                continue
            chunk = next(c for c in step.cohort.tree if c.slot == slot)
            acc = accepted[slot]
            pages = [*pool.slot_pages(slot), *step.new_pages.get(slot, ())]
            r0, r1 = step.forward.segment_rows(s)
            self.speculator.commit(state, slot, pages, chunk.start, self.trees[slot], acc,
                                   None if features is None else features[r0:r1])
            kept[slot] = len(acc.path)
        return kept

    def add_features(self, step: StepBatch, features) -> None:
        """Hand the target features of committed prompt and AR rows to the drafter (DFlash);
        time the step for the depth policy (decode steps only: a prompt chunk's cost is not a
        verify's)."""
        if self._drafted_at is not None and not step.cohort.prefill:
            self.policy.record_step(step.cohort.n_rows, time.perf_counter() - self._drafted_at)
        self._drafted_at = None
        if features is None:
            return
        f = step.forward
        for s in range(f.n_segments):
            slot = int(f.seq_slots[s])
            if slot >= 0 and slot not in self.trees:
                r0, r1 = f.segment_rows(s)
                self.speculator.add_features(slot, features[r0:r1])

    def forget(self, slot: int, state) -> None:
        """The slot's sequence ended or was reset: drop the drafter's and the tree's leftovers."""
        self.speculator.release(slot)
        self.policy.forget(slot)
        recurrent = getattr(state, "recurrent", None)
        if recurrent is not None and hasattr(recurrent, "drop_tree"):
            recurrent.drop_tree(slot)
