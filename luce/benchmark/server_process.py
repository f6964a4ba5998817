"""Start a server from a command line for one benchmark run, and stop it afterwards.

    with ServerProcess("luce-serve /tmp/x.gguf --port {port}") as server:
        run_benchmark(Endpoint(server.base_url), config)

`{port}` in the command is replaced by a free loopback port (or `port=` when given). The
server is ready when GET /health answers 200 (llama-server, vLLM, luce-serve all have it; a server
without /health is ready when GET /v1/models answers 200). Its output goes to `log_path` (default: a temporary file) and
the last lines are quoted in the error when it exits or never becomes ready. stop() sends
SIGTERM to the server's process group, then SIGKILL after `stop_timeout_s`.
"""
from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import tempfile
import time

from luce.benchmark.client import http_get


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, command: str, port: int | None = None, host: str = "127.0.0.1",
                 ready_timeout_s: float = 600.0, stop_timeout_s: float = 30.0, log_path: str | None = None,
                 env: dict | None = None):
        self.port = port if port is not None else free_port(host)
        self.command = command.replace("{port}", str(self.port))
        self.host = host
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.log_path = log_path
        self.env = env
        self.process: subprocess.Popen | None = None
        self._log = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def log_tail(self, lines: int = 20) -> str:
        if not self.log_path or not os.path.exists(self.log_path):
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode("utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def start(self) -> "ServerProcess":
        if self.log_path is None:
            fd, self.log_path = tempfile.mkstemp(prefix="bench-server-", suffix=".log")
            os.close(fd)
        self._log = open(self.log_path, "ab")
        env = None if self.env is None else {**os.environ, **self.env}
        self.process = subprocess.Popen(shlex.split(self.command), stdout=self._log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server command exited with status {self.process.returncode} before it "
                                   f"was ready: {self.command}\n--- last output ({self.log_path}) ---\n"
                                   f"{self.log_tail()}")
            status, _ = http_get(self.base_url + "/health", timeout_s=2.0)
            if status == 404:       # no /health route: a model list means it is serving
                status, _ = http_get(self.base_url + "/v1/models", timeout_s=2.0)
            if status == 200:
                return
            time.sleep(0.2)
        raise RuntimeError(f"server not ready (GET /health != 200) after {self.ready_timeout_s:g} s: "
                           f"{self.command}\n--- last output ({self.log_path}) ---\n{self.log_tail()}")

    def stop(self) -> int | None:
        """Stop the server (SIGTERM, then SIGKILL); returns its exit status."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.process.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.process.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None
        return self.process.returncode

    def _signal(self, sig: int) -> None:
        """Signal the server's own process group (it was started in a new session), so a
        wrapper command (a shell, `timeout`) does not leave its child behind."""
        try:
            os.killpg(self.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
