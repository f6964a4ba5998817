"""The llama.cpp peer of the prefix cache benchmark (luce.benchmark.prefix_cache): the same
prompts through llama.cpp's server code (the xllamacpp wheel), its prompt cache off then on.
Runs in the wheel's own interpreter, so it imports nothing but the standard library and xllamacpp:

    /tmp/peer/bin/python luce/benchmark/prefix_cache_peer.py SPEC.json

SPEC.json: {"model", "prompts": [[ids]], "gen", "threads", "ctx", "out"}; writes {"off": run, "on": run}.
"""
import json
import sys
import time


def run_llamacpp(path: str, prompts: list[list[int]], gen: int, *, cache: bool, threads: int, ctx: int) -> dict:
    """The same prompts through llama.cpp's server code (xllamacpp), its prompt cache on or off:
    TTFT = its prompt processing time (timings.prompt_ms), plus the tokens it reused."""
    import xllamacpp as x

    p = x.CommonParams()
    p.model.path = str(path)
    p.n_ctx = ctx
    p.n_parallel = 1
    p.cpuparams.n_threads = threads
    p.cpuparams_batch.n_threads = threads
    server = x.Server(p)
    turns = []
    for t, ids in enumerate(prompts):
        t0 = time.perf_counter()
        r = server.handle_completions({"prompt": ids, "n_predict": gen, "temperature": 0, "ignore_eos": True,
                                       "cache_prompt": cache})
        wall = time.perf_counter() - t0
        timings = r.get("timings", {}) if isinstance(r, dict) else {}
        turns.append({"turn": t + 1, "prompt_tokens": len(ids), "prefilled_tokens": timings.get("prompt_n"),
                      "cached_tokens": len(ids) - (timings.get("prompt_n") or len(ids)),
                      "ttft_s": (timings.get("prompt_ms") or 0) / 1e3, "wall_s": wall})
    return {"cache": cache, "turns": turns}


def main(spec_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    out = {name: run_llamacpp(spec["model"], spec["prompts"], spec["gen"], cache=name == "on",
                              threads=spec["threads"], ctx=spec["ctx"]) for name in ("off", "on")}
    with open(spec["out"], "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
