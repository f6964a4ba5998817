"""Tree verify and commit ops of the CUDA backend (DESIGN.md section 3): the device side of
luce.models.gdn_tree's backend hooks, as plain functions of the backend.

Hook them as methods of luce.ops.cuda_backend.CudaBackend (same arguments as the hooks):
    def conv1d_tree(self, x, weight, state, parents):
        return cuda_tree_ops.conv1d_tree(self, x, weight, state, parents)
    def gdn_tree_verify(self, mode, q, k, v, g, beta, parents, state):
        return cuda_tree_ops.gdn_tree_verify(self, mode, q, k, v, g, beta, parents, state)
    def gdn_tree_commit(self, pending, conv_state, gdn_state, path):
        return cuda_tree_ops.gdn_tree_commit(self, pending, conv_state, gdn_state, path)

`backend` is a CudaBackend (its empty / copy / upload / to_numpy / _f32 / _gdn_args /
_upload_i32 / _host_fallback / stream). Arrays are its CudaArrays (host arrays are
uploaded); `parents` are host int arrays [n] of local parents (root -1). Ops never modify
their inputs. Mode 'factor' (exact factor capture) runs on the device (cuda/gdn_tree.cu,
cuda/tree_conv.cu): node outputs and the committed states are bitwise those of the AR
kernels along the same tokens. Modes 'baseline' and 'closed', trees over
LUCE_GDN_TREE_MAX_ROWS rows and head dims the kernels do not take run the references
(luce/ref/gdn_tree.py) on the host, named in backend.host_fallbacks.
"""
from __future__ import annotations

import numpy as np

from luce.ref import gdn_tree as ref_tree

GDN_KEY_DIMS = (64, 128, 256)


def _local_parents(parents, n: int) -> np.ndarray:
    """Validated local parents [n] as int32 (one segment at row 0: global rows = local)."""
    return ref_tree.check_parents(parents, n).astype(np.int32)


def conv1d_tree(backend, x, weight, state, parents):
    """x [n, C], weight [C, K], state [K-1, C] -> y [n, C] f32 (SiLU applied): each node
    convolved over its root path's window (luce.ref.tree_conv.conv_tree)."""
    from luce import _cuda_tree_conv as kc

    x, weight, state = backend._f32(x), backend._f32(weight), backend._f32(state)
    n, C = x.shape
    K = weight.shape[1]
    if weight.shape[0] != C or state.shape != (K - 1, C) or not 2 <= K <= 8:
        raise ValueError(f"conv1d_tree: x {x.shape}, weight {weight.shape}, state {state.shape} "
                         "(weight [C, K] with 2 <= K <= 8, state [K-1, C])")
    _local_parents(parents, n)   # validates the tree
    y = backend.empty((n, C))
    meta, (qo, slot) = backend._upload_i32([0, n], [0])
    tp_ptr = backend._dev(parents, np.int32).ptr   # the step arena's copy when parents is a batch view
    kc.conv_tree(x.ptr, weight.ptr, y.ptr, state.ptr, qo, slot, tp_ptr, 1, C, K, n, True, stream=backend.stream)
    return y


