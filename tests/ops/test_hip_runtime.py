"""The GPU backend on its HIP runtime (luce/ops/hip_runtime.py), driven against the recording
double of hip-python and the kernel library (tests/ops/fake_hip.py), no AMD GPU needed; the
memory and graph tests run on the CUDA runtime too (cuda-python served by the same double,
tests/ops/fake_cuda.py), and a decode step makes the same calls through either.

What is exercised: `--backend hip` selection, the HIP calls of every memory path (caching
allocator with its out-of-memory retry, the pinned upload ring and its events, copies each
way, memsets, downloads) with values round-tripping through the double's device memory, and
decode steps of a tiny qwen35 model through luce.models.graphed_forward: eager, captured into
a HIP graph, replayed, with each step's metadata arena landing at the captured addresses.
What is not: no kernel computes (the double records each launch, checks its stream and that
every device address it is given lies in a live block, and runs nothing), so logits are not
checked; the double runs queued work at once, so the timing of asynchronous copies is not
either. Nothing here has run on AMD hardware (hip/README.md, "What ran where").
"""
from __future__ import annotations

import inspect

import numpy as np
import pytest

from luce.ops import auto_backend_choice, get_backend, hip_probe
from luce.ops.cuda_memory import OutOfDeviceMemory
from luce.ops.cuda_runtime import CudaRuntime
from luce.ops.gpu_runtime import GpuRuntime
from luce.ops.hip_runtime import HipRuntime
from tests.ops import fake_cuda, fake_hip

MB = 1 << 20


def install_fakes(monkeypatch, tmp_path, runtime: str):
    """hip-python (and cuda-python for 'cuda') over one FakeHip, a device and the runtime's
    kernel library, all fakes."""
    hip = fake_hip.FakeHip()
    fake_hip.install(monkeypatch, hip)
    if runtime == "cuda":
        fake_cuda.install(monkeypatch, hip)
    library = tmp_path / f"libluce_{runtime}.so"
    library.write_bytes(b"")
    monkeypatch.setenv("LUCE_KERNEL_LIB", str(library))
    fake_hip.install_kernels(monkeypatch, hip, str(library))
    return hip


@pytest.fixture
def fake(monkeypatch, tmp_path):
    return install_fakes(monkeypatch, tmp_path, "hip")


@pytest.fixture(params=["cuda", "hip"])
def gpu(request, monkeypatch, tmp_path):
    """(the backend on runtime `param`, its FakeHip)."""
    hip = install_fakes(monkeypatch, tmp_path, request.param)
    backend = get_backend(request.param)
    assert backend.name == request.param
    return backend, hip


def names(hip) -> list[str]:
    return [name for name, _ in hip.calls]


# ---- the interface ------------------------------------------------------------------------------
def interface(cls) -> dict[str, inspect.Signature]:
    return {name: inspect.signature(fn) for name, fn in inspect.getmembers(cls, inspect.isfunction)
            if not name.startswith("_")}


def test_cuda_and_hip_runtimes_expose_the_same_interface():
    want = interface(GpuRuntime)
    assert {"malloc", "free", "memset_async", "copy_h2d_async", "copy_d2h_async", "copy_d2d_async",
            "stream_create", "synchronize", "event_create", "event_record", "begin_capture", "end_capture",
            "graph_instantiate", "graph_launch", "graph_destroy", "device_count", "load_kernels"} <= set(want)
    assert interface(CudaRuntime) == want and interface(HipRuntime) == want
    inherited = {"library_path", "load_kernels"}   # the same for both: by the runtime's name
    for cls in (CudaRuntime, HipRuntime):
        assert set(want) - inherited <= set(vars(cls)), f"{cls.__name__} leaves methods unimplemented"
    assert (CudaRuntime.name, HipRuntime.name) == ("cuda", "hip")


