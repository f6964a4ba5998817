"""Draft trees (DESIGN.md section 7): a chain, or a DDTree built best-first from per-depth
top-k draft log-probs.

Node 0 is the root: the slot's newest token, committed to the output but not yet run
through the target (the previous step's bonus token). Every other node is a drafted token
whose parent has a smaller index (insertion order is topological). A node at depth d sits
at absolute position root_position + d; the target's logits at node i predict the token
at position root_position + depth[i] + 1, i.e. the tokens of i's children.

`budget` counts drafted nodes, not the root: a tree of budget B verifies B + 1 rows.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from luce.ref.tree import tree_depths
from luce.spec.proposal import DraftProposal


@dataclass(frozen=True)
class DraftTree:
    tokens: np.ndarray     # [N] int64 token of each node (node 0 = root)
    parents: np.ndarray    # [N] int32 parent node, < own index; -1 for the root
    depths: np.ndarray     # [N] int32 0 for the root
    scores: np.ndarray     # [N] f64 cumulative draft log-prob of the root path (root 0)
    _children: list = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        tokens = np.asarray(self.tokens, dtype=np.int64)
        parents = np.asarray(self.parents, dtype=np.int32)
        depths = np.asarray(self.depths, dtype=np.int32)
        scores = np.asarray(self.scores, dtype=np.float64)
        n = tokens.shape[0]
        if n == 0 or tokens.ndim != 1 or any(a.shape != (n,) for a in (parents, depths, scores)):
            raise ValueError("DraftTree: tokens, parents, depths, scores must be non-empty [N] arrays")
        want = tree_depths(parents)        # the one parent check (luce.ref.tree)
        if not np.array_equal(depths, want):
            i = int(np.argmax(depths != want))
            raise ValueError(f"DraftTree: node {i} has depth {depths[i]}, its root path is {want[i]} deep")
        children: list[list[int]] = [[] for _ in range(n)]
        token_list, parent_list = tokens.tolist(), parents.tolist()
        for i in range(1, n):
            p = parent_list[i]
            if any(token_list[c] == token_list[i] for c in children[p]):
                raise ValueError(f"DraftTree: node {p} has two children with token {token_list[i]}")
            children[p].append(i)
        for name, arr in (("tokens", tokens), ("parents", parents), ("depths", depths), ("scores", scores)):
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)
        object.__setattr__(self, "_children", children)

    # ---- shape -------------------------------------------------------------------------------
    @property
    def n_nodes(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def n_drafted(self) -> int:
        return self.n_nodes - 1

    @property
    def max_depth(self) -> int:
        return int(self.depths.max())

    def children(self, node: int) -> list[int]:
        """Children of `node` in insertion order."""
        return list(self._children[node])

    def child_with_token(self, node: int, token: int) -> int:
        """The child of `node` carrying `token`, or -1."""
        for c in self._children[node]:
            if self.tokens[c] == token:
                return c
        return -1

    def path(self, node: int) -> list[int]:
        """Nodes from the root to `node`, both included."""
        out = []
        while node >= 0:
            out.append(node)
            node = int(self.parents[node])
        return out[::-1]

    def positions(self, root_position: int) -> np.ndarray:
        """[N] int32 absolute position of every node: root_position + depth."""
        return (root_position + self.depths).astype(np.int32)

    def ancestor_mask(self) -> np.ndarray:
        """[N, N] bool: mask[i, j] is True when j is i or one of i's ancestors (the tree
        rows node i attends to, besides the committed prefix)."""
        n = self.n_nodes
        mask = np.zeros((n, n), dtype=bool)
        for i in range(n):
            p = int(self.parents[i])
            if p >= 0:
                mask[i] = mask[p]
            mask[i, i] = True
        return mask

    def depth_first_order(self) -> list[int]:
        """Nodes in depth-first pre-order (children in insertion order): the order a tree
        walk with a running state visits them."""
        order, stack = [], [0]
        while stack:
            node = stack.pop()
            order.append(node)
            stack.extend(reversed(self._children[node]))
        return order


def root_only(root_token: int) -> DraftTree:
    """A tree with nothing drafted: verifying it is one AR step."""
    return DraftTree(np.array([root_token]), np.array([-1]), np.array([0]), np.array([0.0]))


def chain_tree(root_token: int, proposal: DraftProposal, max_depth: int | None = None) -> DraftTree:
    """The top-1 chain of `proposal` (at most max_depth drafted tokens)."""
    n = proposal.depth if max_depth is None else min(proposal.depth, max_depth)
    if n < 0:
        raise ValueError(f"chain_tree: max_depth must be >= 0, got {max_depth}")
    scores = np.concatenate([[0.0], np.cumsum(proposal.logprobs[:n, 0].astype(np.float64))])
    return DraftTree(np.concatenate([[root_token], proposal.ids[:n, 0]]), np.arange(-1, n),
                     np.arange(n + 1), scores)


def ddtree(root_token: int, proposal: DraftProposal, budget: int, top_k: int = 4,
           tau: float | None = 6.0) -> DraftTree:
    """DDTree: up to `budget` drafted nodes chosen best-first by cumulative draft log-prob.

    The score of a path is the sum of its tokens' per-depth draft log-probs (the drafter's
    depths are treated as independent, as a block draft gives them). The full top-1 chain
    is seeded first (cut at `budget`); then the best remaining candidate is added until the
    budget is spent, a candidate being the next-ranked sibling of a tree node or the best
    child of one. At most `top_k` siblings per parent. A candidate scoring more than `tau`
    below the top-1 chain at its depth is pruned with everything ranked after it (tau None:
    no pruning). Ties go to the candidate found first."""
    if budget < 0 or top_k < 1:
        raise ValueError(f"ddtree: need budget >= 0 and top_k >= 1, got budget={budget}, top_k={top_k}")
    if tau is not None and tau < 0:
        raise ValueError(f"ddtree: tau must be >= 0 (log-prob units) or None, got {tau}")
    depth_limit = proposal.depth
    k = min(top_k, proposal.top_k)
    lps = proposal.logprobs.astype(np.float64)
    chain = chain_tree(root_token, proposal, min(depth_limit, budget))
    best_at_depth = np.concatenate([[0.0], np.cumsum(lps[:depth_limit, 0])]).tolist()  # [D + 1]
    # Python numbers from here (the same float64 sums): this runs on a verify step's host path
    lp, ids = lps.tolist(), proposal.ids.tolist()

    tokens, parents, depths, scores = (a.tolist() for a in (chain.tokens, chain.parents, chain.depths, chain.scores))
    heap: list[tuple[float, int, int, int, int]] = []  # (-score, order, parent, depth, rank)
    counter = 0

    def push(parent: int, depth: int, rank: int) -> None:
        nonlocal counter
        if depth > depth_limit or rank >= k or not math.isfinite(lp[depth - 1][rank]):
            return
        score = scores[parent] + lp[depth - 1][rank]
        if tau is not None and score < best_at_depth[depth] - tau:
            return  # later siblings and all descendants score lower still
        heapq.heappush(heap, (-score, counter, parent, depth, rank))
        counter += 1

    for node in range(1, len(tokens)):
        push(parents[node], depths[node], 1)          # the chain nodes' runner-up siblings

    while heap and len(tokens) - 1 < budget:
        neg_score, _, parent, depth, rank = heapq.heappop(heap)
        node = len(tokens)
        tokens.append(ids[depth - 1][rank])
        parents.append(parent)
        depths.append(depth)
        scores.append(-neg_score)
        push(parent, depth, rank + 1)
        push(node, depth + 1, 0)
    return DraftTree(np.array(tokens), np.array(parents), np.array(depths), np.array(scores))
