"""Lossless acceptance of a verified draft tree (DESIGN.md section 2 step 6).

Walk from the root: at node i the target picks the token at position
root_position + depth[i] + 1 exactly as plain decoding would (`choose`: the caller's
sampler, e.g. the engine's: argmax with the lowest id on ties, or the (seed, position) draw
with the penalties of the tokens emitted so far). If a child of i carries that token,
descend into it (a draft accepted); otherwise that token is the bonus and the walk ends.
The emitted tokens are therefore exactly those plain decoding emits, and every verify emits
at least one token (a tree whose every draft is wrong still yields the target's own next
token). Acceptance is pure: it reads the target's choices and changes nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from luce.spec.tree import DraftTree


@dataclass(frozen=True)
class Acceptance:
    """The outcome of one verify. `path` are the tree nodes whose rows are committed (root
    first); `tokens` the emitted tokens (accepted drafts, then the bonus). Always
    len(path) == len(tokens) >= 1: committing the root and the accepted drafts, the bonus
    becomes the next root."""

    path: tuple[int, ...]
    tokens: tuple[int, ...]

    @property
    def n_accepted(self) -> int:
        """Drafted tokens accepted (emitted tokens minus the bonus)."""
        return len(self.tokens) - 1

    @property
    def bonus(self) -> int:
        return self.tokens[-1]

    def truncated(self, n_tokens: int) -> "Acceptance":
        """Keep the first n_tokens emitted tokens (a stop token or max_tokens inside the
        accepted run); the commit shrinks with them, so the last kept token is the next root."""
        if not 1 <= n_tokens:
            raise ValueError(f"an acceptance keeps at least one token, asked for {n_tokens}")
        return Acceptance(self.path[:n_tokens], self.tokens[:n_tokens])


def accept(tree: DraftTree, choose: Callable[[int, Sequence[int]], int],
           max_tokens: int | None = None) -> Acceptance:
    """Generic walk: `choose(node, emitted_so_far)` returns the target's token after `node`
    (only called on nodes the walk reaches). Stops after max_tokens emitted tokens."""
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    node, path, tokens = 0, [0], []
    while True:
        token = int(choose(node, tokens))
        tokens.append(token)
        child = tree.child_with_token(node, token)
        if child < 0 or (max_tokens is not None and len(tokens) >= max_tokens):
            return Acceptance(tuple(path), tuple(tokens))
        node = child
        path.append(node)


def accept_greedy(tree: DraftTree, target_argmax: np.ndarray, max_tokens: int | None = None) -> Acceptance:
    """Greedy acceptance: target_argmax [N] int, the target's argmax at every node (ties to
    the lowest id, as `backend.argmax`)."""
    target_argmax = np.asarray(target_argmax)
    if target_argmax.shape != (tree.n_nodes,):
        raise ValueError(f"accept_greedy: need one argmax per tree node ({tree.n_nodes}), got {target_argmax.shape}")
    return accept(tree, lambda node, _: int(target_argmax[node]), max_tokens)