@pytest.mark.skipif(hip_probe.hip_python_version() is None, reason="hip-python is not installed")
def test_the_double_has_hip_pythons_signatures_and_values():
    """Against the real hip-python (when installed): every call the double serves exists with
    the same parameters, and the enum values and flags it hands out are hip-python's."""
    from hip import hip

    for name, fn in inspect.getmembers(fake_hip.FakeHip, inspect.isfunction):
        if name.startswith("hip"):
            assert list(inspect.signature(fn).parameters)[1:] == list(inspect.signature(getattr(hip, name)).parameters), name
    for enum in (fake_hip.hipError_t, fake_hip.hipMemcpyKind, fake_hip.hipStreamCaptureMode):
        for member in enum:
            assert int(getattr(getattr(hip, enum.__name__), member.name)) == int(member), member
    for flag in ("hipStreamNonBlocking", "hipEventDisableTiming", "hipHostMallocDefault"):
        assert int(getattr(hip, flag)) == getattr(fake_hip.FakeHip, flag), flag


def _cuda_python() -> bool:
    try:
        from cuda.bindings import runtime  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _cuda_python(), reason="cuda-python is not installed")
def test_the_cuda_double_has_cuda_pythons_signatures_and_values():
    from cuda.bindings import runtime

    try:
        inspect.signature(runtime.cudaMalloc)
    except ValueError:
        pytest.skip("this cuda-python's functions carry no signatures")
    for name, fn in inspect.getmembers(fake_cuda.FakeCudart, inspect.isfunction):
        if name.startswith("cuda"):
            real = list(inspect.signature(getattr(runtime, name)).parameters)
            assert list(inspect.signature(fn).parameters)[1:] == real, name
    for enum in (fake_cuda.cudaMemcpyKind, fake_cuda.cudaStreamCaptureMode):
        for member in enum:
            assert int(getattr(getattr(runtime, enum.__name__), member.name)) == int(member), member
    for flag in ("cudaStreamNonBlocking", "cudaEventDisableTiming"):
        assert int(getattr(runtime, flag)) == getattr(fake_cuda.FakeCudart, flag), flag


# ---- selection ----------------------------------------------------------------------------------
def test_a_pinned_block_an_earlier_fake_frees_late_is_none_of_a_later_fakes():
    """An earlier test's PinnedIds, freed by the garbage collector during a later test, frees its
    host block through whichever fake is installed then: that must free nothing of the later
    fake's (numpy hands freed addresses out again; session 37's random failure of
    test_a_greedy_engine_step_launches_nothing_outside_its_graph)."""
    import gc

    sizes = [n for n in (64, 2048, 8192, 1 << 16, 1 << 20) for _ in range(4)]
    first = fake_hip.FakeHip()
    old = [first.hipHostMalloc(n, 0)[1] for n in sizes]
    del first
    gc.collect()
    later = fake_hip.FakeHip()
    live = {later.hipHostMalloc(n, 0)[1] for n in sizes}
    for address in old:
        later.hipHostFree(address)
    assert set(later.pinned) == live and not later.freed_pinned


def test_backend_hip_is_the_gpu_backend_on_the_hip_runtime(fake, tmp_path):
    backend = get_backend("hip")
    assert backend.name == "hip" and isinstance(backend.runtime, HipRuntime)
    assert names(fake)[:3] == ["hipGetDeviceCount", "hipStreamCreateWithFlags", "hipHostMalloc"]
    assert fake.calls[1][1] == (fake.hipStreamNonBlocking,) and backend.stream == int(fake.handles[backend.stream])


def test_auto_takes_a_hip_device_after_cuda(fake, monkeypatch):
    monkeypatch.setattr(hip_probe, "amd_gpus", lambda nodes_dir=hip_probe.KFD_NODES: ["gfx1100"])
    # ROCm's runtime is present: whether this machine has a libamdhip64 must not matter
    monkeypatch.setattr(hip_probe, "hip_runtime_library", lambda: "libamdhip64.so.6")
    name, why = auto_backend_choice()
    assert name == "hip" and "gfx1100" in why
    fake.devices = 0
    name, why = auto_backend_choice()
    assert name in ("cpu", "numpy") and "the AMD GPU here (gfx1100) cannot be used" in why
    assert "0 HIP devices" in why and "HIP_VISIBLE_DEVICES" in why


