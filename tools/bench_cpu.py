#!/usr/bin/env python3
"""CPU benchmark (`make bench-cpu`): luce's cpu backend beside llama.cpp on the same GGUF files,
the same thread count, in the same run. Table on stdout, everything in --json.

Sections (--sections, default all):
  kernels  every CPU_BENCH_CASES entry of tests/kernels/bench_cpu_*.py: median time, GB/s,
           GFLOP/s, % of the memory roof (luce._cpu.read_probe: 512 MiB streamed once on
           every thread, measured first)
  e2e      per model (the default pair): the README's chat request, greedy, 64 tokens,
           ignoring EOS: luce (luce.benchmark.cpu_run, its own process) then llama.cpp
           (the peer script ../shared/peers/cpu_llamacpp.py run by --peer-python): prompt
           and decode tok/s, peak RSS; ratios
  spec     the HumanEval benchmark subset (--prompts N of its 10 prompts, --spec-tokens each)
           through the target with each speculation config (--spec-configs), one request at a
           time: acceptance length, decode tok/s, against luce's plain decoding in the same
           run and llama.cpp's plain decode from the e2e section; outputs must equal plain

    python3 tools/bench_cpu.py [--threads 2] [--sections kernels,e2e,spec] [--json out.json]
        [--peer-python /tmp/peer/bin/python] [--peer-script ../shared/peers/cpu_llamacpp.py]
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SPEC_CONFIGS = {   # name -> cpu_run flags (the draft is the pair's draft model)
    "off": [],
    "default": ["--draft", "{draft}"],   # what luce-serve does with the pair: chain, adaptive depth 0..8
    "chain-model-8": ["--spec", "chain", "--draft-kind", "model", "--draft", "{draft}", "--draft-min", "-1"],
    "ddtree-model": ["--spec", "ddtree", "--draft-kind", "model", "--draft", "{draft}", "--draft-min", "-1"],
    "chain-ngram": ["--spec", "chain", "--draft-kind", "ngram"],
}


def memory_roof(threads: int) -> float:
    import numpy as np

    from luce import _cpu

    _cpu.set_threads(threads)
    buf = np.ones(512 << 20, np.uint8)
    _cpu.read_probe(buf)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        _cpu.read_probe(buf)
        times.append(time.perf_counter() - t0)
    return buf.nbytes / min(times)


def kernel_cases():
    for path in sorted((ROOT / "tests" / "kernels").glob("bench_cpu_*.py")):
        module = importlib.import_module(f"tests.kernels.{path.stem}")
        yield from getattr(module, "CPU_BENCH_CASES", [])


def run_kernels(threads: int, repeats: int) -> dict:
    from luce import _cpu

    roof = memory_roof(threads)
    rows = []
    for case in kernel_cases():
        _cpu.set_threads(threads)
        run, nbytes, flops = case()
        run()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
        t = statistics.median(times)
        rows.append({"case": case.__name__, "ms": t * 1e3, "GB/s": nbytes / t / 1e9, "GFLOP/s": flops / t / 1e9,
                     "roof_pct": 100.0 * (nbytes / roof) / t})
    return {"memory_roof_GB_s": roof / 1e9, "isa": _cpu.get_isa(), "cases": rows}


def subprocess_json(cmd: list[str]) -> dict:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} ... failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def luce_run(model: str, threads: int, extra: list[str]) -> dict:
    return subprocess_json([sys.executable, "-m", "luce.benchmark.cpu_run", model, "--threads", str(threads), *extra])


def peer_run(args, model: str) -> dict | None:
    if not (args.peer_python and Path(args.peer_python).exists() and Path(args.peer_script).exists()):
        return None
    out = Path("/tmp") / f"luce_peer_{os.getpid()}.json"
    cmd = [args.peer_python, args.peer_script, model, "--threads", str(args.threads), "--max-tokens",
           str(args.max_tokens), "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": proc.stderr[-500:]}
    peer = json.loads(out.read_text())
    first = peer["runs"][0]                     # the cold run: its prompt figure is a prefill
    decode = max(r["decode_tok_s"] for r in peer["runs"])
    return {"prompt_tok_s": first["prompt_tok_s"], "decode_tok_s": decode, "runs": peer["runs"]}


def run_e2e(args, models: dict[str, str]) -> dict:
    out = {}
    for name, path in models.items():
        luce = luce_run(path, args.threads, ["--max-tokens", str(args.max_tokens)])
        peer = peer_run(args, path)
        out[name] = {"luce": {k: luce[k] for k in ("prompt_tok_s", "decode_tok_s", "peak_rss_bytes", "backend")},
                     "peer": peer}
    return out


def run_spec(args, target: str, draft: str, peer_decode: float | None) -> dict:
    rows, plain = {}, None
    for name in args.spec_configs.split(","):
        flags = [f.format(draft=draft) for f in SPEC_CONFIGS[name]]
        r = luce_run(target, args.threads, ["--prompts", f"humaneval:{args.prompts}", "--max-tokens",
                                            str(args.spec_tokens), *flags])
        outputs = [run["tokens"] for run in r["runs"]]
        if name == "off":
            plain = (outputs, r["decode_tok_s"])
        rows[name] = {"spec": r["spec"], "draft_kind": r["draft_kind"], "decode_tok_s": r["decode_tok_s"],
                      "acceptance_length": r["acceptance_length"], "peak_rss_bytes": r["peak_rss_bytes"],
                      "outputs_equal_plain": None if plain is None else outputs == plain[0],
                      "vs_luce_plain": None if plain is None else r["decode_tok_s"] / plain[1],
                      "vs_llamacpp_plain": None if not peer_decode else r["decode_tok_s"] / peer_decode}
    return rows


def print_report(report: dict) -> None:
    print(f"# luce cpu benchmark ({report['date']}, commit {report['commit']}, {report['threads']} threads)")
    k = report.get("kernels")
    if k:
        print(f"\n## kernels ({k['isa']}; memory roof {k['memory_roof_GB_s']:.1f} GB/s)\n")
        print("| case | ms | GB/s | GFLOP/s | % roof |\n|---|---|---|---|---|")
        for r in k["cases"]:
            print(f"| {r['case']} | {r['ms']:.3f} | {r['GB/s']:.1f} | {r['GFLOP/s']:.1f} | {r['roof_pct']:.0f} |")
    e = report.get("e2e")
    if e:
        print("\n## end to end: README chat request, 64 tokens\n")
        print("| model | luce prompt tok/s | llama.cpp | ratio | luce decode tok/s | llama.cpp | ratio | luce RSS |")
        print("|---|---|---|---|---|---|---|---|")
        for name, r in e.items():
            L, P = r["luce"], r["peer"] or {}
            ratio = lambda a, b: f"{a / b:.2f}" if a and b else "-"  # noqa: E731
            print(f"| {name} | {L['prompt_tok_s']:.1f} | {P.get('prompt_tok_s', 0) or 0:.1f} | "
                  f"{ratio(L['prompt_tok_s'], P.get('prompt_tok_s'))} | {L['decode_tok_s']:.1f} | "
                  f"{P.get('decode_tok_s', 0) or 0:.1f} | {ratio(L['decode_tok_s'], P.get('decode_tok_s'))} | "
                  f"{L['peak_rss_bytes'] / 2**30:.2f} GiB |")
    s = report.get("spec")
    if s:
        print("\n## speculation: HumanEval subset, one request at a time\n")
        print("| config | acceptance length | decode tok/s | x luce plain | x llama.cpp plain | = plain |")
        print("|---|---|---|---|---|---|")
        for name, r in s.items():
            f = lambda v, fmt: fmt.format(v) if v is not None else "-"  # noqa: E731
            print(f"| {name} ({r['spec']}, {r['draft_kind']}) | {f(r['acceptance_length'], '{:.2f}')} | "
                  f"{r['decode_tok_s']:.1f} | {f(r['vs_luce_plain'], '{:.2f}')} | {f(r['vs_llamacpp_plain'], '{:.2f}')} | "
                  f"{f(r['outputs_equal_plain'], '{}')} |")


def main(argv=None) -> int:
    from luce.fetch import find_model
    from luce.model_paths import DEFAULT_DRAFT, DEFAULT_TARGET

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--sections", default="kernels,e2e,spec")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompts", type=int, default=10)
    p.add_argument("--spec-tokens", type=int, default=128)
    p.add_argument("--spec-configs", default="off,default,chain-model-8,ddtree-model,chain-ngram")
    p.add_argument("--peer-python", default=os.environ.get("PEER_PYTHON", str(ROOT / ".peer" / "bin" / "python")))
    p.add_argument("--peer-script", default=str(ROOT.parent / "shared" / "peers" / "cpu_llamacpp.py"))
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    sections = set(args.sections.split(","))
    target, draft = find_model(DEFAULT_TARGET), find_model(DEFAULT_DRAFT)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    report = {"date": time.strftime("%Y-%m-%d %H:%M"), "commit": commit, "threads": args.threads,
              "cpu": _cpu_model()}
    if "kernels" in sections:
        report["kernels"] = run_kernels(args.threads, args.repeats)
    if {"e2e", "spec"} & sections and (target is None or draft is None):
        raise SystemExit("the default pair is not fetched: run `make models`")
    if "e2e" in sections:
        report["e2e"] = run_e2e(args, {"coder-1.5b": str(target), "coder-0.5b": str(draft)})
    if "spec" in sections:
        peer = (report.get("e2e", {}).get("coder-1.5b", {}).get("peer") or {}).get("decode_tok_s")
        report["spec"] = run_spec(args, str(target), str(draft), peer)
    print_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    sys.exit(main())
