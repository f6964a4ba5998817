"""A draft model's chain fed on the device (DraftModelDrafter fed_chain): each depth's rows take
the previous depth's argmax kept by slot (GraphedForward.keep_ids_for, every segment's last
row), and every depth's top-k is read after the last pass. It proposes what the chain fed from
the host does, bit for bit, over every kind of catch-up (one row, a chain of tree rows, prompt
rows, a hybrid draft's), and on the GPU backend (the recording double of cuda-python: it
computes nothing, it counts) no pass waits for the host between the first depth and the last."""
from __future__ import annotations

import numpy as np
import pytest

from luce.spec.drafters import DraftLane
from luce.spec.drafters.draft_model import DraftModelDrafter

BASE = [4, 8, 15, 16, 23, 42, 7, 9]


def _script(drafter: DraftModelDrafter) -> list:
    """Proposals over calls that catch up one row, a chain of two, a long prompt, with lanes
    of other depths and widths: -> [(ids, logprobs) of every lane of every call, seen, fed]."""
    out = []

    def run(lanes):
        props = drafter.propose(lanes)
        out.extend((p.ids, p.logprobs) for p in props)
        out.append((list(drafter.seen), [list(f) for f in drafter.fed]))
        return props

    first = run([DraftLane(0, BASE, 4, 2), DraftLane(2, [1, 2, 3], 2, 3), DraftLane(1, BASE[:5], 1, 1)])
    a, b = first[0].ids[:, 0].tolist(), first[1].ids[:, 0].tolist()
    # lane 0 accepted every draft (a 2-row catch-up: the last draft and the bonus), lane 2 none
    run([DraftLane(0, BASE + a + [11], 3, 2), DraftLane(2, [1, 2, 3, (b[0] + 1) % 50], 3, 2)])
    run([DraftLane(0, BASE + a + [11] + list(range(20, 40)), 4, 4)])   # past CHAIN_CATCH_UP: prompt rows
    return out


def _assert_same(got: list, want: list) -> None:
    """_script's records equal, the proposals bit for bit."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if isinstance(g[0], np.ndarray):
            np.testing.assert_array_equal(g[0], w[0])
            np.testing.assert_array_equal(g[1], w[1])
        else:
            assert g == w


@pytest.mark.parametrize("name", ["qwen3_draft", "qwen35"])
def test_the_fed_chain_proposes_what_the_host_chain_does(tiny_models, name):
    model = tiny_models[name]
    fed, host = DraftModelDrafter(model, 3, 96, 5, fed_chain=True), DraftModelDrafter(model, 3, 96, 5, fed_chain=False)
    assert fed.forward.last_ids is not None and host.forward.last_ids is None
    got, want = _script(fed), _script(host)
    _assert_same(got, want)


def test_the_fed_chain_takes_its_tokens_from_the_kept_ids(tiny_models):
    """A wrong id planted where the passes keep theirs changes the deeper proposals: the fed
    rows read the device's ids, not the host's."""
    model = tiny_models["qwen3_draft"]
    want = DraftModelDrafter(model, 1, 64, 4, fed_chain=True).propose([DraftLane(0, BASE, 4, 2)])[0]
    drafter = DraftModelDrafter(model, 1, 64, 4, fed_chain=True)
    keep = drafter.backend.keep_ids

    def planted(ids, batch, last_ids, every_segment=False):
        keep(ids, batch, last_ids, every_segment)
        last_ids[0] = (int(last_ids[0]) + 1) % model.config.vocab
    drafter.backend = _With(drafter.backend, keep_ids=planted)
    drafter.forward.backend = drafter.backend
    got = drafter.propose([DraftLane(0, BASE, 4, 2)])[0]
    np.testing.assert_array_equal(got.ids[0], want.ids[0])        # depth 1: the catch-up, fed by the host
    assert not np.array_equal(got.ids[1:], want.ids[1:])


def ranked_top_k(monkeypatch, backend) -> None:
    """The double computes nothing: each top-k read (its copies and wait still made) gives
    the valid stand-in ids 0, 1, ... with log-probs 0, -1, ..."""
    wait = backend.top_k_logprobs_wait

    def ranked(handle):
        ids, _ = wait(handle)
        rank = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
        return rank, -rank.astype(np.float32)
    monkeypatch.setattr(backend, "top_k_logprobs_wait", ranked)


class _With:
    """A backend with some ops replaced."""

    def __init__(self, backend, **ops):
        self._backend, self._ops = backend, ops

    def __getattr__(self, name):
        return self._ops.get(name) or getattr(self._backend, name)


@pytest.mark.parametrize("fed_chain", [True, False])
def test_no_pass_of_a_fed_chain_waits_for_the_host(monkeypatch, tmp_path, fed_chain):
    from luce.models import load_model
    from luce.ops import get_backend
    from luce.testing.tiny_models import make_dense
    from tests.ops.test_hip_runtime import install_fakes

    fake = install_fakes(monkeypatch, tmp_path, "cuda")
    make_dense(tmp_path / "d.gguf", "qwen3", seed=13, n_layer=1, head_dim=64)
    backend = get_backend("cuda")
    drafter = DraftModelDrafter(load_model(tmp_path / "d.gguf", backend), 2, 64, 4)
    ranked_top_k(monkeypatch, backend)
    assert drafter.fed_chain
    drafter.fed_chain = fed_chain        # the host chain on the same backend, for contrast
    lanes = [DraftLane(0, BASE, 4, 2), DraftLane(1, BASE[:6], 4, 2)]
    for _ in range(3):                   # each key eager once, then captured: the next call replays
        drafter.propose(lanes)
    before = len(fake.calls)
    drafter.propose(lanes)
    calls = [name for name, _ in fake.calls[before:]]
    passes = [i for i, n in enumerate(calls) if n == "hipGraphLaunch"]      # cuda-python's double is hip's
    waits = [i for i, n in enumerate(calls) if n in ("hipStreamSynchronize", "hipEventSynchronize")]
    assert len(passes) == 4 and waits, calls
    if fed_chain:
        assert min(waits) > max(passes), calls
    else:
        assert sum(passes[0] < w < passes[-1] for w in waits) >= 3, calls


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["qwen3", "qwen35"])
def test_the_fed_chain_on_the_gpu_proposes_what_its_host_chain_does(tmp_path, name):
    """On the CUDA backend (graphs replayed, the argmax kept and fed inside them): the same
    proposals, bit for bit, as the chain fed from the host on the same kernels."""
    from luce.models import load_model
    from luce.ops import get_backend
    from luce.testing.tiny_models import make_dense, make_qwen35

    path = tmp_path / f"{name}.gguf"
    if name == "qwen3":
        make_dense(path, "qwen3", seed=13, n_layer=1, head_dim=64)
    else:
        make_qwen35(path, seed=11, head_dim=64, ssm_state_size=64)
    model = load_model(path, get_backend("cuda"))
    fed = DraftModelDrafter(model, 3, 96, 5)
    assert fed.fed_chain
    got, want = _script(fed), _script(DraftModelDrafter(model, 3, 96, 5, fed_chain=False))
    _assert_same(got, want)
