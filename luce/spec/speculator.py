"""The speculation step logic an engine calls, independent of its scheduler:

1. `draft_trees(lanes)`: one batched drafter call for the lanes that may speculate, then
   a tree per lane (chain or DDTree by mode); a lane whose draft is empty gets no tree and
   decodes as an AR row. Drafters write only draft state a rejected step may drop;
2. the engine packs the trees as tree rows beside its prefill and AR rows, runs the target
   once and accepts each tree (luce.spec.acceptance: pure);
3. at commit, `add_context(...)` hands the drafter the target features of the committed
   rows (DFlash; device arrays from capture to the draft pass) and `record(...)` counts.
"""
from __future__ import annotations

from typing import Sequence

from luce.spec.config import SpecConfig
from luce.spec.drafters.base import DraftLane
from luce.spec.stats import SpecStats
from luce.spec.tree import DraftTree, chain_tree, ddtree


class Speculator:
    def __init__(self, config: SpecConfig, target, drafter):
        if not config.enabled or drafter is None:
            raise ValueError("Speculator needs an enabled SpecConfig and a drafter")
        self.config, self.target, self.drafter = config, target, drafter
        if hasattr(target, "gdn_tree_mode"):
            target.gdn_tree_mode = config.gdn_tree_mode
        self.feature_layers = tuple(getattr(drafter, "feature_layers", ()))
        self.max_depth = drafter.max_depth if getattr(drafter, "max_depth", None) else config.chain_depth
        self.stats = SpecStats()

    # ---- drafting ---------------------------------------------------------------------------
    def max_nodes(self) -> int:
        """Rows a tree may take (root included): what the engine reserves scratch for."""
        return 1 + (self.config.ddtree_budget if self.config.uses_tree else self.max_depth)

    def release(self, slot: int) -> None:
        """The slot's sequence ended: forget the drafter's state of it."""
        self.drafter.release(slot)

    def prefill(self, lanes: Sequence[tuple[int, Sequence[int]]]) -> None:
        """(slot, prompt) of prompts completed this step, to a drafter that keeps per-sequence
        model state (luce.spec.drafters.base: `prefill`); the others catch up when they draft."""
        prefill = getattr(self.drafter, "prefill", None)
        if prefill is None or not lanes:
            return
        try:       # after the commit nothing may fail: a drafter that could not catch up starts over
            prefill(lanes)
        except Exception:
            for slot, _ in lanes:
                self.drafter.release(slot)

    def draft_trees(self, lanes: Sequence[tuple[int, Sequence[int], int]]) -> dict[int, DraftTree]:
        """lanes: (slot, tokens ending with the root, max drafted depth) -> {slot: tree}
        for the lanes that got at least one drafted node."""
        lanes = [(s, t, min(d, self.max_depth)) for s, t, d in lanes]
        want = [DraftLane(s, t, d, self.config.spec_top_k) for s, t, d in lanes if d > 0]
        proposals = self.drafter.propose(want) if want else []
        trees = {}
        for lane, prop in zip(want, proposals):
            root = int(lane.tokens[-1])
            if self.config.uses_tree:
                tree = ddtree(root, prop, self.config.ddtree_budget, self.config.spec_top_k, self.config.ddtree_tau)
            else:
                tree = chain_tree(root, prop, lane.depth)
            if tree.n_drafted:
                trees[lane.slot] = tree
        return trees

    # ---- commit ------------------------------------------------------------------------------
    def add_context(self, captured: dict, rows, segments: Sequence[tuple[int, int, int]]) -> None:
        """Committed rows' target features to the drafter (DFlash), on the device: captured
        {layer: [T, hidden]} of the step, rows [N] int the committed rows in order, segments
        (slot, first position, count) splitting them."""
        if not self.feature_layers or not len(rows):
            return
        backend = self.target.backend
        features = backend.concat_cols([backend.take_rows(captured[il], rows) for il in self.feature_layers])
        self.drafter.add_context(segments, features)

    def check_context(self, segments: Sequence[tuple[int, int, int]]) -> None:
        """ValueError (nothing changed) unless add_context can take these segments."""
        check = getattr(self.drafter, "check_context", None)
        if self.feature_layers and check is not None:
            check(segments)

    def record(self, tree: DraftTree, n_accepted: int, n_emitted: int) -> None:
        self.stats.record(tree.n_nodes, n_accepted, n_emitted)
