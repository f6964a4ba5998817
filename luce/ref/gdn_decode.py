"""Reference of a Gated DeltaNet layer's chain from its projections to the output norm
(cuda/gdn_decode.cu for AR rows; luce.ops.api conv_gdn_norm): the composition of the
conv1d, pointwise, gdn_recurrent and gated_rmsnorm references, which is all the kernel may
compute. gdn_tree_inputs: what luce_gdn_tree_prepare computes for the rows of a draft tree.

Given a workspace, the kernel also quantizes normed for the out projection (cuda/matmul_x.cuh);
that quantization is the matmul's own, so its reference is luce.ref.matmul on normed."""
from __future__ import annotations

import numpy as np

from luce.ref.conv1d import causal_conv1d
from luce.ref.gated_rmsnorm import gated_rmsnorm
from luce.ref.gdn_recurrent import gdn_recurrent
from luce.ref.pointwise import add, l2norm, mul, sigmoid, softplus
from luce.ref.tree_conv import conv_tree


def gdn_decode(qkv: np.ndarray, z: np.ndarray, b: np.ndarray, a: np.ndarray, conv_weight: np.ndarray,
               dt_bias: np.ndarray, ssm_a: np.ndarray, norm: np.ndarray, conv_state: np.ndarray,
               gdn_state: np.ndarray, n_k_heads: int, l2_eps: float, rms_eps: float):
    """The rows of one sequence: qkv [T, C] (C = 2 Hk Dk + Hv Dv, columns q | k | v), z
    [T, Hv*Dv], b, a [T, Hv], conv_weight [C, K], dt_bias, ssm_a [Hv], norm [Dv], conv_state
    [K-1, C], gdn_state [Hv, Dk, Dv] -> (normed [T, Hv, Dv], new conv_state, new gdn_state).
    q, k are L2-normed per key head (q then times f32 1/sqrt(Dk)) and value head j reads key
    head j % Hk."""
    T = qkv.shape[0]
    Hv, dk, dv = gdn_state.shape
    mixed, new_conv = causal_conv1d(qkv, conv_weight, conv_state)
    q, k, v, g, beta = _heads_and_gates(mixed, b, a, dt_bias, ssm_a, n_k_heads, Hv, dk, l2_eps)
    o, new_state = gdn_recurrent(q, k, v, g, beta, gdn_state)
    return gated_rmsnorm(o, z.reshape(T, Hv, dv), norm, rms_eps), new_conv, new_state


def gdn_tree_inputs(qkv: np.ndarray, b: np.ndarray, a: np.ndarray, conv_weight: np.ndarray, dt_bias: np.ndarray,
                    ssm_a: np.ndarray, conv_state: np.ndarray, parents, n_k_heads: int, n_v_heads: int, dk: int,
                    l2_eps: float):
    """The rows of one draft tree: qkv [N, C], b, a [N, Hv], parents [N] (-1 at the root, else an
    earlier row), conv_state [K-1, C] (read only) -> q, k [N, Hv, Dk], v [N, Hv, Dv], g, beta
    [N, Hv]: each row conv1d'ed over its own root path (conv_tree), then gdn_decode's norms and
    gates."""
    mixed = conv_tree(qkv, conv_weight, conv_state, parents)
    return _heads_and_gates(mixed, b, a, dt_bias, ssm_a, n_k_heads, n_v_heads, dk, l2_eps)


def _heads_and_gates(mixed, b, a, dt_bias, ssm_a, n_k_heads: int, Hv: int, dk: int, l2_eps: float):
    """Conv output [T, C] -> q, k (L2-normed per key head, q times f32 1/sqrt(Dk), tiled to the
    value heads), v [T, Hv, Dv], g = softplus(a + dt_bias) * ssm_a, beta = sigmoid(b)."""
    T, key_dim = mixed.shape[0], n_k_heads * dk
    tiled = np.arange(Hv) % n_k_heads
    q = mul(l2norm(mixed[:, :key_dim].reshape(T, n_k_heads, dk), l2_eps), np.float32(1.0 / np.sqrt(dk)))[:, tiled]
    k = l2norm(mixed[:, key_dim:2 * key_dim].reshape(T, n_k_heads, dk), l2_eps)[:, tiled]
    v = mixed[:, 2 * key_dim:].reshape(T, Hv, -1)
    return q, k, v, mul(softplus(add(a, dt_bias)), ssm_a), sigmoid(b)
