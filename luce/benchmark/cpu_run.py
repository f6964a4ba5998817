"""One measured run of luce on the cpu backend, in its own process (its peak RSS is its own):

    python -m luce.benchmark.cpu_run MODEL.gguf --threads 2 --max-tokens 64 [--draft D --spec chain]
        [--prompts humaneval:10] --json out.json

Prompt kinds: the README's chat request (default: chat-templated, like the llama.cpp peer's
chat request), or `humaneval:N` (the first N prompts of the benchmark subset, completed as
code). Each prompt runs alone (one request at a time), greedy, ignoring EOS, once to warm up
and once measured. Per prompt: prompt tokens, time to the first token (prefill + one LM
head), decode tok/s over the remaining tokens, and the output tokens (to prove speculative
outputs equal plain decoding); with speculation, the acceptance length.
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time

from luce.spec.config import DRAFT_VOCAB

README_PROMPT = "Write a Python function that reverses a string."


def load_prompts(kind: str, tokenizer) -> list[tuple[str, list[int]]]:
    """(id, token ids) of each prompt of `kind` ('readme' or 'humaneval:N')."""
    if kind == "readme":
        text = tokenizer.apply_chat_template([{"role": "user", "content": README_PROMPT}])
        return [("readme", tokenizer.encode(text, add_bos=tokenizer.adds_bos))]
    if kind.startswith("humaneval:"):
        from luce.benchmark.prompts import subset_prompts

        n = int(kind.split(":", 1)[1])
        return [(p.id, tokenizer.encode(p.text, add_bos=tokenizer.adds_bos)) for p in subset_prompts()[:n]]
    raise ValueError(f"prompt kind {kind!r}: 'readme' or 'humaneval:N'")


def timed_request(engine, prompt_ids: list[int], max_tokens: int) -> dict:
    """Run one request alone to completion: ttft_s, decode_s, tokens."""
    from luce.engine import SamplingParams

    rid = engine.add_request(prompt_ids, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    t0 = time.perf_counter()
    first = None
    while engine.has_unfinished():
        engine.step()
        if first is None and engine.get(rid).output_ids:
            first = time.perf_counter()
    end = time.perf_counter()
    tokens = list(engine.take_output(rid).token_ids)
    return {"prompt_tokens": len(prompt_ids), "ttft_s": first - t0, "decode_s": end - first, "tokens": tokens}


def measure(args) -> dict:
    from luce.engine import Engine, EngineConfig
    from luce.models import load_model
    from luce.ops import get_backend
    from luce.spec.config import resolve_spec_config
    from luce.tokenizer import Tokenizer

    t0 = time.perf_counter()
    backend = get_backend("cpu", threads=args.threads)
    model = load_model(args.model, backend)
    tokenizer = Tokenizer.from_gguf(args.model)
    spec = resolve_spec_config(args.spec, args.draft, args.draft_kind, chain_depth=args.draft_max,
                               ddtree_budget=args.ddtree_budget,
                               draft_min=None if args.draft_min < 0 else min(args.draft_min, args.draft_max),
                               draft_vocab=args.draft_vocab)
    engine = Engine(model, tokenizer, EngineConfig(max_slots=1, ctx=args.ctx, token_budget=512, spec=spec))
    load_s = time.perf_counter() - t0
    runs = []
    for pid, ids in load_prompts(args.prompts, tokenizer):
        timed_request(engine, ids, min(8, args.max_tokens))          # warm-up (pages, caches)
        r = timed_request(engine, ids, args.max_tokens)
        r["id"] = pid
        n = len(r["tokens"])
        r["prompt_tok_s"] = r["prompt_tokens"] / r["ttft_s"]
        r["decode_tok_s"] = (n - 1) / r["decode_s"] if n > 1 and r["decode_s"] > 0 else None
        runs.append(r)
    stats = engine.spec.stats if engine.spec is not None else None
    decoded = sum(len(r["tokens"]) - 1 for r in runs)
    return {
        "model": args.model, "draft": args.draft, "spec": spec.spec, "draft_kind": spec.draft_kind if spec.enabled else None,
        "backend": backend.describe(), "threads": args.threads, "load_s": load_s, "runs": runs,
        "decode_tok_s": decoded / sum(r["decode_s"] for r in runs),
        "prompt_tok_s": sum(r["prompt_tokens"] for r in runs) / sum(r["ttft_s"] for r in runs),
        "acceptance_length": stats.acceptance_length if stats is not None and stats.verifies else None,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--ctx", type=int, default=2048)
    p.add_argument("--prompts", default="readme")
    p.add_argument("--draft", default=None)
    p.add_argument("--spec", default=None)
    p.add_argument("--draft-kind", default=None)
    p.add_argument("--draft-max", type=int, default=8)
    p.add_argument("--draft-min", type=int, default=0, help="-1: a fixed depth (draft-max)")
    p.add_argument("--ddtree-budget", type=int, default=22)
    p.add_argument("--draft-vocab", type=int, default=DRAFT_VOCAB, help="0: the whole vocabulary")
    p.add_argument("--json", default="-")
    args = p.parse_args(argv)
    result = measure(args)
    text = json.dumps(result)
    if args.json == "-":
        print(text)
    else:
        with open(args.json, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
