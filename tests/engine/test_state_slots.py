"""StateSlots on the tiny qwen35's real recurrent store and on a dense model (no store)."""
import numpy as np
import pytest

from luce.engine.state_slots import StateSlots
from luce.models import SegmentSpec, build_batch, load_model
from luce.testing.tiny_models import make_dense, make_qwen35


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory):
    path = tmp_path_factory.mktemp("ss") / "q35.gguf"
    make_qwen35(path, seed=5)
    return load_model(path, "cpu")


def run(model, state, slot, tokens, start):
    batch = build_batch([SegmentSpec(slot, tokens, start, list(range(slot * 4, slot * 4 + 4)))])
    return model.forward(batch, state).logits


def test_assign_reinitialises_and_owners_gate_access(qwen35):
    state = qwen35.new_state(16, 3)
    slots = StateSlots(state)
    slots.assign(1, "a")
    fresh = slots.digest()
    run(qwen35, state, 1, [5, 6, 7], 0)
    assert slots.digest() != fresh                     # the forward advanced slot 1's state
    with pytest.raises(RuntimeError, match="still owned by 'a'"):
        slots.assign(1, "b")
    slots.release(1)
    slots.assign(1, "b")                               # reused: zeros again
    assert slots.owns(1, "b") and not slots.owns(1, "a")
    layer = state.recurrent.gdn_layers[0]
    assert not np.any(state.recurrent.gdn(layer, 1)) and not np.any(state.recurrent.conv(layer, 1))
    with pytest.raises(IndexError, match="padding row"):
        slots.assign(-1, "c")


def test_dense_model_has_owners_but_no_arrays(tmp_path):
    make_dense(tmp_path / "d.gguf", seed=1)
    state = load_model(tmp_path / "d.gguf", "cpu").new_state(8, 2)
    slots = StateSlots(state)
    before = slots.digest()
    slots.assign(0, "a")
    assert slots.owns(0, "a") and slots.digest() != before
    slots.release(0)
    assert slots.digest() == before
