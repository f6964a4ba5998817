#!/usr/bin/env python3
"""Multi-turn prefix cache benchmark: TTFT per turn with and without the cache (issue 19).

    # CPU, the real Coder-1.5B (make models), beside llama.cpp's server cache (xllamacpp):
    python tools/bench_prefix_cache.py ~/.cache/luce/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
        --backend cpu --threads 2 --peer llamacpp --peer-python /tmp/peer/bin/python --json /tmp/pc_cpu.json
    # GPU, the 27B synthetic (tools/make_synthetic_model.py qwen36-27b ...):
    python tools/bench_prefix_cache.py /tmp/q36-iq4_xs.gguf --backend cuda --json /tmp/pc_gpu.json

Workloads: chat (10 turns, each adding ~1,000 tokens) and agent (the same, editing the middle
too); see luce/benchmark/prefix_cache.py. The peer runs in its own interpreter (the xllamacpp
wheel's venv) on the very prompts luce saw.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from luce.benchmark.prefix_cache import Workload, format_table, run_luce, summarize  # noqa: E402

PEER = Path(__file__).resolve().parent.parent / "luce" / "benchmark" / "prefix_cache_peer.py"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="GGUF file")
    p.add_argument("--backend", default="cpu", help="cpu | cuda | numpy (default cpu)")
    p.add_argument("--threads", type=int, default=2, help="cpu threads (luce and the peer)")
    p.add_argument("--workloads", default="chat,agent", help="comma-separated: chat, agent")
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--first", type=int, default=1000, help="tokens of the first prompt")
    p.add_argument("--grow", type=int, default=1000, help="tokens each turn adds")
    p.add_argument("--gen", type=int, default=32, help="tokens generated per turn")
    p.add_argument("--edit", type=int, default=32, help="agent: tokens rewritten in the middle per turn")
    p.add_argument("--snapshot-interval", type=int, default=1024, help="hybrid: snapshot every N prompt tokens too")
    p.add_argument("--cache-memory", type=float, default=8.0, help="prefix cache budget, GiB (default 8)")
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--peer", choices=["none", "llamacpp"], default="none")
    p.add_argument("--peer-python", default=sys.executable, help="interpreter with xllamacpp installed")
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def run_peer(args, prompts, ctx: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "spec.json"
        out = Path(tmp) / "out.json"
        spec.write_text(json.dumps({"model": args.model, "prompts": prompts, "gen": args.gen, "threads": args.threads,
                                    "ctx": ctx, "out": str(out)}))
        subprocess.run([args.peer_python, str(PEER), str(spec)], check=True)
        return json.loads(out.read_text())


def main(argv=None) -> int:
    args = parse_args(argv)
    from luce.models import load_model
    from luce.ops import get_backend

    backend = get_backend(args.backend, threads=args.threads if args.backend == "cpu" else None)
    model = load_model(args.model, backend)
    report = {"model": args.model, "backend": args.backend, "threads": args.threads, "workloads": {}}
    for kind in [k.strip() for k in args.workloads.split(",") if k.strip()]:
        w = Workload(kind, args.turns, args.first, args.grow, args.gen, args.edit,
                     token_low=min(1000, model.config.vocab // 4), token_high=min(30000, model.config.vocab))
        off = run_luce(model, w, cache=False, cuda_graphs=not args.enforce_eager)
        prompts = [t["prompt"] for t in off["turns"]]
        on = run_luce(model, w, cache=True, prompts=prompts, cuda_graphs=not args.enforce_eager,
                      cache_memory=int(args.cache_memory * (1 << 30)), snapshot_interval=args.snapshot_interval)
        entry = {"luce": summarize(off, on), "prefix_cache": on["prefix_cache"]}
        print(format_table(f"luce {kind}", entry["luce"]), flush=True)
        if args.peer == "llamacpp":
            peer = run_peer(args, prompts, w.max_context + 64)
            entry["llamacpp"] = summarize(peer["off"], peer["on"])
            print(format_table(f"llama.cpp {kind}", entry["llamacpp"]), flush=True)
        for off_t in off["turns"]:
            off_t.pop("prompt", None)
        for on_t in on["turns"]:
            on_t.pop("prompt", None)
        entry["runs"] = {"off": off["turns"], "on": on["turns"]}
        report["workloads"][kind] = entry
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
