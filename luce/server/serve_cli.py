"""`luce-serve`: the OpenAI-compatible server.

    luce-serve                                   # fetch (if needed) and serve the default pair
    luce-serve model.gguf --port 8080 --max-slots 5 --ctx 4096 --api-key KEY

It listens at once (/health answers 503 "Loading model" until the engine is ready), prints
the URL and a curl example when ready, and drains in-flight requests on SIGINT/SIGTERM.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time

from luce.server.app import App, ServerConfig
from luce.server.browser import is_loopback
from luce.server.chat_request import REASONING_FORMATS
from luce.server.kv_budget import DEFAULT_KV_MEMORY
from luce.server.turn import ChatSettings
from luce.server.engine_core import (BACKENDS, ServeOptions, add_cache_arguments, add_spec_arguments, cache_options,
                                     check_backend_available, load_bridge, spec_options)
from luce.server.runner import serve_forever
from luce.server.validation import Defaults

log = logging.getLogger("luce.server")


class OneLineErrors(argparse.ArgumentParser):
    """Bad flags get one line and exit status 2 (argparse's default prints the whole usage)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrors(prog="luce-serve", description="OpenAI-compatible LLM server (luce).")
    p.add_argument("model", nargs="?", help="GGUF file or cached model name (default: fetch and serve "
                   "Qwen2.5-Coder-1.5B-Instruct with the 0.5B draft)")
    p.add_argument("-m", "--model", dest="model_opt", metavar="MODEL", help="same as the positional MODEL")
    add_spec_arguments(p)
    add_cache_arguments(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback only)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 picks a free one)")
    p.add_argument("--max-slots", "-np", type=int, default=5, help="requests decoding together (default 5)")
    p.add_argument("--max-queue", type=int, default=64,
                   help="requests waiting for a slot before 429 (default 64)")
    p.add_argument("--ctx", "-c", type=int, default=None,
                   help="context length per request (default: the model's, bounded by --kv-memory)")
    p.add_argument("--kv-memory", default=DEFAULT_KV_MEMORY,
                   help="KV cache cap: a fraction of the memory free after loading (default 0.8) or a size "
                        "(12G, 512M)")
    p.add_argument("--token-budget", type=int, default=None,
                   help="rows per engine step (default: 2048 on a GPU where memory allows, else 1024 or 512; 512 on the CPU)")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="compute backend (default auto: cuda, else hip, else cpu, else numpy)")
    p.add_argument("--threads", "-t", type=int, default=None,
                   help="cpu backend threads (default: the cores this process may use)")
    p.add_argument("--enforce-eager", action="store_true",
                   help="launch every kernel from Python instead of replaying captured CUDA graphs (debugging)")
    p.add_argument("--api-key", default=os.environ.get("LUCE_API_KEY"),
                   help="require 'Authorization: Bearer KEY' (default: $LUCE_API_KEY, else none)")
    p.add_argument("--alias", help="model id reported to clients (default: the file name)")
    p.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024, help="request body limit (413 above)")
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="seconds to let in-flight requests finish on SIGINT/SIGTERM (default 30)")
    p.add_argument("--temp", type=float, default=Defaults.temperature, help="default temperature")
    p.add_argument("--top-k", type=int, default=Defaults.top_k, help="default top-k (0 = off)")
    p.add_argument("--top-p", type=float, default=Defaults.top_p, help="default top-p")
    p.add_argument("--min-p", type=float, default=Defaults.min_p, help="default min-p")
    p.add_argument("--seed", type=int, default=0, help="engine seed for requests without one")
    p.add_argument("--reasoning-format", choices=REASONING_FORMATS, default="deepseek",
                   help="deepseek/auto: <think> text goes to reasoning_content; none: it stays in the content")
    p.add_argument("--reasoning-budget", type=int, default=-1,
                   help="thinking tokens per answer: -1 unlimited (default), 0 thinking off, N then </think>")
    p.add_argument("--cors-origins", default="",
                   help="comma-separated origins browsers may call from ('*' = any; default none)")
    p.add_argument("--allowed-hosts", default="",
                   help="extra Host names a keyless loopback server answers ('*' = any; default loopback names)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


def _csv(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def check_server_flags(args) -> None:
    """ValueError naming the first flag out of range (argparse only checks types)."""
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be 0..65535 (0 picks a free port), got {args.port}")
    if args.max_body_bytes < 1:
        raise ValueError(f"--max-body-bytes must be >= 1, got {args.max_body_bytes}")
    if not args.drain_timeout >= 0:
        raise ValueError(f"--drain-timeout must be >= 0 seconds, got {args.drain_timeout}")
    if args.token_budget is not None and args.token_budget < 1:
        raise ValueError(f"--token-budget must be >= 1, got {args.token_budget}")
    if args.reasoning_budget < -1:
        raise ValueError(f"--reasoning-budget must be -1 (unlimited), 0 (off) or a token count, "
                         f"got {args.reasoning_budget}")
    for origin in _csv(args.cors_origins):
        if origin != "*" and "://" not in origin:
            raise ValueError(f"--cors-origins: {origin!r} is not an origin; write scheme://host[:port], "
                             "e.g. http://localhost:3000, or '*'")


class _LoadTicker:
    """Prints elapsed load time every few seconds while the model loads (the progress display)."""

    def __init__(self, interval: float = 5.0):
        self.interval = interval
        self._done = threading.Event()
        self._t0 = time.monotonic()

    def __enter__(self):
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def _run(self):
        while not self._done.wait(self.interval):
            print(f"luce: still loading ... {time.monotonic() - self._t0:.0f} s", file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        self._done.set()


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    model = args.model_opt or args.model
    options = ServeOptions(model=model, backend=args.backend, threads=args.threads, **spec_options(args), **cache_options(args),
                           max_slots=args.max_slots, ctx=args.ctx, max_queue=args.max_queue,
                           token_budget=args.token_budget, alias=args.alias, seed=args.seed,
                           kv_memory=args.kv_memory,
                           enforce_eager=args.enforce_eager)
    try:
        check_server_flags(args)
        options.check()
        check_backend_available(options.backend)  # one line now, not after listening
        defaults = Defaults(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p)
        from luce.engine.sampler import SamplingParams
        SamplingParams(temperature=defaults.temperature, top_k=defaults.top_k, top_p=defaults.top_p,
                       min_p=defaults.min_p)
    except ValueError as e:
        print(f"luce-serve: {e}", file=sys.stderr)
        return 2
    if not is_loopback(args.host) and not args.api_key:
        log.warning("listening on %s without --api-key: anyone who can reach this address can use the model",
                    args.host)
    config = ServerConfig(host=args.host, port=args.port, api_key=args.api_key,
                          max_body_bytes=args.max_body_bytes, drain_timeout_s=args.drain_timeout,
                          defaults=defaults, cors_origins=_csv(args.cors_origins),
                          allowed_hosts=_csv(args.allowed_hosts),
                          chat=ChatSettings(reasoning_format=args.reasoning_format,
                                            reasoning_budget=args.reasoning_budget))
    app = App(config)

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    def load():
        if model is None:
            say("luce: no model given: serving the default Qwen2.5-Coder pair (fetched on first use)")
        with _LoadTicker():
            return load_bridge(options, progress=True, say=say)

    def ready(app: App) -> None:
        host = args.host if ":" not in args.host else f"[{args.host}]"
        url = f"http://{host}:{app.port}"
        auth = f" -H 'Authorization: Bearer {args.api_key}'" if args.api_key else ""
        print(f"\nluce-serve is ready: {url}  (model {app.model_id}; OpenAI base URL {url}/v1)\n"
              f"try:\n  curl {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} \\\n"
              f"    -d '{{\"messages\": [{{\"role\": \"user\", \"content\": \"Write a Python function that "
              f"reverses a string.\"}}], \"max_tokens\": 128}}'\n", flush=True)

    def listening(app: App) -> None:
        say(f"luce: listening on {args.host}:{app.port}; /health answers 503 until the model is loaded")

    try:
        return serve_forever(app, load=load, on_ready=ready, on_listening=listening)
    except OSError as e:
        print(f"luce-serve: cannot listen on {args.host}:{args.port}: {e.strerror or e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
