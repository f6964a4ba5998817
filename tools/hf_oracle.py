#!/usr/bin/env python3
"""Transformers oracle for the qwen35 hybrid model: reference logits of tiny random
`Qwen3_5ForCausalLM` models, saved as small .npz fixtures for tests/models/test_qwen35.py.

Each named config (CONFIGS) is a transformers text config plus a seed. The weights come
from `luce.testing.hf_convert.random_qwen35_state_dict(config, seed)` (numpy), so a test
rebuilds the very same model as a GGUF without torch and without a committed .gguf.

Per config the fixture holds (V = vocab, H = hidden, N = N_TOKENS):
  config_json, seed, tokens [N] int32
  prefill_logits [N, V] f32      one forward over all N tokens (N = 129 crosses two GDN chunk
                                 boundaries; rows 0..T-1 are the references for prefill T)
  prefix_lens [P] int32, prefix_last_logits [P, V] f32
                                 separate forwards of the first T tokens (T = 63, 64, 65), last row
  incr_prompt_len, incr_logits [STEPS, V] f32
                                 prefill tokens[:incr_prompt_len] with a cache, then STEPS cached
                                 single-token steps feeding the next tokens (transformers' decode path)
  capture_layers [C] int32, captured [C, N, H] f32
                                 outputs of those decoder layers (before the final norm)
  versions (torch / transformers)

Usage: python3 tools/hf_oracle.py [--out tests/fixtures/qwen35] [--gguf DIR] [NAME ...]
Needs torch and transformers (oracle only; luce itself never imports them).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from luce.testing.hf_convert import hf_layer_types, random_qwen35_state_dict  # noqa: E402
from luce.testing.oracle_cli import captured_layer_outputs, fixture_main  # noqa: E402

N_TOKENS = 129
PREFIX_LENS = (63, 64, 65)
INCR_PROMPT_LEN = 20
INCR_STEPS = 8


def _rope(theta: float, factor: float, sections: list[int]) -> dict:
    return {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": factor,
            "mrope_section": sections, "mrope_interleaved": True}


# Tiny configs: each varies head counts, layer pattern, hidden size and rotary width.
CONFIGS: dict[str, dict] = {
    # 1 full-attention layer (il 3 of 4), GQA 4/2, GDN value heads 2x key heads, rope 8 of 32
    "v_heads_2x": {"seed": 11, "capture_layers": [1, 3], "hf": dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
        full_attention_interval=4, rope_parameters=_rope(10000.0, 0.25, [2, 1, 1]))},
    # 2 full-attention layers (il 3, 7), odd hidden 45, MQA 3/1, value heads 3x, eps 1e-5
    "two_attn_odd_hidden": {"seed": 22, "capture_layers": [2, 7], "hf": dict(
        vocab_size=128, hidden_size=45, intermediate_size=70, num_hidden_layers=8,
        num_attention_heads=3, num_key_value_heads=1, head_dim=16,
        linear_num_key_heads=1, linear_num_value_heads=3, linear_key_head_dim=8,
        linear_value_head_dim=8, linear_conv_kernel_dim=4, rms_norm_eps=1e-5,
        full_attention_interval=4, rope_parameters=_rope(1e6, 0.5, [2, 1, 1]))},
    # [GDN, attention]: interval 2, odd hidden 33, equal key/value heads, tied embeddings
    "interval2_tied": {"seed": 33, "capture_layers": [0], "hf": dict(
        vocab_size=128, hidden_size=33, intermediate_size=50, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, head_dim=24,
        linear_num_key_heads=3, linear_num_value_heads=3, linear_key_head_dim=12,
        linear_value_head_dim=12, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
        full_attention_interval=2, tie_word_embeddings=True,
        rope_parameters=_rope(10000.0, 0.25, [1, 1, 1]))},
    # interval 3 (attention at il 2, 5), GQA 6/2, value heads 3x key heads, full rotary
    "interval3_full_rope": {"seed": 44, "capture_layers": [2, 4], "hf": dict(
        vocab_size=128, hidden_size=40, intermediate_size=64, num_hidden_layers=6,
        num_attention_heads=6, num_key_value_heads=2, head_dim=8,
        linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=8,
        linear_value_head_dim=8, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
        full_attention_interval=3, rope_parameters=_rope(10000.0, 1.0, [2, 1, 1]))},
}


def oracle_tokens(hf: dict, seed: int, n: int = N_TOKENS) -> np.ndarray:
    """The token ids every fixture of this config uses: [n] int32."""
    return np.random.default_rng([seed, 7]).integers(0, hf["vocab_size"], n).astype(np.int32)


def build_hf_model(hf: dict, seed: int):
    """transformers Qwen3_5ForCausalLM (float32, eval, eager attention) with the random weights."""
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    kwargs = {k: v for k, v in hf.items() if k != "full_attention_interval"}
    kwargs["layer_types"] = hf_layer_types(hf)
    config = Qwen3_5TextConfig(**kwargs)
    config._attn_implementation = "eager"
    model = Qwen3_5ForCausalLM(config).eval()
    state = {k: torch.from_numpy(v) for k, v in random_qwen35_state_dict(hf, seed).items()}
    model.load_state_dict(state, strict=True)
    return model


def _logits(model, ids, cache=None) -> tuple[np.ndarray, object]:
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.as_tensor(ids, dtype=torch.long)[None], cache=cache,
                    use_cache=cache is not None)
    return out.logits[0].float().numpy(), out.cache


def run_oracle(name: str) -> dict[str, np.ndarray]:
    """Compute the fixture arrays of CONFIGS[name] with transformers (see module doc)."""
    import torch
    import transformers
    from transformers import DynamicCache

    spec = CONFIGS[name]
    hf, seed, layers = spec["hf"], spec["seed"], spec["capture_layers"]
    model = build_hf_model(hf, seed)
    tokens = oracle_tokens(hf, seed)

    with captured_layer_outputs(model, layers) as captured:
        prefill, _ = _logits(model, tokens)

    prefix_last = np.stack([_logits(model, tokens[:T])[0][-1] for T in PREFIX_LENS])

    cache = DynamicCache(config=model.config)
    _, cache = _logits(model, tokens[:INCR_PROMPT_LEN], cache)
    incr = []
    for i in range(INCR_PROMPT_LEN, INCR_PROMPT_LEN + INCR_STEPS):
        row, cache = _logits(model, tokens[i:i + 1], cache)
        incr.append(row[-1])

    return {
        "config_json": np.array(json.dumps(hf, sort_keys=True)),
        "seed": np.array(seed, dtype=np.int64),
        "tokens": tokens,
        "prefill_logits": prefill.astype(np.float32),
        "prefix_lens": np.array(PREFIX_LENS, dtype=np.int32),
        "prefix_last_logits": prefix_last.astype(np.float32),
        "incr_prompt_len": np.array(INCR_PROMPT_LEN, dtype=np.int32),
        "incr_logits": np.stack(incr).astype(np.float32),
        "capture_layers": np.array(layers, dtype=np.int32),
        "captured": np.stack([captured[il] for il in layers]).astype(np.float32),
        "versions": np.array(f"torch {torch.__version__}, transformers {transformers.__version__}"),
    }


def write_gguf(name: str, path: Path) -> Path:
    """Write CONFIGS[name]'s random model as an f32 qwen35 GGUF at `path`."""
    from luce.testing.hf_convert import write_qwen35_gguf

    spec = CONFIGS[name]
    return write_qwen35_gguf(path, spec["hf"], spec["seed"])


def main(argv: list[str] | None = None) -> int:
    return fixture_main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS,
                        default_out=ROOT / "tests" / "fixtures" / "qwen35", run_oracle=run_oracle,
                        write_gguf=write_gguf)


if __name__ == "__main__":
    sys.exit(main())
