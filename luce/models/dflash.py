"""DFlash block draft model (GGUF arch `dflash`), numerically z-lab's `dflash` package.

A draft pass proposes the tokens after `last` (the newest committed token, whose target
features are not known yet) in one shot:

    block rows    [last, MASK x (n_block - 1)] at positions start .. start + n_block - 1
    context rows  the captured target features of positions 0 .. start - 1

Per layer (Qwen3-style, pre-norm, q/k RMSNorm per head, NEOX rotary at absolute positions):
queries come from the block rows only; keys/values from the context rows and the block
rows. Context rows enter every layer as `ctx = hidden_norm(fc(concat(features)))`: each
layer projects `ctx` with its own attn_k/attn_v (no attn_norm), k_norm, rotary at the row's
position. The block attends bidirectionally on full-attention layers; layers marked in
`sliding_window_pattern` attend causally within the window (the reference makes sliding
layers causal; `dflash.attention.causal` overrides both). Output: the draft's own
`output_norm`, then the TARGET's LM head (token embedding for the block rows is the
target's too). Block row i > 0 predicts the token at position start + i.

Caching (as the reference's DynamicCache + crop): context K/V are written once into the
slot's draft KV pages at KV index = position and kept; block rows are written after them
at start.. but never counted as context, so the next pass's context rows overwrite them.

Two levels of API:
- engine: `inject_context(batch, features, state)` then `forward(batch, state)`, both on
  `ForwardBatch`es (one segment per slot; several slots per call);
- one sequence: `seq = draft.new_sequence(max_len)`, `draft.propose(seq, new_features,
  last_token)` -> logits [n_block - 1, V] (what the tests compare with the reference).
DFlash2 files (convolutions, candidate selector) load as luce.models.dflash2.DFlash2Draft.
"""
from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from luce.gguf.reader import GGUFModel
from luce.models.batch import ForwardBatch, ForwardOutput
from luce.models.dflash_routing import DraftRouting
from luce.models.kv_cache import PAGE_SIZE, ModelState, PagedKV, pages_needed
from luce.models.layers import AttentionWeights, FFNWeights, attend, blk, qk_norm_rope, swiglu_of
from luce.models.loader import register_arch
from luce.models.packer import SegmentSpec, build_batch
from luce.ops import get_backend


@dataclass
class TargetHead:
    """What the draft borrows from its target: `embedding` [V, hidden] and `output` [V, hidden]
    backend Weights (the target's token_embd and its LM head: output.weight, or token_embd
    when tied). The target's output_norm is NOT used: the draft applies its own."""
    embedding: object
    output: object

    @classmethod
    def of(cls, target, backend) -> "TargetHead":
        """From a TargetHead, a luce target model (dense, qwen35: `token_embd` and `output`
        Weights), or a GGUFModel of the target (weights loaded here)."""
        if isinstance(target, TargetHead):
            return target
        if getattr(target, "token_embd", None) is not None:
            out = getattr(target, "output", None)
            return cls(target.token_embd, target.token_embd if out is None else out)
        if hasattr(target, "tensors") and "token_embd.weight" in target.tensors:
            emb = backend.load_weight(target, "token_embd.weight")
            out = backend.load_weight(target, "output.weight") if "output.weight" in target.tensors else emb
            return cls(emb, out)
        raise TypeError(f"cannot take the token embedding and LM head from {type(target).__name__}: "
                        "pass a TargetHead, a target GGUFModel, or a luce model with token_embd / output")


@dataclass
class DraftSequence:
    """One sequence's draft cache for `DFlashDraft.propose`: `n_context` context rows
    (positions 0..n_context-1) are cached in `state` (slot `slot`, KV pages `pages`)."""
    state: ModelState
    slot: int
    pages: list[int]
    n_context: int = 0

    @property
    def capacity(self) -> int:
        return len(self.pages) * PAGE_SIZE

    def truncate(self, n_context: int) -> None:
        """Forget context rows from position n_context on (the target rolled back)."""
        if not 0 <= n_context <= self.n_context:
            raise ValueError(f"cannot truncate a draft context of {self.n_context} rows to {n_context}")
        self.n_context = n_context


