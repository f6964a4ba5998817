"""The speculation step logic an engine calls, independent of its scheduler:

1. `draft_trees(lanes)`: one batched drafter call for the lanes that may speculate, then
   a tree per lane (chain or DDTree by mode); a lane whose draft is empty gets no tree and
   decodes as an AR row;
2. the engine packs the trees as tree rows (luce.spec.batching) beside its prefill and AR
   rows and runs the target once;
3. `accept(...)`: lossless acceptance of one lane's verified tree (luce.spec.acceptance);
4. `commit(...)`: the accepted path into the target's state (luce.models.tree_rows) and
   its target features kept for the DFlash drafter; statistics recorded.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from luce.spec.acceptance import Acceptance, accept_greedy, accept_sampled
from luce.spec.config import SpecConfig
from luce.spec.drafters.base import DraftLane
from luce.spec.stats import SpecStats
from luce.spec.tree import DraftTree, chain_tree, ddtree


class Speculator:
    def __init__(self, config: SpecConfig, target, drafter, graphs: bool = True):
        """graphs: commit accepted paths through captured graphs (luce.models.graphed_commit)
        on backends that have them."""
        from luce.models.graphed_commit import GraphedCommit

        if not config.enabled or drafter is None:
            raise ValueError("Speculator needs an enabled SpecConfig and a drafter")
        self.config, self.target, self.drafter = config, target, drafter
        self.committer = GraphedCommit(target.backend, enabled=graphs)
        if hasattr(target, "gdn_tree_mode"):
            target.gdn_tree_mode = config.gdn_tree_mode
        self.hybrid = bool(getattr(target.config, "gdn_layers", ()))
        # attention-only targets verify chains as ordinary causal segments (no tree support needed)
        self.chains_as_segments = not self.hybrid and not getattr(target.backend, "supports_tree_rows", False)
        self.feature_layers = tuple(getattr(drafter, "feature_layers", ()))
        self.max_depth = drafter.max_depth if getattr(drafter, "max_depth", None) else config.chain_depth
        self.stats = SpecStats()
        self._features: dict[int, list[np.ndarray]] = {}

    # ---- drafting ---------------------------------------------------------------------------
    def max_nodes(self) -> int:
        """Rows a tree may take (root included): what the engine reserves scratch for."""
        return 1 + (self.config.ddtree_budget if self.config.uses_tree else self.max_depth)

    def add_features(self, slot: int, features) -> None:
        """Target features [n, W] of newly committed positions of `slot` (in order)."""
        if self.feature_layers and len(features):
            self._features.setdefault(slot, []).append(np.asarray(features, dtype=np.float32))

    def release(self, slot: int) -> None:
        """The slot's sequence ended: forget its features and the drafter's state."""
        self._features.pop(slot, None)
        self.drafter.release(slot)

    def draft_trees(self, lanes: Sequence[tuple[int, Sequence[int], int]]) -> dict[int, DraftTree]:
        """lanes: (slot, tokens ending with the root, max drafted depth) -> {slot: tree}
        for the lanes that got at least one drafted node."""
        lanes = [(s, t, min(d, self.max_depth)) for s, t, d in lanes]
        want = [DraftLane(s, t, d, self.config.spec_top_k, features=self._take_features(s))
                for s, t, d in lanes if d > 0]
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

    def _take_features(self, slot: int):
        parts = self._features.pop(slot, None)
        if not parts:
            return None
        return np.concatenate(parts)

    # ---- verify results ----------------------------------------------------------------------
    def accept(self, tree: DraftTree, logits, params, seed: int, root_position: int, prompt_ids,
               output_ids, max_tokens: int, stop_ids=frozenset(), target_choice=None) -> Acceptance:
        """Acceptance of one verified tree; logits [N, V] host rows of its nodes. Without
        penalties the target's token at every node depends only on its row and position, so
        target_choice [N] (argmax, or the seeded draw at each node's position, e.g. drawn on
        the device) may replace the logits. Stops at max_tokens emitted tokens and after the
        first token in `stop_ids`."""
        if target_choice is not None and not params.has_penalties:
            acc = accept_greedy(tree, np.asarray(target_choice), max_tokens)
        elif params.greedy and not params.has_penalties:
            acc = accept_greedy(tree, np.argmax(np.asarray(logits), axis=1), max_tokens)
        else:
            logits = np.asarray(logits)
            acc = accept_sampled(tree, logits, params, seed, root_position, prompt_ids, output_ids, max_tokens)
        for i, t in enumerate(acc.tokens):
            if t in stop_ids:
                return acc.truncated(i + 1)
        return acc

    def commit(self, state, slot: int, pages, start: int, tree: DraftTree, acc: Acceptance,
               features=None) -> None:
        """Commit `acc.path` of `tree` (verified over `start` committed tokens) into the
        target state; features [N, W] of the tree rows (DFlash) are kept along the path."""
        self.committer(state, slot, pages, start, acc.path)
        if features is not None:
            self.add_features(slot, np.asarray(features)[list(acc.path)])
        self.stats.record(tree.n_nodes, acc.n_accepted, len(acc.tokens))