# ---- memory -------------------------------------------------------------------------------------
def test_copies_round_trip_through_the_runtime(gpu):
    backend, fake = gpu
    rng = np.random.default_rng(0)
    x = rng.standard_normal((65, 3, 8)).astype(np.float32)
    d = backend.asarray(x)
    assert np.array_equal(backend.to_numpy(d), x)
    assert not backend.to_numpy(backend.zeros((7, 5))).any()
    assert np.array_equal(backend.to_numpy(backend.concat_rows([d, d])), np.concatenate([x, x]))
    assert np.array_equal(backend.to_numpy(backend.take_rows(d, np.arange(10, 30))), x[10:30])
    dst = backend.empty(x.shape)
    backend.copy_into(dst, d)
    assert np.array_equal(backend.to_numpy(dst), x)
    ids = np.arange(11, dtype=np.int64)
    assert np.array_equal(backend.to_numpy(backend.asarray(ids)), ids)
    chunks = [rng.standard_normal(64 * 1024).astype(np.float32) for _ in range(40)]   # 10 MiB: laps the ring
    devs = [backend.asarray(c) for c in chunks]
    assert all(np.array_equal(backend.to_numpy(g), c) for g, c in zip(devs, chunks))
    big = rng.standard_normal(2 * MB).astype(np.float32)                        # past a ring half: direct
    assert np.array_equal(backend.to_numpy(backend.asarray(big)), big)
    assert {"hipEventRecord", "hipEventSynchronize"} <= set(names(fake))
    copies = [args for name, args in fake.calls if name in ("hipMemcpyAsync", "hipMemsetAsync")]
    assert copies and all(args[-1] == backend.stream for args in copies)   # all on the backend's stream


def test_rows_a_caller_keeps_are_checked_and_uploaded_once(gpu):
    """take_rows / put_rows of read-only row ids (RecurrentState's checkpoint rows): a range
    is one copy, other ids one gather whose device ids are uploaded on the first call only;
    `out` takes the rows in place; bounds still hold against every array."""
    backend, fake = gpu
    x = np.random.default_rng(1).standard_normal((12, 5)).astype(np.float32)
    d = backend.asarray(x)
    span, scattered = np.arange(3, 9), np.array([0, 5, 7, 11])
    span.flags.writeable = scattered.flags.writeable = False
    out = backend.empty((6, 5))
    assert backend.take_rows(d, span, out=out) is out and np.array_equal(backend.to_numpy(out), x[3:9])
    calls, launches = len(fake.calls), len(fake.launches)
    backend.take_rows(d, span, out=out)
    assert names(fake)[calls:] == ["hipMemcpyAsync"] and len(fake.launches) == launches
    backend.put_rows(d, span, backend.zeros((6, 5)))
    assert not backend.to_numpy(d)[3:9].any() and np.array_equal(backend.to_numpy(d)[:3], x[:3])
    gathered = backend.take_rows(d, scattered)
    calls, launches = len(fake.calls), len(fake.launches)
    assert backend.take_rows(d, scattered, out=gathered) is gathered
    assert "hipMemcpyAsync" not in names(fake)[calls:] and len(fake.launches) == launches + 1   # the gather alone
    with pytest.raises(IndexError, match="outside"):
        backend.take_rows(backend.asarray(x[:10]), scattered)
    with pytest.raises(ValueError, match="out"):
        backend.take_rows(d, span, out=backend.empty((5, 5)))


