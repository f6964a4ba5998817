"""`python -m tests.server.fake_serve_main`: serve_forever over the fake engine (for signal tests).

Prints "READY <port>" once listening with the engine loaded, and "EXIT <status>" at the end.
"""
from __future__ import annotations

import sys

from luce.server import App, EngineBridge, ModelInfo, ServerConfig, serve_forever
from tests.server.conftest import tiny_tokenizer
from tests.server.fake_core import FakeCore


def main() -> int:
    step_delay = float(sys.argv[1]) if len(sys.argv) > 1 else 0.02
    tok = tiny_tokenizer()
    info = ModelInfo(model_id="fake-model", path="fake.gguf", n_ctx=100_000, backend="fake", max_slots=2)
    app = App(ServerConfig(host="127.0.0.1", port=0, drain_timeout_s=20))

    def load():
        return EngineBridge(FakeCore(tok, max_slots=2, step_delay=step_delay), tok, info, max_pending=4)

    def ready(app):
        print(f"READY {app.port}", flush=True)

    status = serve_forever(app, load=load, on_ready=ready)
    print(f"EXIT {status}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