@dataclass
class _Layer:
    attn_norm: object          # [hidden]
    attn: AttentionWeights     # wq, wk, wv, wo, q_norm, k_norm
    ffn_norm: object           # [hidden]
    ffn: FFNWeights
    causal: bool
    window: int | None         # sliding window (keys with q_pos - k_pos < window), None = unbounded
    attn_conv: object = None   # DFlash2: luce.models.dflash2.DynamicCausalConv around attention
    ffn_conv: object = None    # DFlash2: the same around the FFN


class DFlashDraft(DraftRouting):
    """The DFlash draft on a backend. Attributes: config (ModelConfig), backend,
    block_size, target_layers (0-based target layers whose outputs, concatenated in this
    order, form a feature row), mask_token_id, feature_width (= len(target_layers) * hidden);
    the matmul routing of luce.models.dflash_routing (prompt_gemm, decode tunes, ...)."""

    dflash2 = False  # True on luce.models.dflash2.DFlash2Draft

    def __init__(self, gguf_model_or_path, target_model, backend="numpy"):
        gguf = gguf_model_or_path
        if isinstance(gguf, (str, os.PathLike)):
            gguf = GGUFModel(gguf)
        cfg = gguf.config
        if cfg.arch != "dflash":
            raise ValueError(f"{gguf.path}: arch {cfg.arch!r} is not a DFlash draft ('dflash')")
        if is_dflash2(gguf) != self.dflash2:
            raise ValueError(f"{gguf.path}: a {'DFlash2' if is_dflash2(gguf) else 'DFlash'} draft; load it with "
                             f"{'DFlash2Draft (luce.models.dflash2)' if is_dflash2(gguf) else 'DFlashDraft'} "
                             "or load_model(path, backend, target_model=...)")
        if cfg.mask_token_id < 0:
            raise ValueError(f"{gguf.path}: no tokenizer.ggml.mask_token_id; a DFlash draft needs it")
        self.gguf, self.config, self.backend = gguf, cfg, get_backend(backend)
        self.block_size, self.mask_token_id = cfg.block_size, cfg.mask_token_id
        self.target_layers = tuple(cfg.target_layers)
        self.feature_width = len(self.target_layers) * cfg.hidden
        self.head = TargetHead.of(target_model, self.backend)
        self.embedding_scale = float(gguf.get("dflash.embedding_scale", 0.0)) or 1.0
        self.logit_scale = float(gguf.get("dflash.logit_scale", 0.0)) or 1.0
        self.softcap = float(gguf.get("dflash.final_logit_softcapping", 0.0))
        self._check_head()
        be = self.backend
        self.fc = be.load_weight(gguf, "fc.weight")
        self.hidden_norm = be.load_tensor(gguf, "enc.output_norm.weight")
        self.output_norm = be.load_tensor(gguf, "output_norm.weight")
        self.layers = [self._load_layer(il) for il in range(cfg.n_layer)]
        self._read_routing()

    def own_weights(self) -> list:
        """The draft's matrices (fc and every layer's projections), not the target's head."""
        out = [self.fc]
        for layer in self.layers:
            out += [layer.attn.wq, layer.attn.wk, layer.attn.wv, layer.attn.wo, *layer.ffn.input_weights,
                    layer.ffn.down]
        return out

    def kv_weights(self) -> list:
        """Every layer's k and v projections (they multiply context rows too)."""
        return [w for layer in self.layers for w in (layer.attn.wk, layer.attn.wv)]

    @classmethod
    def from_gguf(cls, gguf, backend, target_model=None, **_):
        """luce.models.loader entry: load_model(path, backend, target_model=...)."""
        if target_model is None:
            raise ValueError("a DFlash draft needs its target: load_model(path, backend, target_model=target)")
        if is_dflash2(gguf) and not cls.dflash2:
            from luce.models.dflash2 import DFlash2Draft
            return DFlash2Draft(gguf, target_model, backend)
        return cls(gguf, target_model, backend)

    def _check_head(self) -> None:
        emb_shape = tuple(self.head.embedding.shape)
        if emb_shape[-1] != self.config.hidden:
            raise ValueError(f"target embedding width {emb_shape[-1]} != draft hidden {self.config.hidden}: "
                             "this draft was not trained for this target")
        if not 0 <= self.mask_token_id < emb_shape[0]:
            raise ValueError(f"mask token id {self.mask_token_id} outside the target vocabulary ({emb_shape[0]})")

    def _load_layer(self, il: int) -> _Layer:
        be, g, extra = self.backend, self.gguf, self.config.extra
        pattern = extra.get("swa_layers") or [False] * self.config.n_layer
        sliding = bool(extra.get("sliding_window")) and bool(pattern[il])
        # the reference makes sliding layers causal unless the config says otherwise
        causal = bool(extra["causal"]) if "causal" in extra else sliding
        attn = AttentionWeights.load(be, g, il)
        return _Layer(be.load_tensor(g, blk(il, "attn_norm.weight")), attn,
                      be.load_tensor(g, blk(il, "ffn_norm.weight")), FFNWeights.load(be, g, il),
                      causal=causal, window=int(extra["sliding_window"]) if sliding else None)

    # ---- state -------------------------------------------------------------------------------
    def new_state(self, max_pages: int, max_slots: int) -> ModelState:
        """Draft KV pages for every draft layer (separate from the target's KV)."""
        c, zeros = self.config, self.backend.zeros
        kv = {il: PagedKV(max_pages, c.n_head_kv, c.head_dim, zeros=zeros) for il in range(c.n_layer)}
        return ModelState(max_pages=max_pages, max_slots=max_slots, kv=kv, backend=self.backend)

    def new_sequence(self, max_len: int) -> DraftSequence:
        """A one-sequence cache (own state, slot 0) for up to max_len context + block rows."""
        n_pages = max(1, pages_needed(max_len))
        return DraftSequence(self.new_state(n_pages, 1), 0, list(range(n_pages)))

    # ---- engine API ----------------------------------------------------------------------------
    def fuse_features(self, features) -> object:
        """features [T, len(target_layers) * hidden] -> ctx [T, hidden] = hidden_norm(fc(features))."""
        if tuple(features.shape[1:]) != (self.feature_width,):
            raise ValueError(f"target features have shape {tuple(features.shape)}, expected [T, "
                             f"{self.feature_width}] (outputs of target layers {list(self.target_layers)} "
                             "concatenated in that order)")
        be = self.backend
        spans = self.spans(features.shape[0], [self.fc])
        return be.rmsnorm(be.matmul(features, self.fc, prefill_spans=spans), self.hidden_norm, self.config.rms_eps)

    def inject_context(self, batch: ForwardBatch, features, state: ModelState) -> None:
        """Cache the K/V of new context rows. batch: one segment per slot whose rows are the
        new context positions (token_ids unused); features [T, feature_width] in row order."""
        be = self.backend
        ctx = self.fuse_features(be.asarray(np.asarray(features, dtype=np.float32))
                                 if isinstance(features, np.ndarray) else features)
        for il, layer in enumerate(self.layers):
            k, v = self._keys_values(layer, ctx, batch.positions)
            be.kv_write(state.kv[il], batch, k, v)

    def forward(self, batch: ForwardBatch, state: ModelState) -> ForwardOutput:
        """Draft pass over block rows (one segment per slot: [last, MASK, ...] at positions
        start.., the slot's context rows 0..start-1 already injected). Returns the logits of
        batch.logits_indices (normally every block row but the first)."""
        return ForwardOutput(logits=self._logits(self.block_hidden(batch, state)))

    def block_hidden(self, batch: ForwardBatch, state: ModelState):
        """The block pass up to the final norm: [L, hidden] rows of batch.logits_indices."""
        be, eps = self.backend, self.config.rms_eps
        h = be.embedding(self.head.embedding, batch.token_ids)
        if self.embedding_scale != 1.0:
            h = be.mul(h, np.float32(self.embedding_scale))
        for il, layer in enumerate(self.layers):
            x, kernel = be.rmsnorm(h, layer.attn_norm, eps), None
            if layer.attn_conv is not None:
                x, kernel = layer.attn_conv.prepare(be, x, batch)
            o = self._attention(layer, state.kv[il], batch, x)
            h = be.add(h, o if kernel is None else layer.attn_conv.finish(be, o, kernel, batch))
            x = be.rmsnorm(h, layer.ffn_norm, eps)
            if layer.ffn_conv is not None:
                x, kernel = layer.ffn_conv.prepare(be, x, batch)
            o = self._ffn(layer.ffn, x)
            h = be.add(h, o if layer.ffn_conv is None else layer.ffn_conv.finish(be, o, kernel, batch))
        return be.rmsnorm(be.take_rows(h, batch.logits_indices), self.output_norm, eps)

    def _ffn(self, w, x):
        """x [T, hidden] (normed) -> down(silu(gate x) * up x): swiglu_ffn with each matmul's own spans."""
        be, T = self.backend, x.shape[0]
        gate, up = swiglu_of(be, be.matmuls(x, w.input_weights, prefill_spans=self.spans(T, w.input_weights)))
        return be.swiglu_matmul(gate, up, w.down, self.spans(T, [w.down]))

    def _keys_values(self, layer: _Layer, x, positions: np.ndarray):
        """Context rows: x [T, hidden] (fused features, no attn_norm) -> k [T, Hkv, D]
        (k_norm, rotary), v [T, Hkv, D]."""
        be, c, w = self.backend, self.config, layer.attn
        T = x.shape[0]
        k, v = be.matmuls(x, [w.wk, w.wv], prefill_spans=self.spans(T, [w.wk, w.wv]))   # one quantization of x
        k = be.rmsnorm(k.reshape(T, c.n_head_kv, c.head_dim), w.k_norm, c.rms_eps)
        k = be.rope(k, positions, c.rope_dim, c.rope_theta, c.rope_sections)
        return k, v.reshape(T, c.n_head_kv, c.head_dim)

    def _attention(self, layer: _Layer, kv, batch: ForwardBatch, x):
        """Block rows: x [T, hidden] (normed) -> attention output [T, hidden] over context + block KV."""
        be, c, w = self.backend, self.config, layer.attn
        T, D = x.shape[0], c.head_dim
        q, k, v = be.matmuls(x, [w.wq, w.wk, w.wv], prefill_spans=self.spans(T, [w.wq, w.wk, w.wv]))
        q, k, v = q.reshape(T, c.n_head, D), k.reshape(T, c.n_head_kv, D), v.reshape(T, c.n_head_kv, D)
        q, k = qk_norm_rope(be, q, k, batch.positions, c, w.q_norm, w.k_norm)
        scale = 1.0 / float(np.sqrt(D))
        if layer.window is None:
            o = attend(be, q, k, v, kv, batch, scale, causal=layer.causal)
        else:
            be.kv_write(kv, batch, k, v)
            o = _windowed_attention(be, q, kv, batch, scale, layer.causal, layer.window).reshape(T, -1)
        return be.matmul(o, w.wo, prefill_spans=self.spans(T, [w.wo]))

    def _logits(self, h):
        be = self.backend
        logits = be.matmul(h, self.head.output, prefill_spans=self.spans(h.shape[0], [self.head.output]))
        if self.logit_scale != 1.0:
            logits = be.mul(logits, np.float32(self.logit_scale))
        if self.softcap > 0:  # softcap * tanh(x / softcap), tanh(y) = 2 sigmoid(2y) - 1
            s = be.sigmoid(be.mul(logits, np.float32(2.0 / self.softcap)))
            logits = be.add(be.mul(s, np.float32(2.0 * self.softcap)), np.float32(-self.softcap))
        return logits

    # ---- one sequence ---------------------------------------------------------------------------
    def propose(self, seq: DraftSequence, new_features, last_token: int, n_block: int | None = None):
        """Append the target features of positions seq.n_context .. (len(new_features) rows),
        then draft the block [last_token, MASK x (n_block - 1)] that starts right after them.

        new_features [n_new, feature_width] f32 (may be empty when nothing was committed);
        n_block: block length (default block_size; the reference shortens the last block).
        Returns logits [n_block - 1, V] f32 (host array): row i is the draft's distribution
        of the token at position start + 1 + i, start = position of last_token."""
        return self.backend.to_numpy(self._logits(self._block_pass(seq, new_features, last_token, n_block)))

    def _block_pass(self, seq: DraftSequence, new_features, last_token: int, n_block: int | None):
        """propose's work: -> final hidden [n_block - 1, hidden] backend array."""
        n_block = self.block_size if n_block is None else int(n_block)
        if not 2 <= n_block <= max(self.block_size, 2):
            raise ValueError(f"n_block must be in 2..{self.block_size} (block_size), got {n_block}")
        new_features = np.asarray(new_features, dtype=np.float32).reshape(-1, self.feature_width)
        start = seq.n_context + len(new_features)
        if start + n_block > seq.capacity:
            raise ValueError(f"draft sequence holds {seq.capacity} rows; this pass needs {start + n_block}: "
                             "make it with new_sequence(max_len) large enough")
        if start == 0:
            raise ValueError("a draft pass needs at least one context row (the prompt's target features)")
        if len(new_features):
            ctx_batch = build_batch([SegmentSpec(seq.slot, [0] * len(new_features), seq.n_context,
                                                 seq.pages, logits="none")])
            self.inject_context(ctx_batch, new_features, seq.state)
            seq.n_context = start
        block = build_batch([SegmentSpec(seq.slot, self.block_tokens(last_token, n_block), start,
                                         seq.pages, logits="block")])
        return self.block_hidden(block, seq.state)

    def block_tokens(self, last_token: int, n_block: int) -> list[int]:
        """[last_token, MASK x (n_block - 1)]"""
        return [int(last_token)] + [self.mask_token_id] * (n_block - 1)


