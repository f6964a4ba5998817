#!/usr/bin/env python3
"""DFlash oracle: z-lab's reference `dflash` package (torch, CPU) on a tiny random draft.

Records every draft call as the reference makes it, so luce's numpy `DFlashDraft` can replay
the same calls against its own context cache and compare logits:

- scenario "generate": `dflash.model.dflash_generate` (greedy) with a tiny random
  transformers Qwen3 target; each draft call's new context features, block token ids,
  positions and logits are captured by wrapping the draft model.
- scenario "direct": random target features, fed in chunks of chosen lengths, with the call
  + crop sequence of `dflash_generate` (the draft cache keeps context rows only).

Weights come from `luce.testing.dflash_convert.random_reference_state(spec, seed)` (numpy), so
a test without torch rebuilds the very same draft. Usage:
    python3 tools/dflash_oracle.py --out tests/fixtures/dflash/reference.npz
Needs torch, transformers 5.x and `dflash==0.1.0` (pip install --no-deps dflash==0.1.0).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from luce.testing.dflash_convert import (  # noqa: E402
    is_dflash2_spec,
    random_qwen3_target_state,
    random_reference_state,
    random_target_head,
    reference_hf_config,
    tiny_draft_spec,
)

SCENARIOS = {
    # name: (spec overrides, kind, kind arguments)
    # a vocabulary of 8 so the random draft sometimes gets accepted (2-row context appends)
    "generate": ({"vocab": 8, "mask_token_id": 7}, "generate", {"prompt_len": 7, "max_new_tokens": 24}),
    "direct": ({}, "direct", {"chunks": [5, 1, 3, 2], "block_lens": [4, 4, 4, 3]}),
    "sliding": ({"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 3},
                "direct", {"chunks": [6, 2, 1, 4], "block_lens": [4, 4, 2, 4]}),
    "causal": ({"is_causal": True}, "direct", {"chunks": [3, 2, 1], "block_lens": [4, 3, 4]}),
    "scaled": ({"input_embedding_scale": 1.5, "output_multiplier": 0.7, "final_logit_softcapping": 2.0},
               "direct", {"chunks": [4, 2], "block_lens": [4, 4]}),
    # DFlash2: kernel 3 > the 2-row block of call 3; 4 groups of 8 channels; 5 candidates
    "dflash2": ({"conv_kernel_size": 3, "conv_group_size": 8, "selector_rank": 6, "selector_top_k": 5,
                 "output_multiplier": 0.7}, "direct", {"chunks": [5, 2, 1, 3], "block_lens": [4, 4, 2, 3]}),
}
SELECTOR_FIELDS = ("tokens", "candidates", "scores")


def build_draft(spec: dict, seed: int):
    """The reference DFlashDraftModel (f32, eval) holding random_reference_state(spec, seed)."""
    import torch
    from dflash.model import DFlash2DraftModel, DFlashDraftModel
    from transformers import Qwen3Config

    cls = DFlash2DraftModel if is_dflash2_spec(spec) else DFlashDraftModel
    model = cls(Qwen3Config(**reference_hf_config(spec))).float().eval()
    state = {k: torch.from_numpy(v) for k, v in random_reference_state(spec, seed).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"reference draft state mismatch: missing {missing}, unexpected {unexpected}")
    return model


def build_target(spec: dict, seed: int):
    """The tiny random transformers Qwen3 target: random_qwen3_target_state(spec, seed)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        hidden_size=spec["hidden"], num_hidden_layers=spec["target_n_layer"],
        num_attention_heads=spec["n_head"], num_key_value_heads=spec["n_head_kv"],
        head_dim=spec["head_dim"], intermediate_size=spec["ffn"], vocab_size=spec["vocab"],
        rms_norm_eps=spec["rms_eps"], tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": spec["rope_theta"]})
    target = Qwen3ForCausalLM(cfg).float().eval()
    target.load_state_dict({k: torch.from_numpy(v) for k, v in random_qwen3_target_state(spec, seed).items()})
    return target


def _record(calls: list[dict], features, block_ids, positions, logits) -> None:
    calls.append({
        "features": features[0].float().numpy().copy(),         # [n_new, L*hidden]
        "block_ids": block_ids[0].numpy().astype(np.int64),     # [n_block]
        "positions": positions[0].numpy().astype(np.int64),     # [n_new + n_block]
        "logits": logits[0].float().numpy().copy(),             # [n_block - 1, V]
    })


def run_generate(spec: dict, seed: int, prompt_len: int, max_new_tokens: int) -> tuple[list[dict], np.ndarray]:
    """Greedy dflash_generate with the tiny target; returns (draft calls, output token ids)."""
    import torch
    from dflash import model as ref

    draft, target = build_draft(spec, seed), build_target(spec, seed)
    calls: list[dict] = []
    pending: dict = {}
    original_forward, original_embed = draft.forward, ref._raw_input_embeddings

    def embed(target_model, input_ids, scale=1.0):
        pending["block_ids"] = input_ids.clone()
        return original_embed(target_model, input_ids, scale)

    def forward(**kwargs):
        hidden = original_forward(**kwargs)
        n_block = pending["block_ids"].shape[1]
        logits = draft.compute_logits(hidden[:, 1 - n_block:, :], target.lm_head)
        _record(calls, kwargs["target_hidden"], pending["block_ids"], kwargs["position_ids"], logits)
        return hidden

    rng = np.random.default_rng([seed, 7])
    prompt = torch.from_numpy(rng.integers(0, spec["vocab"] - 1, size=(1, prompt_len)))
    ref._raw_input_embeddings, draft.forward = embed, forward
    try:
        out = ref.dflash_generate(draft, target, prompt, max_new_tokens, stop_token_ids=None)
    finally:
        ref._raw_input_embeddings = original_embed
        del draft.forward
    return calls, out[0].numpy().astype(np.int64)


