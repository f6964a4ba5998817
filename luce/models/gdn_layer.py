"""The Gated DeltaNet token mixer of qwen35 (llama.cpp src/models/qwen35.cpp
build_layer_attn_linear; transformers Qwen3_5GatedDeltaNet), on any backend.

For rows x [T, hidden] (already RMS-normed):
    qkv = attn_qkv x [T, C]  (C = 2 Hk Dk + Hv Dv)     z = attn_gate x [T, Hv Dv]
    beta = sigmoid(ssm_beta x) [T, Hv]                  g = ssm_a * softplus(ssm_alpha x + ssm_dt.bias)
    per segment: causal conv1d (K taps, state carried per slot) + SiLU -> split q, k, v
                 q, k L2-normed per head (q also / sqrt(Dk)), repeated from Hk key heads to Hv
                 value heads in TILED order (value head j reads key head j % Hk, matching the
                 GGUF's tiled value heads), delta rule with the slot's state
    out = ssm_out (gated_rmsnorm(o, z, ssm_norm) reshaped [T, Hv Dv])   [T, hidden]

The chain from the projections through the output norm and the out projection is one backend
op, luce.ops.api conv_gdn_norm with out_proj (the composition of conv1d_step, gdn_step, the
pointwise ops and the matmul, one launch per op per layer over every segment of the step; CUDA
runs a step of AR rows in two launches and the matmul, bitwise the same): prefill chunks are
cut at absolute multiples of GDN_CHUNK (chunked form, one-token chunks the recurrent step), AR
rows take the recurrent step, both advancing their slot's state in place; tree segments
(speculative verify) run that same step along the tree without advancing the slot's state and
leave what the commit needs (a TreeStage of the step's tree block) in `staged`
(luce.models.commit promotes the accepted path).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from luce.models.layers import blk
from luce.ops.api import TREE_MODES, TreeStage

L2NORM_EPS = 1e-6  # transformers' l2norm (FLA); llama.cpp uses the RMS eps (1e-6 in Qwen3.5)


@dataclass
class GDNWeights:
    """One GDN layer's weights. The input projections qkv, gate, beta, alpha (columns side by
    side [qkv | z | b | a]) go through `merged` instead where the backend multiplies runs of
    them as one (merge(); the separate weights of a merged run are then None)."""

    qkv: Any          # Weight [C, hidden] | None
    gate: Any         # Weight [Hv*Dv, hidden] (z) | None
    beta: Any         # Weight [Hv, hidden] | None
    alpha: Any        # Weight [Hv, hidden] | None
    out: Any          # Weight [hidden, Hv*Dv]
    conv: Any         # [C, K]
    dt_bias: Any      # [Hv]
    ssm_a: Any        # [Hv]  (-exp(A_log))
    norm: Any         # [Dv]
    merged: Any = None  # [Weight] the projections in column order, runs merged (e.g. [qkv, gate|beta|alpha]) | None

    @classmethod
    def load(cls, backend, gguf, il: int) -> "GDNWeights":
        w = lambda name: backend.load_weight(gguf, blk(il, name))  # noqa: E731
        t = lambda name: backend.load_tensor(gguf, blk(il, name))  # noqa: E731
        return cls(qkv=w("attn_qkv.weight"), gate=w("attn_gate.weight"), beta=w("ssm_beta.weight"),
                   alpha=w("ssm_alpha.weight"), out=w("ssm_out.weight"), conv=t("ssm_conv1d.weight"),
                   dt_bias=t("ssm_dt.bias"), ssm_a=t("ssm_a"), norm=t("ssm_norm.weight")).merge(backend)

    def merge(self, backend) -> "GDNWeights":
        """Each longest run of consecutive projections (qkv, gate, beta, alpha) that
        backend.merge_weights takes as one weight becomes that weight (same ggml type and row
        size: [gate | beta | alpha] in the iq4_xs mix, where qkv is Q5_K; all four in q8_0).
        A row of the merged matmul is bitwise the separate matmul's row."""
        ws, out, i = [self.qkv, self.gate, self.beta, self.alpha], [], 0
        while i < len(ws):
            for j in range(len(ws), i + 1, -1):
                m = backend.merge_weights(ws[i:j])
                if m is not None:
                    out.append(m)
                    break
            else:
                out.append(ws[i])
                j = i + 1
            i = j
        if len(out) < len(ws):
            self.merged = out
            self.qkv = self.gate = self.beta = self.alpha = None
        return self


@dataclass(frozen=True)
class GDNDims:
    n_k_heads: int
    n_v_heads: int
    head_dim: int     # Dk = Dv (ssm.state_size)
    conv_kernel: int

    @classmethod
    def of(cls, config) -> "GDNDims":
        return cls(config.ssm_n_k_heads, config.ssm_n_v_heads, config.ssm_state_size,
                   config.ssm_conv_kernel)

    @property
    def key_dim(self) -> int:
        return self.n_k_heads * self.head_dim

    @property
    def value_dim(self) -> int:
        return self.n_v_heads * self.head_dim

    @property
    def conv_channels(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def conv_state_shape(self) -> tuple[int, int]:
        return (self.conv_kernel - 1, self.conv_channels)

    @property
    def gdn_state_shape(self) -> tuple[int, int, int]:
        return (self.n_v_heads, self.head_dim, self.head_dim)


def gdn_projections(w: GDNWeights) -> list:
    """The weights gdn_mixer's input goes through, columns side by side [qkv | z | beta | alpha]:
    w.merged, or the four apart."""
    return w.merged if w.merged is not None else [w.qkv, w.gate, w.beta, w.alpha]


def gdn_mixer(backend, w: GDNWeights, projections, batch, recurrent, il: int, dims: GDNDims, rms_eps: float,
              tree_mode: str = "factor", staged: dict | None = None):
    """Gated DeltaNet layer il over all rows from the normed input's projections through
    gdn_projections(w) (merged ones read in place where the backend fuses) -> [T, hidden].
    Prefill and AR segments read and advance their slot's (il) state in `recurrent`'s pools;
    tree segments read it only and put layer il's TreeStage into `staged` (`tree_mode`
    'factor' | 'baseline', luce.ops.api.TREE_MODES)."""
    if tree_mode not in TREE_MODES:
        raise ValueError(f"GDN tree mode must be one of {TREE_MODES}, got {tree_mode!r}")
    b, d = backend, dims
    conv_pool, gdn_pool = recurrent.pools(il)
    y, tree_part = b.conv_gdn_norm(projections, w.conv, w.dt_bias, w.ssm_a, w.norm, conv_pool, gdn_pool, batch,
                                   d.n_k_heads, L2NORM_EPS, rms_eps, tree_mode, out_proj=w.out)
    if tree_part is not None and staged is not None:   # qkv: the first C columns of the first part
        if "conv_inputs" not in tree_part:
            tree_part = dict(tree_part, conv_inputs=b.stage_tree_rows(projections[0], batch, conv_pool))
        staged[il] = TreeStage(mode=tree_mode, **tree_part)
    return y