def gdn_tree_verify(backend, mode: str, q, k, v, g, beta, parents, state):
    """q, k [n, Hv, Dk], v [n, Hv, Dv], g, beta [n, Hv], state [Hv, Dk, Dv]
    -> (o [n, Hv, Dv], {'factors': TreeFactors} or {'node_states': ...}) as
    luce.models.gdn_tree.tree_delta_rule; 'factor' keeps device TreeFactors (k, g, beta,
    u CudaArrays, u f32)."""
    from luce import _cuda_gdn_tree as kt

    args, (n, H, dk, dv) = backend._gdn_args(q, k, v, g, beta, state)
    tp = _local_parents(parents, n)
    if mode != "factor" or dk not in GDN_KEY_DIMS or dv % 32 or n > kt.MAX_TREE_ROWS:
        why = (f"mode {mode!r}" if mode != "factor" else
               f"Dk {dk}, Dv {dv}, {n} nodes (kernel: Dk {GDN_KEY_DIMS}, Dv % 32 == 0, <= {kt.MAX_TREE_ROWS} nodes)")
        backend._host_fallback(f"tree gdn verify ({mode})", why)
        return _host_verify(backend, mode, args, tp)
    q, k, v, g, beta, state = args
    out, u = backend.empty((n, H, dv)), backend.empty((n, H, dv))
    k_f, g_f, beta_f = backend.empty((n, H, dk)), backend.empty((n, H)), backend.empty((n, H))
    ws_bytes = kt.verify_workspace_bytes(1, H, dk, dv, n)
    workspace = backend.empty((max(ws_bytes, 4) // 4,))
    meta, (qo, slot) = backend._upload_i32([0, n], [0])
    tp_ptr = backend._dev(parents, np.int32).ptr
    kt.gdn_tree_verify(q.ptr, k.ptr, v.ptr, g.ptr, beta.ptr, state.ptr, out.ptr, u.ptr, qo, slot, tp_ptr,
                       1, 1, H, dk, dv, n, workspace.ptr, ws_bytes, k_f.ptr, g_f.ptr, beta_f.ptr, backend.stream)
    return out, {"factors": ref_tree.TreeFactors(k=k_f, g=g_f, beta=beta_f, u=u)}


def _host_verify(backend, mode: str, args, parents):
    q, k, v, g, beta, state = (backend.to_numpy(a) for a in args)
    if mode == "factor":
        o, factors, _ = ref_tree.gdn_tree_verify(q, k, v, g, beta, parents, state)
        return backend.upload(o), {"factors": factors}
    if mode == "baseline":
        o, states = ref_tree.gdn_tree_verify_baseline(q, k, v, g, beta, parents, state)
        return backend.upload(o), {"node_states": states}
    if mode == "closed":
        o, U = ref_tree.gdn_tree_closed_form(q, k, v, g, beta, parents, state)
        return backend.upload(o), {"factors": ref_tree.TreeFactors(k=k.copy(), g=g.copy(), beta=beta.copy(), u=U)}
    raise ValueError(f"GDN tree mode must be 'factor', 'baseline' or 'closed', got {mode!r}")


def gdn_tree_commit(backend, pending, conv_state, gdn_state, path):
    """Advance one layer's (conv [K-1, C], gdn [Hv, Dk, Dv]) state along the accepted root
    path (node ids, root first) of `pending` (luce.models.gdn_tree.PendingTree) -> new
    (conv, gdn) device arrays; the inputs stay as they were."""
    conv, gdn = backend.copy(backend._f32(conv_state)), backend.copy(backend._f32(gdn_state))
    gdn_tree_commit_into(backend, pending, conv, gdn, path)
    return conv, gdn


def gdn_tree_commit_into(backend, pending, conv_state, gdn_state, path) -> None:
    """gdn_tree_commit writing the new state into conv_state [K-1, C] and gdn_state
    [Hv, Dk, Dv] (device arrays, e.g. a slot's rows of the state pools) in place. `path` may
    be a mirrored host array (a graphed commit's arena): the kernels then read the arena's
    copy. A tree verified on the host (modes 'baseline', 'closed') commits its GDN state
    there (a host fallback, which a graph capture refuses)."""
    from luce import _cuda_gdn_tree as kt
    from luce import _cuda_tree_conv as kc

    parents = ref_tree.check_parents(pending.parents, len(pending.parents))
    ref_tree.check_path(np.asarray(path), parents)
    x = backend._f32(pending.conv_inputs)
    C = x.shape[1]
    if conv_state.shape[1] != C:
        raise ValueError(f"conv commit: conv inputs {x.shape} do not match the state {conv_state.shape}")
    keep, (indptr, slot) = backend._upload_i32([0, len(path)], [0])
    rows = backend._dev(path, np.int32)
    kc.conv_tree_commit(x.ptr, conv_state.ptr, conv_state.ptr, indptr, rows.ptr, slot, slot, 1, C,
                        conv_state.shape[0] + 1, stream=backend.stream)
    factors = pending.factors
    if not (pending.mode == "factor" and factors is not None and not isinstance(factors.u, np.ndarray)):
        backend._host_fallback(f"tree gdn commit ({pending.mode})", "the tree was verified on the host")
        backend.copy_into(gdn_state, _host_commit(backend, pending, gdn_state, path))
        return
    H, dk, dv = gdn_state.shape
    kt.gdn_tree_commit(factors.k.ptr, factors.g.ptr, factors.u.ptr, gdn_state.ptr, indptr, rows.ptr, slot, 1, 1,
                       H, dk, dv, backend.stream)


def _host_commit(backend, pending, gdn_state, path: np.ndarray):
    h0 = backend.to_numpy(gdn_state)
    path = [int(p) for p in path]
    if pending.mode == "baseline":
        return backend.upload(ref_tree.gdn_tree_commit_baseline(pending.node_states, path, pending.parents))
    f = pending.factors
    if pending.mode == "closed":
        return backend.upload(ref_tree.gdn_tree_commit_closed_form(h0, f.k, f.g, f.u, path, pending.parents))
    return backend.upload(ref_tree.gdn_tree_commit(h0, f, path, pending.parents))