def run_direct(spec: dict, seed: int, chunks: list[int], block_lens: list[int]) -> list[dict]:
    """Feed random features in chunks; after each draft call crop the cache to the context,
    exactly as dflash_generate does. Block i is [token, MASK x (block_lens[i] - 1)]."""
    import torch
    from dflash import model as ref

    draft = build_draft(spec, seed)
    embed_np, head_np = random_target_head(spec, seed)
    target = SimpleNamespace(get_input_embeddings=lambda: SimpleNamespace(weight=torch.from_numpy(embed_np)))
    head = torch.nn.Linear(spec["hidden"], spec["vocab"], bias=False)
    head.weight.data = torch.from_numpy(head_np)
    embed_scale = float(ref._draft_value(draft.config, "input_embedding_scale", 1.0))
    width = len(spec["target_layers"]) * spec["hidden"]
    rng = np.random.default_rng([seed, 11])
    cache = ref._make_cache(draft.config)
    calls, start = [], 0
    with torch.inference_mode():
        for n_new, n_block in zip(chunks, block_lens):
            features = torch.from_numpy(rng.standard_normal((1, n_new, width)).astype(np.float32))
            start += n_new
            ids = torch.full((1, n_block), spec["mask_token_id"], dtype=torch.long)
            ids[0, 0] = int(rng.integers(0, spec["vocab"] - 1))
            positions = torch.arange(start - n_new, start + n_block)[None]
            noise = ref._raw_input_embeddings(target, ids, embed_scale)
            hidden = draft(target_hidden=features, noise_embedding=noise, position_ids=positions,
                           past_key_values=cache, use_cache=True)[:, 1 - n_block:, :]
            ref._crop_to(cache, start)
            logits = draft.compute_logits(hidden, head)
            _record(calls, features, ids, positions, logits)
            if is_dflash2_spec(spec):
                calls[-1].update(_selector_record(draft, hidden, logits, ids[:, 0], head))
    return calls


def _selector_record(draft, hidden, logits, anchor, head) -> dict:
    """The reference selector's greedy chain; candidates sorted best logit first (ties: lowest
    id) and each one's score given the chain's predecessor, from the reference modules."""
    import torch

    tokens, candidates, _ = draft.propose(hidden, anchor, head, 0.0)
    sel = draft.candidate_selector
    logits = logits[0]
    by_id = torch.sort(candidates[0], dim=-1).values
    cands = by_id.gather(-1, torch.argsort(-logits.gather(-1, by_id), dim=-1, stable=True))
    gate = sel.hidden_projection(hidden[0])
    prev = torch.cat([anchor, tokens[0, :-1]])
    scores = logits.gather(-1, cands) + torch.einsum(
        "pr,pkr->pk", sel.predecessor_codebook(prev) * gate, sel.successor_codebook(cands))
    return {"tokens": tokens[0].numpy().astype(np.int64), "candidates": cands.numpy().astype(np.int64),
            "scores": scores.float().numpy()}


def run_scenario(name: str, seed: int) -> dict:
    """-> {'spec': dict, 'seed': int, 'args': dict, 'calls': [dict], 'output_ids': array or None}
    (generate: output_ids [prompt_len + generated] int64, the prompt first)"""
    overrides, kind, args = SCENARIOS[name]
    spec = tiny_draft_spec(**overrides)
    if kind == "generate":
        calls, output_ids = run_generate(spec, seed, **args)
    else:
        calls, output_ids = run_direct(spec, seed, **args), None
    return {"spec": spec, "seed": seed, "args": args, "calls": calls, "output_ids": output_ids}


def save_fixture(path: Path, results: dict[str, dict]) -> None:
    """One .npz: per scenario a JSON header plus per-call arrays `{scenario}/{i}/{field}`."""
    arrays: dict[str, np.ndarray] = {}
    for name, res in results.items():
        header = {"spec": res["spec"], "seed": res["seed"], "args": res["args"], "n_calls": len(res["calls"])}
        arrays[f"{name}/header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
        if res["output_ids"] is not None:
            arrays[f"{name}/output_ids"] = res["output_ids"]
        for i, call in enumerate(res["calls"]):
            for key, value in call.items():
                arrays[f"{name}/{i}/{key}"] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **arrays)


def load_fixture(path: Path) -> dict[str, dict]:
    """Inverse of save_fixture."""
    data = np.load(path)
    results = {}
    for key in data.files:
        if key.endswith("/header"):
            name = key.split("/")[0]
            header = json.loads(bytes(data[key]).decode())
            fields = ("features", "block_ids", "positions", "logits") + SELECTOR_FIELDS
            calls = [{f: data[f"{name}/{i}/{f}"] for f in fields if f"{name}/{i}/{f}" in data.files}
                     for i in range(header["n_calls"])]
            out = data[f"{name}/output_ids"] if f"{name}/output_ids" in data.files else None
            results[name] = {"spec": header["spec"], "seed": header["seed"], "args": header["args"],
                             "calls": calls, "output_ids": out}
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="fixture .npz to write")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--scenarios", nargs="*", default=sorted(SCENARIOS), choices=sorted(SCENARIOS))
    args = parser.parse_args()
    results = {name: run_scenario(name, args.seed) for name in args.scenarios}
    save_fixture(args.out, results)
    for name, res in results.items():
        lens = [len(c["features"]) for c in res["calls"]]
        print(f"{name}: {len(res['calls'])} draft calls, new context rows per call {lens}")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
