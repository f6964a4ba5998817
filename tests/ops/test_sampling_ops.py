"""The CUDA backend's argmax and sample (luce/ops/cuda_sampling_ops.py) over the recording
double of cuda-python (tests/ops/fake_cuda.py), with kernels that compute from what they are
given: the ids land in a reused device buffer and come back with one copy into pinned memory
and one synchronisation per call, each call's result is the caller's own array, and sample's
per-row parameters reach the kernel from one upload as the kernel reads them (f64
temperature, top-p, min-p; int32 top-k; u64 seed; int64 position)."""
from __future__ import annotations

import numpy as np
import pytest

from luce.ops import get_backend
from tests.ops.test_hip_runtime import install_fakes


@pytest.fixture
def cuda(monkeypatch, tmp_path):
    hip = install_fakes(monkeypatch, tmp_path, "cuda")
    return get_backend("cuda"), hip


def _argmax_kernel(hip):
    """An argmax that computes: the lowest id of each row's largest logit."""
    def argmax(logits, ids_out, rows, vocab, logits_stride=None, stream=0):
        x = hip._device(int(logits), 4 * rows * vocab).view(np.float32).reshape(rows, vocab)
        hip._device(int(ids_out), 8 * rows).view(np.int64)[:] = np.argmax(x, axis=1)
    return argmax


def _calls(hip, name):
    return [args for call, args in hip.calls if call == name]


def test_argmax_copies_once_into_pinned_memory_and_reuses_its_buffers(cuda, monkeypatch):
    backend, hip = cuda
    from luce import _cuda_sampling

    monkeypatch.setattr(_cuda_sampling, "argmax", _argmax_kernel(hip))
    rng = np.random.default_rng(0)
    results = []
    for L, grows in ((3, True), (1, False), (3, False), (70, True), (2, False)):    # 70 rows outgrow the first buffers
        logits = rng.standard_normal((L, 50)).astype(np.float32)
        dev = backend.upload(logits)
        hip.calls.clear()
        got = backend.argmax(dev)
        assert got.dtype == np.int64 and np.array_equal(got, np.argmax(logits, axis=1))
        names = [name for name, _ in hip.calls]
        assert names[-2:] == ["hipMemcpyAsync", "hipStreamSynchronize"]
        dst, _, nbytes, kind, _ = hip.calls[-2][1]
        assert kind == hip.hipMemcpyKind.hipMemcpyDeviceToHost and nbytes == 8 * L and dst in hip.pinned
        assert ("hipHostMalloc" in names) == grows       # pinned memory only when the buffers grow
        if not grows:
            assert names == ["hipMemcpyAsync", "hipStreamSynchronize"]      # one copy and one sync, nothing else
        results.append((got, np.argmax(logits, axis=1)))
    for got, want in results:          # every call's result is its own, not a view of the buffer
        assert np.array_equal(got, want)


def test_argmax_names_the_rows_holding_nan(cuda, monkeypatch):
    backend, hip = cuda
    from luce import _cuda_sampling

    def nan_rows(logits, ids_out, rows, vocab, logits_stride=None, stream=0):
        hip._device(int(ids_out), 8 * rows).view(np.int64)[:] = [0, -1, 4]
    monkeypatch.setattr(_cuda_sampling, "argmax", nan_rows)
    with pytest.raises(ValueError, match=r"NaN in logits rows \[1\]"):
        backend.argmax(backend.upload(np.zeros((3, 8), np.float32)))


def test_sample_parameters_reach_the_kernel_from_one_upload(cuda, monkeypatch):
    backend, hip = cuda
    from luce import _cuda_sample_rng

    seen = {}

    def sample_rng(logits, t, k, p, m, s, pos, ids_out, work, work_bytes, rows, vocab, logits_stride=None,
                   stream=0):
        read = lambda ptr, dtype: hip._device(int(ptr), rows * np.dtype(dtype).itemsize).view(dtype).copy()  # noqa: E731
        seen.update(t=read(t, np.float64), k=read(k, np.int32), p=read(p, np.float64), m=read(m, np.float64),
                    s=read(s, np.uint64), pos=read(pos, np.int64))
        hip._device(int(ids_out), 8 * rows).view(np.int64)[:] = seen["k"] * 1000 + seen["pos"]
    monkeypatch.setattr(_cuda_sample_rng, "sample_rng", sample_rng)
    logits = backend.upload(np.zeros((3, 40), np.float32))
    hip.calls.clear()
    params = dict(temperature=[0.0, 0.7, 1.3], top_k=[1, 20, 64], top_p=[1.0, 0.9, 0.5], min_p=[0.0, 0.05, 0.1],
                  seed=[1, 2**63 + 5, 2**64 - 1], position=[7, 100, 4096])
    got = backend.sample(logits, **params)
    assert np.array_equal(got, np.array([1007, 20100, 68096]))
    assert seen["t"].tolist() == params["temperature"] and seen["k"].tolist() == params["top_k"]
    assert seen["p"].tolist() == params["top_p"] and seen["m"].tolist() == params["min_p"]
    assert seen["s"].tolist() == params["seed"] and seen["pos"].tolist() == params["position"]
    h2d = [a for a in _calls(hip, "hipMemcpyAsync") if a[3] == hip.hipMemcpyKind.hipMemcpyHostToDevice]
    assert len(h2d) == 1


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v"]))
