"""Scratch memory of one tree-verify step, from its allocation plan (DESIGN.md section 3).

Per verified tree of N rows (budget + 1: the root and the drafted nodes), the buffers a
verify step allocates and keeps until commit, by mode:

- common: scratch KV rows of every attention layer (N rows, f16 K and V), and the tree
  rows' captured target features (DFlash drafts only);
- `factor` (factor capture, `--spec specla`): per GDN layer and node the conv input row
  [C] (commit gathers the window along the path) and the factors k [Hk, Dk] (the key
  heads; value heads read them tiled), g [Hv], beta [Hv], u [Hv, Dv], f32; plus the
  branch-point state saves of the depth-first walk, transient per layer and so allocated
  once: at most floor(log2 N) states (children visited smallest subtree first);
- `baseline` (per-node stored states, as Luce DFlash): per GDN layer and node the conv
  window [K-1, C] and the full state [Hv, Dk, Dv], f32.

Activations of the step itself (hidden rows, logits) are the same in both modes and not
counted. All sizes in bytes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

F32 = 4
F16 = 2


@dataclass(frozen=True)
class VerifyShape:
    """The model dimensions the plan depends on."""

    n_gdn_layers: int
    n_attn_layers: int
    gdn_k_heads: int
    gdn_v_heads: int
    gdn_head_dim: int        # Dk = Dv
    conv_kernel: int
    n_kv_heads: int
    attn_head_dim: int
    hidden: int
    n_feature_layers: int = 0  # DFlash captured target layers (0: no features kept)

    @property
    def conv_channels(self) -> int:
        return (2 * self.gdn_k_heads + self.gdn_v_heads) * self.gdn_head_dim

    @property
    def gdn_state_bytes(self) -> int:
        return self.gdn_v_heads * self.gdn_head_dim * self.gdn_head_dim * F32

    @classmethod
    def of_config(cls, config, n_feature_layers: int = 0) -> "VerifyShape":
        """From a luce.gguf.config.ModelConfig (qwen35, or dense with no GDN layers)."""
        gdn = list(getattr(config, "gdn_layers", ()) or ())
        attn = list(getattr(config, "full_attention_layers", ()) or range(config.n_layer))
        return cls(len(gdn), len(attn), config.ssm_n_k_heads if gdn else 0, config.ssm_n_v_heads if gdn else 0,
                   config.ssm_state_size if gdn else 0, config.ssm_conv_kernel if gdn else 0,
                   config.n_head_kv, config.head_dim, config.hidden, n_feature_layers)


# Qwen3.5/3.6 27B (MODELS.md) with its 5-layer DFlash draft
QWEN35_27B = VerifyShape(n_gdn_layers=48, n_attn_layers=16, gdn_k_heads=16, gdn_v_heads=48,
                         gdn_head_dim=128, conv_kernel=4, n_kv_heads=4, attn_head_dim=256,
                         hidden=5120, n_feature_layers=5)


def max_saved_states(n_rows: int) -> int:
    """Upper bound of branch-point saves alive at once in the exact walk: floor(log2 N)."""
    return int(math.floor(math.log2(n_rows))) if n_rows > 1 else 0


def verify_scratch_plan(shape: VerifyShape, n_rows: int, mode: str) -> dict[str, int]:
    """{buffer name: bytes} of one tree verify of n_rows rows. mode: 'factor' | 'baseline'."""
    if mode not in ("factor", "baseline"):
        raise ValueError(f"verify_scratch_plan: mode must be 'factor' or 'baseline', got {mode!r}")
    if n_rows < 1:
        raise ValueError(f"a tree has at least its root row, got n_rows={n_rows}")
    s, n, L = shape, n_rows, shape.n_gdn_layers
    plan = {
        "scratch KV rows (f16)": n * s.n_attn_layers * 2 * s.n_kv_heads * s.attn_head_dim * F16,
        "target features": n * s.n_feature_layers * s.hidden * F32,
    }
    if mode == "factor":
        hk, hv, d = s.gdn_k_heads, s.gdn_v_heads, s.gdn_head_dim
        plan["conv input rows"] = L * n * s.conv_channels * F32
        plan["GDN factors k, g, beta, u"] = L * n * (hk * d + 2 * hv + hv * d) * F32
        plan["branch-point state saves"] = (max_saved_states(n) * s.gdn_state_bytes) if L else 0
    else:
        plan["per-node conv windows"] = L * n * (s.conv_kernel - 1) * s.conv_channels * F32
        plan["per-node GDN states"] = L * n * s.gdn_state_bytes
    return plan


def peak_scratch_bytes(shape: VerifyShape, n_rows: int, mode: str) -> int:
    """Total of verify_scratch_plan: everything is alive from verify to commit."""
    return sum(verify_scratch_plan(shape, n_rows, mode).values())


def format_plan_table(shape: VerifyShape, budgets=(22, 64)) -> str:
    """A markdown table: peak verify scratch per mode and budget (MiB)."""
    mib = 1 << 20
    lines = ["| budget (rows) | factor capture | baseline (per-node states) | ratio |",
             "|---|---|---|---|"]
    for b in budgets:
        f = peak_scratch_bytes(shape, b + 1, "factor")
        base = peak_scratch_bytes(shape, b + 1, "baseline")
        lines.append(f"| {b} ({b + 1}) | {f / mib:.1f} MiB | {base / mib:.1f} MiB | {base / f:.1f}x |")
    return "\n".join(lines)
