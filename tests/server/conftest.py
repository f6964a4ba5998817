"""Fixtures: a real luce HTTP server on a loopback port over a deterministic fake engine."""
from __future__ import annotations

import contextlib
import functools
import time

import pytest

from luce.server import App, EngineBridge, ModelInfo, ServerConfig, ServerThread
from luce.testing.tiny_tokenizer import tiny_tokenizer_metadata
from luce.tokenizer import Tokenizer
from tests.server.fake_core import FakeCore

N_CTX = 256


@functools.lru_cache(maxsize=1)
def tiny_tokenizer() -> Tokenizer:
    return Tokenizer.from_metadata(tiny_tokenizer_metadata())


@contextlib.contextmanager
def fake_server(*, max_slots=2, max_queue=8, n_ctx=N_CTX, api_key=None, step_delay=0.0,
                tokens_per_step=1, script_repeat=1, script_fn=None, chat_template=None, **config):
    """A server over FakeCore; `chat_template` swaps the tiny vocabulary's template (tests/server/templates.py)."""
    from tests.server.templates import tokenizer_with

    tok = tiny_tokenizer() if chat_template is None else tokenizer_with(chat_template)
    core = FakeCore(tok, max_slots=max_slots, step_delay=step_delay, tokens_per_step=tokens_per_step,
                    script_repeat=script_repeat, script_fn=script_fn)
    info = ModelInfo(model_id="fake-model", path="/nonexistent/fake.gguf", n_ctx=n_ctx, backend="fake",
                     max_slots=max_slots, arch="fake", spec_mode="off",
                     spec_note="fake engine for tests")
    bridge = EngineBridge(core, tok, info, max_pending=max_slots + max_queue)
    app = App(ServerConfig(host="127.0.0.1", port=0, api_key=api_key, **config), bridge)
    server = ServerThread(app).start()
    server.core = core
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def server():
    with fake_server() as s:
        yield s


def openai_client(server, api_key="unused", **kw):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.url + "/v1", api_key=api_key, max_retries=0, timeout=30, **kw)


def wait_until(predicate, timeout=10.0, interval=0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
