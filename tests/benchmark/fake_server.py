"""A small fake OpenAI-compatible streaming server for the benchmark tests (127.0.0.1 only).

    with FakeServer(token_s=0.002) as server:       # server.url, server.requests (bodies seen)
        ...
    python tests/benchmark/fake_server.py --port 8081 [--perturb 1] [--lifetime 60]

Output is a deterministic function of (prompt, perturb, and seed/temperature when the request
asks for sampling): token i is a word picked by sha256(prompt | i | perturb | sampling). It
honours max_tokens, ignore_eos (without it, generation stops after `eos_after` tokens when
set), stream_options.include_usage, and sends `tokens_per_chunk` tokens per SSE event. The
server shuts itself down after `lifetime_s` whatever happens, so no test can leave it behind.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WORDS = ("alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa",
         "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon")


def fake_tokens(prompt: str, n: int, perturb: int = 0, sampling: str = "") -> list[str]:
    """The fake model's output: n tokens (each a word and a space) for this prompt."""
    out = []
    for i in range(n):
        h = hashlib.sha256(f"{prompt}|{i}|{perturb}|{sampling}".encode()).digest()
        out.append(WORDS[h[0] % len(WORDS)] + " ")
    return out


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_Server"

    def log_message(self, *args):     # quiet
        pass

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        fake = self.server.fake
        if self.path == "/health":
            self._send(200, b'{"status": "ok"}')
        elif self.path == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [{"id": "fake"}]}).encode())
        elif self.path == "/metrics" and fake.metrics:
            with fake.lock:
                text = (f"# TYPE luce_tokens_per_step histogram\n"
                        f"luce_tokens_per_step_sum {fake.steps_tokens}\n"
                        f"luce_tokens_per_step_count {fake.steps}\n")
            self._send(200, text.encode(), "text/plain; version=0.0.4")
        else:
            self._send(404, b'{"error": {"message": "not found"}}')

    def do_POST(self):
        fake = self.server.fake
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        with fake.lock:
            fake.requests.append(body)
        chat = self.path.endswith("/chat/completions")
        if not (chat or self.path.endswith("/completions")):
            self._send(404, b'{"error": {"message": "not found"}}')
            return
        if fake.fail_status:
            self._send(fake.fail_status, b'{"error": {"message": "refused by the fake server"}}')
            return
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        n = int(body.get("max_tokens", 16))
        if not body.get("ignore_eos") and fake.eos_after is not None:
            n = min(n, fake.eos_after)
        temperature = float(body.get("temperature", 1.0))
        sampling = f"{temperature}:{body.get('seed')}" if temperature > 0 else ""
        tokens = fake_tokens(prompt, n, fake.perturb, sampling)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        if fake.chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        time.sleep(fake.ttft_s + fake.prefill_s_per_word * len(prompt.split()))
        usage_on = bool((body.get("stream_options") or {}).get("include_usage"))
        k = fake.tokens_per_chunk
        for start in range(0, n, k):
            if start:
                time.sleep(fake.token_s * k)
            piece = "".join(tokens[start:start + k])
            last = start + k >= n
            reason = ("length" if n == int(body.get("max_tokens", 16)) else "stop") if last else None
            choice = ({"index": 0, "delta": {"content": piece}, "finish_reason": reason} if chat else
                      {"index": 0, "text": piece, "finish_reason": reason})
            self._event({"choices": [choice]})
            with fake.lock:
                fake.steps += 1
                fake.steps_tokens += len(tokens[start:start + k])
        if usage_on:
            self._event({"choices": [], "usage": {"prompt_tokens": len(prompt.split()),
                                                  "completion_tokens": n,
                                                  "total_tokens": n + len(prompt.split())}})
        self._write(b"data: [DONE]" + fake.eol * 2)
        if fake.chunked:
            self.wfile.write(b"0\r\n\r\n")

    def _event(self, obj: dict) -> None:
        self._write(b"data: " + json.dumps(obj).encode() + self.server.fake.eol * 2)

    def _write(self, data: bytes) -> None:
        if self.server.fake.chunked:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        else:
            self.wfile.write(data)
        self.wfile.flush()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    fake: "FakeServer"


class FakeServer:
    def __init__(self, port: int = 0, ttft_s: float = 0.005, token_s: float = 0.001, tokens_per_chunk: int = 1,
                 perturb: int = 0, eos_after: int | None = None, chunked: bool = True, crlf: bool = False,
                 metrics: bool = True, fail_status: int = 0, prefill_s_per_word: float = 0.0,
                 lifetime_s: float = 60.0):
        self.ttft_s, self.token_s, self.tokens_per_chunk = ttft_s, token_s, tokens_per_chunk
        self.perturb, self.eos_after, self.chunked, self.metrics = perturb, eos_after, chunked, metrics
        self.eol = b"\r\n" if crlf else b"\n"
        self.fail_status, self.prefill_s_per_word = fail_status, prefill_s_per_word
        self.lock = threading.Lock()
        self.requests: list[dict] = []
        self.steps = 0
        self.steps_tokens = 0
        self.httpd = _Server(("127.0.0.1", port), _Handler)
        self.httpd.fake = self
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._deadline = threading.Timer(lifetime_s, self.stop)
        self._deadline.daemon = True
        self._stopped = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def start(self) -> "FakeServer":
        self._thread.start()
        self._deadline.start()
        return self

    def stop(self) -> None:
        with self.lock:
            if self._stopped:
                return
            self._stopped = True
        self._deadline.cancel()
        self.httpd.shutdown()
        self.httpd.server_close()

    def wait(self) -> None:
        self._thread.join()

    def __enter__(self) -> "FakeServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main() -> None:
    p = argparse.ArgumentParser(description="fake OpenAI-compatible streaming server (tests only)")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--perturb", type=int, default=0, help="a different 'model': different outputs")
    p.add_argument("--token-s", type=float, default=0.001)
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    p.add_argument("--lifetime", type=float, default=60.0, help="exit after this many seconds regardless")
    args = p.parse_args()
    server = FakeServer(port=args.port, perturb=args.perturb, token_s=args.token_s,
                        tokens_per_chunk=args.tokens_per_chunk, lifetime_s=args.lifetime).start()
    try:
        server.wait()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
