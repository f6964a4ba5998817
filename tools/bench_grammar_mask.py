"""Per-token cost of grammar-constrained decoding (luce.engine.constraint, llguidance).

    python tools/bench_grammar_mask.py [--gguf qwen2.5-coder-0.5b-instruct-q4_k_m.gguf] [--tokens 200]

For each vocabulary size (the GGUF's own, 151,936 for Qwen2.5; and 248,320, Qwen3.5's, made
by appending tokens built from pairs of existing ones to the same vocabulary) and each
grammar (a JSON schema and json_object), it walks `--tokens` steps: the mask for the state
(`TokenConstraint.mask`, llguidance's compute plus unpacking to a bool row), the sampler's
whole per-token cost (`TokenConstraint.apply`: the mask computed again and applied to a
logits row), then a random allowed token committed (`advance`). Reports the median and p90 of mask, apply and advance per token, and the
one-off tokenizer build and grammar compile times. Single thread; timings, not asserted.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from luce.engine.constraint import Grammar, TokenConstraint, ll_tokenizer
from luce.tokenizer import Tokenizer, read_tokenizer_metadata

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
    "city": {"enum": ["Paris", "London", "Tokyo"]}},
    "required": ["name", "age", "tags", "city"], "additionalProperties": False}


def tokenizer_of_size(meta: dict, size: int) -> Tokenizer:
    tokens, types = list(meta["tokenizer.ggml.tokens"]), list(meta["tokenizer.ggml.token_type"])
    rng = np.random.default_rng(0)
    normal = np.asarray([i for i, t in enumerate(types) if t == 1])
    seen = set(tokens)
    pairs = iter(rng.choice(normal, (4 * size, 2)).tolist())
    while len(tokens) < size:
        a, b = next(pairs)
        t = tokens[a] + tokens[b]
        if t not in seen:
            seen.add(t)
            tokens.append(t)
            types.append(1)
    meta = dict(meta, **{"tokenizer.ggml.tokens": tokens[:size], "tokenizer.ggml.token_type": types[:size]})
    return Tokenizer.from_metadata(meta)


def walk(tokenizer: Tokenizer, grammar: Grammar, n: int, rng) -> dict:
    vocab = tokenizer.vocab_size
    t0 = time.perf_counter()
    c = TokenConstraint(grammar, tokenizer, vocab)
    compile_ms = (time.perf_counter() - t0) * 1e3
    logits = rng.standard_normal(vocab).astype(np.float32)
    mask_us, apply_us, advance_us, steps = [], [], [], 0
    while steps < n:
        t0 = time.perf_counter()
        allowed = c.mask()
        t1 = time.perf_counter()
        c.apply(logits)
        t2 = time.perf_counter()
        ids = np.flatnonzero(allowed)
        ids = ids[~np.isin(ids, list(tokenizer.eot_ids))]
        if not len(ids):                       # complete: start again
            c = TokenConstraint(grammar, tokenizer, vocab)
            continue
        t3 = time.perf_counter()
        c.advance([int(rng.choice(ids))])
        t4 = time.perf_counter()
        mask_us.append((t1 - t0) * 1e6)
        apply_us.append((t2 - t1) * 1e6)
        advance_us.append((t4 - t3) * 1e6)
        steps += 1
    q = lambda xs, p: float(np.percentile(xs, p))  # noqa: E731
    return {"vocab": vocab, "grammar": grammar.kind, "compile_ms": round(compile_ms, 2),
            "mask_us_median": round(statistics.median(mask_us), 1), "mask_us_p90": round(q(mask_us, 90), 1),
            "apply_us_median": round(statistics.median(apply_us), 1),
            "advance_us_median": round(statistics.median(advance_us), 1), "tokens": n}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gguf", default=None, help="a GGUF whose tokenizer to use (default: the cached Qwen2.5 0.5B)")
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--sizes", default="native,248320")
    args = p.parse_args()
    path = args.gguf
    if path is None:
        from luce.fetch import find_model

        path = find_model("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
        if path is None:
            raise SystemExit("no GGUF given and the Qwen2.5 0.5B is not cached: pass --gguf PATH (or make models)")
    meta = read_tokenizer_metadata(path)
    rng = np.random.default_rng(0)
    for size in args.sizes.split(","):
        tok = Tokenizer.from_metadata(meta) if size == "native" else tokenizer_of_size(meta, int(size))
        t0 = time.perf_counter()
        ll_tokenizer(tok, tok.vocab_size)
        build_s = time.perf_counter() - t0
        for grammar in (Grammar.json_schema(SCHEMA), Grammar("json_object")):
            print(json.dumps({**walk(tok, grammar, args.tokens, rng), "tokenizer_build_s": round(build_s, 2)}))


if __name__ == "__main__":
    main()
