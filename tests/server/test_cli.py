"""luce-serve and luce-run as processes (tiny model), plus the real default pair under -m real."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from luce.server import App, ServerConfig, ServerThread
from luce.server.run_cli import format_stats
from luce.testing.tiny_models import make_dense
from tests.server import rawhttp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
READY = re.compile(r"luce-serve is ready: (http://127\.0\.0\.1:\d+)")


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "tiny-qwen3.gguf"
    make_dense(path, arch="qwen3", seed=2)
    return path


def serve(*args):
    """Start luce-serve; returns (process, base url) once it says it is ready."""
    proc = subprocess.Popen([sys.executable, "-m", "luce.server.serve_cli", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    for _ in range(200):          # bounded: the ready banner comes within a few lines
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = READY.search(line)
        if m:
            return proc, m.group(1)
    proc.kill()
    raise AssertionError("luce-serve did not become ready:\n" + "".join(lines) + proc.stderr.read())


def stop(proc) -> tuple[int, str]:
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return proc.returncode, err


def get_json(url):
    return json.load(urllib.request.urlopen(url, timeout=30))


def test_luce_serve_tiny_model_with_speculation(tiny_path):
    """--spec ddtree without a draft speculates with n-gram lookup (the only drafter that
    needs no model); /props says so."""
    proc, url = serve(str(tiny_path), "--port", "0", "--max-slots", "2", "--ctx", "256", "--spec", "ddtree",
                      "--backend", "numpy", "--alias", "tiny")
    try:
        props = get_json(url + "/props")
        assert props["model"] == "tiny" and props["n_ctx"] == 256 and props["total_slots"] == 2
        assert props["backend"] == "numpy"
        assert props["speculation"]["mode"] == "ddtree" and props["speculation"]["active"] is True
        assert props["speculation"]["draft_kind"] == "ngram" and props["speculation"]["draft"] is None
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0}
        resp = rawhttp.call(url, "POST", "/v1/chat/completions", body)
        assert resp.status == 200 and resp.json()["usage"]["completion_tokens"] <= 5
        assert resp.json()["model"] == "tiny"
    finally:
        code, err = stop(proc)
    assert code == 0, err
    assert "speculation ddtree with the ngram drafter" in err and "draining" in err


def test_luce_serve_api_key_and_bad_arguments(tiny_path):
    proc, url = serve(str(tiny_path), "--port", "0", "--api-key", "k1", "--backend", "numpy", "--ctx", "128")
    try:
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url + "/v1/models", timeout=10)
        assert e.value.code == 401
        req = urllib.request.Request(url + "/v1/models", headers={"Authorization": "Bearer k1"})
        assert json.load(urllib.request.urlopen(req, timeout=10))["data"][0]["id"] == "tiny-qwen3.gguf"
        # the port is taken now: a second server says so and exits 1
        port = url.rsplit(":", 1)[1]
        second = subprocess.run([sys.executable, "-m", "luce.server.serve_cli", str(tiny_path), "--port", port],
                                cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert second.returncode == 1 and "cannot listen" in second.stderr
    finally:
        stop(proc)
    bad = subprocess.run([sys.executable, "-m", "luce.server.serve_cli", str(tiny_path), "--temp", "-1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "temperature" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "luce.server.serve_cli", str(tiny_path), "--draft-kind", "dflash"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "needs a draft model: pass --draft PATH" in bad.stderr


def test_luce_run_streams_the_offline_text_then_stats(tiny_path):
    from luce.engine.sampler import SamplingParams
    from luce.llm import LLM

    run = subprocess.run([sys.executable, "-m", "luce.server.run_cli", "def fib(n):", "--raw", "--model",
                          str(tiny_path), "-n", "12", "--backend", "numpy", "--ctx", "256"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    llm = LLM(str(tiny_path), backend="numpy", max_slots=1, ctx=256, token_budget=256)
    expected = llm.generate(["def fib(n):"], SamplingParams(max_tokens=12))[0].text
    assert run.stdout == expected + "\n"
    assert re.search(r"prompt \d+ tok in .* \| generated 12 tok in .* \| acceptance length 1\.00 \| finish length",
                     run.stderr), run.stderr


@pytest.mark.parametrize("cli, at_least", [("serve_cli", 30), ("run_cli", 20)])
def test_every_flag_is_documented(cli, at_least):
    """Each long option luce-serve and luce-run take is named in docs/SERVER.md (luce-serve's
    --draft-min, --draft-vocab, --threads, --log-level and luce-run's --max-tokens were not)."""
    import importlib

    text = open(os.path.join(ROOT, "docs", "SERVER.md")).read()
    options = [o for a in importlib.import_module(f"luce.server.{cli}").build_parser()._actions
               for o in a.option_strings if o.startswith("--") and o != "--help"]
    assert len(options) >= at_least
    missing = [o for o in options if not re.search(re.escape(o) + r"(?![\w-])", text)]
    assert not missing, f"docs/SERVER.md does not name {cli}'s {missing}"


def test_format_stats_line():
    line = format_stats(40, 2.0, 11, 5.0, 10, "stop")
    assert line == ("prompt 40 tok in 2.00 s (20.0 tok/s) | generated 11 tok in 5.00 s (2.0 tok/s) | "
                    "acceptance length 1.00 | finish stop")


def test_health_is_503_while_loading_and_posts_too():
    with ServerThread(App(ServerConfig(port=0))) as s:
        assert s.app.address[0] == "127.0.0.1"          # loopback unless told otherwise
        health = rawhttp.call(s.url, "GET", "/health")
        assert health.status == 503 and health.json()["error"]["message"] == "Loading model"
        post = rawhttp.call(s.url, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})
        assert post.status == 503 and post.headers["retry-after"] == "5"
        assert rawhttp.call(s.url, "GET", "/metrics").status == 200


@pytest.mark.real
def test_default_pair_serves_sensible_code():
    from luce.fetch import DEFAULT_DRAFT, DEFAULT_TARGET, find_model

    if find_model(DEFAULT_TARGET) is None or find_model(DEFAULT_DRAFT) is None:
        pytest.skip("the default Qwen2.5-Coder pair is not fetched (make models)")
    proc, url = serve("--port", "0", "--backend", "numpy", "--max-slots", "1", "--ctx", "512")
    try:
        props = get_json(url + "/props")
        assert props["model"] == DEFAULT_TARGET and props["speculation"]["draft"].endswith(DEFAULT_DRAFT)
        assert props["speculation"]["active"] is True and props["speculation"]["draft_kind"] == "model"
        # the numpy backend decodes the 1.5B at seconds per token on a busy 2-core box: keep it short
        body = {"messages": [{"role": "user", "content": "Write a Python function that reverses a string."}],
                "max_tokens": 16, "temperature": 0}
        resp = rawhttp.call(url, "POST", "/v1/chat/completions", body, timeout=1500)
        text = resp.json()["choices"][0]["message"]["content"]
        assert resp.status == 200 and "def " in text, text
        assert resp.json()["usage"]["completion_tokens"] == 16
    finally:
        stop(proc)

