"""The CUDA backend's argmax and sample (luce/ops/cuda_sampling_ops.py) over the recording
double of cuda-python (tests/ops/fake_cuda.py), with kernels that compute from what they are
given: ids come back with one copy into reused pinned memory and one synchronisation per
call, each call's result the caller's own array; argmax_ids leaves them on the device, and
GraphedForward(greedy_ids=True) holds that argmax in the forward's graph; sample's per-row
parameters reach the kernel from one upload as the kernel reads them (f64 temperature,
top-p, min-p; int32 top-k; u64 seed; int64 position)."""
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
    """An argmax that computes, in stream order (a captured graph runs it on each replay): the
    lowest id of each row's largest logit."""
    def argmax(logits, ids_out, rows, vocab, logits_stride=None, stream=0):
        hip.launch("_cuda_sampling.argmax", stream, [int(logits), int(ids_out)])

        def run():
            x = hip._device(int(logits), 4 * rows * vocab).view(np.float32).reshape(rows, vocab)
            hip._device(int(ids_out), 8 * rows).view(np.int64)[:] = np.argmax(x, axis=1)
        hip._enqueue(stream, run)
    return argmax


def _calls(hip, name):
    return [args for call, args in hip.calls if call == name]


def test_argmax_copies_once_into_pinned_memory_and_reuses_it(cuda, monkeypatch):
    backend, hip = cuda
    from luce import _cuda_sampling

    monkeypatch.setattr(_cuda_sampling, "argmax", _argmax_kernel(hip))
    rng = np.random.default_rng(0)
    results = []
    for L, grows in ((3, True), (1, False), (3, False), (70, True), (2, False)):    # 70 rows outgrow the first buffer
        logits = rng.standard_normal((L, 50)).astype(np.float32)
        dev = backend.upload(logits)
        hip.calls.clear()
        got = backend.argmax(dev)
        assert got.dtype == np.int64 and np.array_equal(got, np.argmax(logits, axis=1))
        names = [name for name, _ in hip.calls if name != "hipMalloc"]   # the ids' block: the caching allocator's
        assert names[-3:] == ["hipMemcpyAsync", "hipEventRecord", "hipEventSynchronize"]
        dst, _, nbytes, kind, _ = hip.calls[-3][1]
        assert kind == hip.hipMemcpyKind.hipMemcpyDeviceToHost and nbytes == 8 * L
        assert any(base <= dst and dst + nbytes <= base + a.nbytes for base, a in hip.pinned.items())
        assert ("hipHostMalloc" in names) == grows       # pinned memory only when the buffer grows
        if not grows:       # one copy, an event after it and the wait on that event, nothing else
            assert names == ["hipMemcpyAsync", "hipEventRecord", "hipEventSynchronize"]
        results.append((got, np.argmax(logits, axis=1)))
    for got, want in results:          # every call's result is its own, not a view of the buffer
        assert np.array_equal(got, want)


def test_argmax_ids_stay_on_the_device_until_asked_for(cuda, monkeypatch):
    backend, hip = cuda
    from luce import _cuda_sampling

    monkeypatch.setattr(_cuda_sampling, "argmax", _argmax_kernel(hip))
    logits = np.random.default_rng(1).standard_normal((4, 30)).astype(np.float32)
    dev = backend.upload(logits)
    hip.calls.clear()
    ids = backend.argmax_ids(dev)
    assert ids.shape == (4,) and ids.dtype == np.int64 and hip.is_device(ids.ptr)
    assert not [name for name, _ in hip.calls if name in ("hipStreamSynchronize", "hipMemcpyAsync")]
    assert np.array_equal(backend.ids_to_host(ids), np.argmax(logits, axis=1))
    assert backend.ids_to_host(backend.argmax_ids(backend.upload(np.zeros((0, 30), np.float32)))).shape == (0,)


def test_greedy_ids_are_part_of_the_forward_graph(cuda, monkeypatch, tmp_path):
    """GraphedForward(greedy_ids=True): the argmax is captured with the forward, a replay
    launches nothing outside its graph, and the ids are those of the replay's logits."""
    backend, hip = cuda
    from luce import _cuda_sampling
    from luce.models import SegmentSpec, build_batch, load_model
    from luce.models.graphed_forward import GraphedForward
    from luce.testing.tiny_models import make_dense

    monkeypatch.setattr(_cuda_sampling, "argmax", _argmax_kernel(hip))
    make_dense(tmp_path / "d.gguf", "qwen3", seed=5, head_dim=64)
    model = load_model(tmp_path / "d.gguf", backend)
    state = model.new_state(max_pages=4, max_slots=2)
    forward = GraphedForward(model)
    for step in range(4):                    # eager, captured, replayed twice
        batch = build_batch([SegmentSpec(0, [3 + step], 5 + step, [0, 1]), SegmentSpec(1, [9], 2 + step, [2, 3])],
                            pad_pages=True)
        eager_before = sum(not captured for _, _, captured in hip.launches)
        out = forward(batch, state, greedy_ids=True)
        eager = sum(not captured for _, _, captured in hip.launches) - eager_before
        logits = backend.to_numpy(out.logits)          # what the kernels left there: the double computes none
        assert np.array_equal(backend.ids_to_host(out.greedy_ids), np.argmax(logits, axis=1))
        if step >= 2:
            assert eager == 0, "a replay launched kernels outside its graph"
    assert forward.counters["replays"] == 2 and forward.counters["captures"] == 1
    plain = forward(batch, state)                         # without ids: another graph, no argmax in it
    assert plain.greedy_ids is None and len(forward.graphs) == 1


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
        def read(ptr, dtype):
            return hip._device(int(ptr), rows * np.dtype(dtype).itemsize).view(dtype).copy()
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


def test_a_greedy_engine_step_launches_nothing_outside_its_graph(cuda, monkeypatch, tmp_path):
    """The engine asks its forward for greedy ids when every request of the step is greedy:
    a replayed decode step then launches no kernel of its own (the argmax is in the graph),
    and its tokens are that argmax's."""
    backend, hip = cuda
    from luce import _cuda_sampling
    from luce.engine import Engine, EngineConfig
    from luce.engine.sampler import SamplingParams
    from luce.models import load_model
    from luce.testing.tiny_models import make_dense

    monkeypatch.setattr(_cuda_sampling, "argmax", _argmax_kernel(hip))
    make_dense(tmp_path / "d.gguf", "qwen3", seed=5, head_dim=64)
    model = load_model(tmp_path / "d.gguf", backend)
    engine = Engine(model, None, EngineConfig(max_slots=2, ctx=64, token_budget=80))
    for prompt in ([1, 2, 3], [4, 5, 6, 7]):
        engine.add_request(prompt, SamplingParams(max_tokens=12, ignore_eos=True))
    argmaxes = []
    ids_to_host = backend.ids_to_host
    monkeypatch.setattr(backend, "ids_to_host", lambda ids: argmaxes.append(ids_to_host(ids)) or argmaxes[-1])
    eager = []
    while engine.has_unfinished():
        before = sum(not captured for _, _, captured in hip.launches)
        updates = engine.step()
        eager.append(sum(not captured for _, _, captured in hip.launches) - before)
        assert [u.token_ids for u in updates if u.token_ids] == [(int(t),) for t in argmaxes[-1][:len(updates)]]
    replayed = engine.forward.counters["replays"]
    assert replayed >= 6 and eager[-replayed:] == [0] * replayed, eager