def test_out_of_memory_gives_cached_blocks_back_then_names_the_call(gpu):
    backend, fake = gpu
    held_at_start = backend.allocator.reserved_bytes             # the backend's own (counters), from its start
    fake.capacity = fake.used + 100 * MB
    held = [backend.empty((mb * MB // 4,)) for mb in (8, 16, 32)]   # three size classes, 56 MiB
    del held                                                     # cached, not freed
    big = backend.empty((60 * MB // 4,))                         # a 64 MiB class: needs them back
    assert names(fake).count("hipFree") == 3 and backend.allocator.reserved_bytes == 64 * MB + held_at_start
    malloc = {"cuda": "cudaMalloc", "hip": "hipMalloc"}[backend.name]
    with pytest.raises(OutOfDeviceMemory, match=malloc + r" of \d+ bytes failed \(hipErrorOutOfMemory \(2\)\)"):
        backend.empty((60 * MB // 4,))
    assert names(fake)[-1] == "hipGetLastError" and fake.last_error == 0
    del big


def test_the_models_loaded_choose_which_decode_launches_overlap(gpu, tmp_path, monkeypatch):
    """load_model tells the kernel library its models' size (luce_set_decode_overlap): every
    decode-chain launch may overlap the kernel ahead while each model this process loaded is
    small, only the matmuls and the attention from the first large one on."""
    from types import SimpleNamespace

    from luce.models import load_model
    from luce.ops import cuda_backend
    from luce.testing.tiny_models import make_dense

    backend, fake = gpu
    monkeypatch.setattr(cuda_backend, "widest_model_hidden", 0)
    make_dense(tmp_path / "q3.gguf", "qwen3", seed=5, head_dim=64)
    load_model(tmp_path / "q3.gguf", backend)
    for hidden in (cuda_backend.SMALL_MODEL_HIDDEN, 5120, 896):   # 5,120: the 27B's
        backend.fit_to_model(SimpleNamespace(hidden=hidden))
    assert fake.decode_overlap == [True, True, False, False]


# ---- a decode step, captured and replayed ---------------------------------------------------------
def decode_steps(backend, fake, tmp_path) -> list[str]:
    """6 decode steps of 3 slots of a tiny qwen35 through GraphedForward, checked -> the
    names of the runtime calls they made."""
    from luce.models import load_model
    from luce.models.graphed_forward import GraphedForward
    from luce.models.packer import SegmentSpec, build_batch
    from luce.testing.tiny_models import make_qwen35

    make_qwen35(tmp_path / "q35.gguf", seed=21, head_dim=64, ssm_state_size=64)
    model = load_model(tmp_path / "q35.gguf", backend)
    state = model.new_state(max_pages=48, max_slots=4)
    graphed = GraphedForward(model)
    pages = {slot: list(range(slot * 12, slot * 12 + 12)) for slot in (0, 1, 3)}
    tokens = np.random.default_rng(3)
    kernels_per_step, steps = [], 6
    for step in range(steps):
        before = len(fake.launches)
        batch = build_batch([SegmentSpec(slot, [int(tokens.integers(0, 400))], 7 * slot + step, pages[slot])
                             for slot in (0, 1, 3)], pad_pages=True)
        logits = backend.to_numpy(graphed(batch, state).logits)
        assert logits.shape == (3, model.config.vocab)
        kernels_per_step.append(fake.launches[before:])
        if step >= 1:   # captured, then replayed: the step's arena is at the graph's addresses
            (graph,) = graphed.graphs.values()
            for name, want in batch.step_arrays().items():
                assert np.array_equal(backend.to_numpy(graph.meta.view(name)), want), name
    assert graphed.counters["captures"] == 1 and graphed.counters["replays"] == steps - 2, graphed.counters
    assert graphed.counters["failures"] == 0, list(graphed.unsafe.values())
    eager, captured = kernels_per_step[0], kernels_per_step[1]
    assert eager and all(not in_graph for _, _, in_graph in eager)
    assert [k for k, _, _ in captured] == [k for k, _, _ in eager] and all(in_graph for _, _, in_graph in captured)
    assert all(stream == backend.stream for _, stream, _ in eager + captured)
    assert all(launched == [] for launched in kernels_per_step[2:])     # replays launch the graph only
    assert names(fake).count("hipStreamBeginCapture") == names(fake).count("hipStreamEndCapture") == 1
    assert names(fake).count("hipGraphInstantiateWithFlags") == 1
    assert names(fake).count("hipGraphLaunch") == fake.graph_launches == steps - 1   # the captured step too
    graphed.invalidate()
    assert {"hipGraphExecDestroy", "hipGraphDestroy"} <= set(names(fake))
    return names(fake)


def test_decode_steps_are_captured_and_replayed_as_graphs(gpu, tmp_path):
    decode_steps(*gpu, tmp_path)


def test_a_decode_step_makes_the_same_calls_through_either_runtime(tmp_path):
    calls = {}
    for runtime in ("cuda", "hip"):
        with pytest.MonkeyPatch.context() as monkeypatch:
            (tmp_path / runtime).mkdir()
            fake = install_fakes(monkeypatch, tmp_path / runtime, runtime)
            calls[runtime] = decode_steps(get_backend(runtime), fake, tmp_path / runtime)
    assert len(calls["hip"]) > 100 and calls["cuda"] == calls["hip"]


def test_a_capture_that_synchronizes_is_refused_and_the_stream_stays_usable(gpu):
    """A host synchronisation inside a capture (a forward that is not graph-safe) invalidates
    it: GraphUnsafe naming the call, the stream usable after."""
    from luce.ops.cuda_graph import Constants, GraphUnsafe

    backend, fake = gpu
    x = backend.asarray(np.arange(6, dtype=np.float32))
    sync = {"cuda": "cudaStreamSynchronize", "hip": "hipStreamSynchronize"}[backend.name]
    with pytest.raises(GraphUnsafe, match=sync + " failed: hipErrorStreamCaptureUnsupported"):
        backend.capture(Constants(), lambda: backend.to_numpy(x), lambda allocator: None)
    assert not fake.captures and fake.last_error == 0
    assert np.array_equal(backend.to_numpy(backend.copy(x)), np.arange(6, dtype=np.float32))


@pytest.mark.skipif(hip_probe.hip_python_version() is None, reason="hip-python is not installed")
def test_real_hip_python_without_a_device_fails_with_the_hip_error():
    """The HIP runtime over the real hip-python where it sees no device: no device counted,
    and a call that needs one raises GpuError naming the HIP call and error."""
    from luce.ops.gpu_runtime import GpuError

    runtime = HipRuntime()
    if runtime.device_count():
        pytest.skip("a HIP device is visible")
    with pytest.raises(GpuError, match=r"hipMalloc failed: hipError\w+ \(\d+\)"):
        runtime.malloc(256)
    with pytest.raises(RuntimeError, match=r"cannot use the HIP backend: .*\(0 HIP devices\)"):
        get_backend("hip")


# ---- the attention output's memset ------------------------------------------------------------------
def test_attention_zeroes_its_output_only_for_padding_rows(gpu, tmp_path):
    """Every row of a live segment is written by the attention kernels, so a step without
    padding rows (a decode step) launches no memset for the output; a padding segment's rows
    are zeroed first (they reach the LM head: finite values)."""
    from luce.models import load_model
    from luce.models.packer import SegmentSpec, build_batch
    from luce.testing.tiny_models import make_qwen35

    backend, fake = gpu
    make_qwen35(tmp_path / "q35.gguf", seed=21, head_dim=64, ssm_state_size=64)
    model = load_model(tmp_path / "q35.gguf", backend)
    state = model.new_state(max_pages=24, max_slots=2)
    kv = next(iter(state.kv.values()))
    q = backend.upload(np.ones((2, model.config.n_head, 64), np.float32))
    memsets = lambda: sum(name.endswith("MemsetAsync") for name in names(fake))  # noqa: E731
    live = build_batch([SegmentSpec(0, [5], 3, list(range(12))), SegmentSpec(1, [6], 4, list(range(12, 24)))])
    before = memsets()
    backend.attention(q, kv, live, 0.125)
    assert memsets() == before
    padded = build_batch([SegmentSpec(0, [5], 3, list(range(12))), SegmentSpec(-1, [0], 0, [])])
    before = memsets()
    backend.attention(q, kv, padded, 0.125)
    assert memsets() == before + 1