def is_dflash2(gguf) -> bool:
    """Does the file carry DFlash2's dynamic convolutions and candidate selector?"""
    return "selector_hidden.weight" in gguf.tensors or "blk.0.attn_conv_base" in gguf.tensors


def features_from_captured(captured: dict, target_layers: Sequence[int], backend) -> object:
    """ForwardOutput.captured {layer: [T, hidden]} of the target -> [T, len * hidden] features
    in draft order (backend.concat_cols: they stay on the device)."""
    missing = [il for il in target_layers if il not in captured]
    if missing:
        raise KeyError(f"target step did not capture layers {missing}: set batch.capture_layers "
                       f"to the draft's target_layers {list(target_layers)}")
    return backend.concat_cols([captured[il] for il in target_layers])


def _windowed_attention(be, q, kv, batch: ForwardBatch, scale: float, causal: bool, window: int):
    """Attention of block rows limited to keys with |q_pos - k_pos| < window (and k_pos <=
    q_pos when causal), as the reference's sliding layers. The backend API has no window
    argument yet, so this runs on host arrays through the numpy reference (on a GPU backend:
    q and the pages go to the host and the result comes back)."""
    if "window" in inspect.signature(be.attention).parameters:
        return be.attention(q, kv, batch, scale, causal=causal, window=window)
    from luce.ref.attention import attend_row, gather_kv

    qh = be.to_numpy(q)
    out = np.zeros(qh.shape, dtype=np.float32)
    kv_pos = batch.row_kv_locations()[2]
    for s in range(batch.n_segments):
        if batch.seq_slots[s] < 0:
            continue
        r0, r1 = batch.segment_rows(s)
        k, v = gather_kv(be.to_numpy(kv.k), be.to_numpy(kv.v), batch.segment_pages(s).astype(np.int64),
                         batch.kv_len(s))
        for row in range(r0, r1):
            pos = int(kv_pos[row])
            hi = pos + 1 if causal else min(batch.kv_len(s), pos + window)
            lo = max(0, pos - window + 1)
            out[row] = attend_row(qh[row], k[lo:hi], v[lo:hi], scale).astype(np.float32)
    return be.asarray(out)


register_arch("dflash", DFlashDraft)
