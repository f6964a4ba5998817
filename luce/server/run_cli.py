"""`luce-run "prompt"`: one generation in the terminal, streamed, then a line of statistics.

    luce-run "Write a Python function that reverses a string."      # default model, chat template
    luce-run "def fib(n):" --raw --model model.gguf --max-tokens 64

The prompt goes through the model's chat template unless --raw. Stats (stderr): prompt
tokens and prefill speed, generated tokens and decode speed, acceptance length, finish reason.
"""
from __future__ import annotations

import argparse
import sys
import time

from luce.server.engine_core import (BACKENDS, ServeOptions, add_cache_arguments, add_spec_arguments, cache_options,
                                     load_engine, spec_options)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="luce-run", description="Generate once from a prompt and print stats.")
    p.add_argument("prompt", help="the prompt ('-' reads it from stdin)")
    p.add_argument("-m", "--model", help="GGUF file or cached model name (default: the default pair, fetched)")
    add_spec_arguments(p)
    add_cache_arguments(p)
    p.add_argument("--backend", choices=BACKENDS, default="auto")
    p.add_argument("--threads", "-t", type=int, default=None, help="cpu backend threads (default: all cores)")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graph replay (debugging)")
    p.add_argument("--ctx", "-c", type=int, default=None)
    p.add_argument("--max-tokens", "-n", type=int, default=256)
    p.add_argument("--temp", type=float, default=0.0, help="temperature (default 0: greedy)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--system", help="system message (chat mode)")
    p.add_argument("--raw", action="store_true", help="send the prompt as is, without the chat template")
    return p


def format_stats(n_prompt: int, prefill_s: float, n_gen: int, decode_s: float, steps: int, reason: str) -> str:
    """One line: prompt tok/s, decode tok/s, acceptance length (tokens per decode step)."""
    def rate(n, s):
        return f"{n / s:.1f} tok/s" if s > 0 and n > 0 else "n/a"
    accept = f"{(n_gen - 1) / steps:.2f}" if steps > 0 and n_gen > 1 else "n/a"
    return (f"prompt {n_prompt} tok in {prefill_s:.2f} s ({rate(n_prompt, prefill_s)}) | "
            f"generated {n_gen} tok in {decode_s:.2f} s ({rate(max(n_gen - 1, 0), decode_s)}) | "
            f"acceptance length {accept} | finish {reason}")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    from luce.engine.sampler import SamplingError, SamplingParams

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    options = ServeOptions(model=args.model, backend=args.backend, threads=args.threads, max_slots=1, ctx=args.ctx, max_queue=0,
                           enforce_eager=args.enforce_eager, **spec_options(args),
                           **cache_options(args))
    try:
        options.check()
        SamplingParams(max_tokens=max(args.max_tokens, 1), temperature=args.temp, top_k=args.top_k,
                       top_p=args.top_p, min_p=args.min_p, seed=args.seed, stop=tuple(args.stop))
        engine, tokenizer, info = load_engine(options, progress=True, say=say)
    except (ValueError, SamplingError, FileNotFoundError, OSError) as e:
        print(f"luce-run: {e}", file=sys.stderr)
        return 2
    if args.raw or not tokenizer.chat_template:
        ids = tokenizer.encode(prompt, add_bos=tokenizer.adds_bos)
    else:
        messages = ([{"role": "system", "content": args.system}] if args.system else [])
        messages.append({"role": "user", "content": prompt})
        ids = tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    if len(ids) >= info.n_ctx:
        print(f"luce-run: the prompt is {len(ids)} tokens but the context holds {info.n_ctx}; use --ctx",
              file=sys.stderr)
        return 2
    params = SamplingParams(max_tokens=min(args.max_tokens, info.n_ctx - len(ids)), temperature=args.temp,
                            top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, seed=args.seed,
                            stop=tuple(args.stop))
    t0 = time.monotonic()
    n_tokens = 0
    rid = engine.add_request(ids, params, request_id="run")
    t_first = None
    decode_steps = 0
    reason = "cancelled"
    try:
        while True:
            updates = engine.step()
            for update in updates:
                if update.finish_reason == "error":
                    print(f"\nluce-run: generation failed: {update.error}", file=sys.stderr)
                    return 1
                if update.token_ids:
                    n_tokens += len(update.token_ids)
                    if t_first is None:
                        t_first = time.monotonic()
                    else:
                        decode_steps += 1
                sys.stdout.write(update.text)     # the engine applied max_tokens and the stop strings
                sys.stdout.flush()
                if update.finish_reason is not None:
                    reason = update.finish_reason
            if reason != "cancelled":
                break
            if not updates and not engine.has_unfinished():
                break
    except KeyboardInterrupt:
        engine.cancel(rid)
    t_end = time.monotonic()
    sys.stdout.write("\n")
    first = t_first if t_first is not None else t_end
    say(format_stats(len(ids), first - t0, n_tokens, t_end - first, decode_steps, reason))
    return 0


if __name__ == "__main__":
    sys.exit(main())
