"""Gated DeltaNet layers on tree rows: verify without touching the slot's state, then
commit the accepted path (DESIGN.md section 3; maths in luce/ref/gdn_tree.py and
luce/ref/tree_conv.py).

Verify of one tree segment in one layer: the conv runs each node over its root path's
window; the delta rule runs per `mode`:
- 'factor' (exact factor capture, the default): the AR step along a depth-first walk,
  keeping per-node factors (k, g, beta, u);
- 'baseline' (per-node stored states, as Luce DFlash): every node's state is kept;
- 'closed' (closed form, optional fast mode, not bitwise equal to AR).
What commit needs is kept as a `PendingTree` per (layer, slot) in the recurrent store;
the slot's conv and GDN state stay as they were until `commit_layer` advances them along
the accepted path ('factor': replaying the factors with the AR step's own update).

A backend may provide these as device ops (`conv1d_tree`, `gdn_tree_verify`,
`gdn_tree_commit`, same arguments as the references); otherwise they run on host arrays
through the references.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from luce.ref import gdn_tree as ref_tree
from luce.ref import tree_conv as ref_conv

TREE_MODES = ("factor", "baseline", "closed")


@dataclass
class PendingTree:
    """What one tree segment's verify left for commit in one GDN layer."""

    parents: np.ndarray        # [n] int64 local parents (root -1)
    conv_inputs: Any           # [n, C] f32 the nodes' conv inputs (qkv rows)
    mode: str                  # one of TREE_MODES
    factors: Any = None        # 'factor', 'closed': luce.ref.gdn_tree.TreeFactors
    node_states: Any = None    # 'baseline': [n, Hv, Dk, Dv] f32


def _host(backend, x) -> np.ndarray:
    return np.asarray(backend.to_numpy(x))


def tree_conv(backend, x, weight, state, parents):
    """x [n, C], weight [C, K], state [K-1, C] -> y [n, C] (SiLU applied), per node over
    its root path."""
    op = getattr(backend, "conv1d_tree", None)
    if op is not None:
        return op(x, weight, state, parents)
    return backend.asarray(ref_conv.conv_tree(_host(backend, x), _host(backend, weight),
                                              _host(backend, state), parents))


def tree_delta_rule(backend, mode: str, q, k, v, g, beta, parents, state):
    """q, k [n, Hv, Dk], v [n, Hv, Dv], g, beta [n, Hv], state [Hv, Dk, Dv]
    -> (o [n, Hv, Dv] backend array, PendingTree fields {factors | node_states})."""
    if mode not in TREE_MODES:
        raise ValueError(f"GDN tree mode must be one of {TREE_MODES}, got {mode!r}")
    op = getattr(backend, "gdn_tree_verify", None)
    if op is not None:
        return op(mode, q, k, v, g, beta, parents, state)
    args = [_host(backend, a) for a in (q, k, v, g, beta)]
    h0 = _host(backend, state)
    if mode == "factor":
        o, factors, _ = ref_tree.gdn_tree_verify(*args, parents, h0)
        return backend.asarray(o), {"factors": factors}
    if mode == "baseline":
        o, states = ref_tree.gdn_tree_verify_baseline(*args, parents, h0)
        return backend.asarray(o), {"node_states": states}
    o, U = ref_tree.gdn_tree_closed_form(*args, parents, h0)
    factors = ref_tree.TreeFactors(k=args[1].copy(), g=args[3].copy(), beta=args[4].copy(), u=U)
    return backend.asarray(o), {"factors": factors}


def commit_layer(backend, pending: PendingTree, conv_state, gdn_state, path):
    """Advance one layer's (conv, gdn) state of a slot along the accepted path -> new
    (conv [K-1, C], gdn [Hv, Dk, Dv]) backend arrays."""
    op = getattr(backend, "gdn_tree_commit", None)
    if op is not None:
        return op(pending, conv_state, gdn_state, path)
    conv = ref_conv.conv_tree_commit(_host(backend, pending.conv_inputs), _host(backend, conv_state),
                                     path, pending.parents)
    h0 = _host(backend, gdn_state)
    if pending.mode == "factor":
        gdn = ref_tree.gdn_tree_commit(h0, pending.factors, path, pending.parents)
    elif pending.mode == "baseline":
        gdn = ref_tree.gdn_tree_commit_baseline(pending.node_states, path, pending.parents)
    else:
        f = pending.factors
        gdn = ref_tree.gdn_tree_commit_closed_form(h0, f.k, f.g, f.u, path, pending.parents)
    return backend.asarray(conv), backend.asarray(gdn)
