"""The engine AR benchmark's host figure (luce.benchmark.engine_bench): RuntimeClock attributes
the time inside the runtime's waiting calls and graph launches, and bench_engine_ar reports
host = step - wait beside step_ms on the CUDA backend over the recording double of cuda-python
(tests/ops/fake_cuda.py), graphs replaying, the runtime unwrapped afterwards."""
from __future__ import annotations

import types

import pytest

from luce.benchmark import engine_bench
from luce.benchmark.decode_bench import BenchSettings
from luce.benchmark.decode_report import format_report
from luce.benchmark.engine_bench import LAUNCHES, WAITS, RuntimeClock, bench_engine_ar


class Clock:
    now = 0.0

    def perf_counter(self):
        return self.now


class Runtime:
    """Runtime calls that take known time on a Clock."""

    def __init__(self, clock):
        self.clock = clock

    def _take(self, seconds):
        self.clock.now += seconds

    def synchronize(self, stream):
        self._take(5.0)

    def event_synchronize(self, event):
        self._take(1.0)

    def device_synchronize(self):
        self._take(1.0)

    def copy_d2h_async(self, dst, src, nbytes, stream):
        self._take(0.5)

    def graph_launch(self, graph_exec, stream):
        self._take(2.0)
        return "launched"

    def copy_h2d_async(self, dst, src, nbytes, stream):
        self._take(3.0)


def test_the_clock_splits_waits_from_launches_and_unwraps(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(engine_bench, "time", clock)
    runtime = Runtime(clock)
    with RuntimeClock(types.SimpleNamespace(runtime=runtime)) as rc:
        runtime.copy_h2d_async(0, 0, 8, 0)            # host work: neither a wait nor a launch
        assert runtime.graph_launch(1, 0) == "launched"
        runtime.copy_d2h_async(0, 0, 8, 0)
        runtime.synchronize(0)
        runtime.event_synchronize(None)
        runtime.device_synchronize()
        assert rc.reading() == (7.5, 2.0)
    assert not set(vars(runtime)) & set(WAITS + LAUNCHES)       # the class's methods again
    runtime.synchronize(0)
    assert rc.reading() == (7.5, 2.0)
    with RuntimeClock(types.SimpleNamespace()) as rc:           # numpy, cpu: no runtime, no wait
        assert rc.reading() == (0.0, 0.0)


def test_engine_ar_reports_host_time_on_the_cuda_backend(monkeypatch, tmp_path):
    from luce.models import load_model
    from luce.ops import get_backend
    from luce.testing.tiny_models import make_dense
    from tests.ops.test_hip_runtime import install_fakes

    install_fakes(monkeypatch, tmp_path, "cuda")
    backend = get_backend("cuda")
    make_dense(tmp_path / "d.gguf", "qwen3", seed=3, head_dim=64)
    model = load_model(tmp_path / "d.gguf", backend)
    settings = BenchSettings(prompt_len=8, concurrency=(1, 2), warmup=3, steps=4)
    rows = bench_engine_ar(model, [[1, 2, 3, 4, 5, 6, 7, 8], [9, 8, 7, 6, 5, 4, 3, 2]], settings)
    assert [r["concurrency"] for r in rows] == [1, 2]
    for r in rows:
        assert r["steps"] == settings.steps and r["graphs"]["replays"] >= settings.steps
        assert 0 < r["host_ms"] <= r["step_ms"] and 0 < r["launch_ms"] <= r["host_ms"]
        assert r["wait_ms"] > 0           # the argmax's copy to the host and its synchronisation
    assert not set(vars(backend.runtime)) & set(WAITS + LAUNCHES)
    header = dict(model="d.gguf", arch="qwen3", n_layer=2, vocab=512, file_bytes=1, backend="cuda",
                  sync="synchronize", load_s=0.0, settings=vars(settings))
    text = format_report({**header, "engine_ar": rows})
    assert "host ms" in text and "launch ms" in text


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v"]))
