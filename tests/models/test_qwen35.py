"""qwen35 hybrid model on the numpy backend vs transformers' Qwen3_5ForCausalLM.

Each tiny config of tools/hf_oracle.py (CONFIGS) is rebuilt from (config, seed) as an f32
GGUF through luce.testing.hf_convert and the writer. References come from transformers
live when torch + transformers import (and then the committed fixture is also checked to
be current), else from tests/fixtures/qwen35/<name>.npz.

Tolerance vs transformers: max |luce - hf| <= 2e-4 * max(1, max |hf|) per compared block.
transformers runs in float32 (its own prefill and cached-decode paths differ by up to
4e-5 here); luce's numpy references accumulate in float64, and luce is closer to a
float64 run of transformers than transformers' float32 run is (measured worst: 3.6e-5 of
scale). Paths inside luce that agree up to rounding only (chunked prefill vs token-by-token
decode; measured worst 1.1e-5 of scale after 6 layers) use 5e-5 of scale;
paths that must be bitwise identical (prefill cut at GDN chunk multiples, batch
invariance) use array_equal.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from luce.gguf.reader import read_config
from luce.models import SegmentSpec, build_batch, load_model, pages_needed
from luce.models.qwen35 import Qwen35Model
from luce.testing.hf_convert import grouped_to_tiled, qwen35_model_config, write_qwen35_gguf

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "qwen35"
HF_REL = 2e-4
SELF_REL = 5e-5


def _load_oracle_module():
    spec = importlib.util.spec_from_file_location("hf_oracle", ROOT / "tools" / "hf_oracle.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


oracle = _load_oracle_module()
NAMES = list(oracle.CONFIGS)


def _have_transformers() -> bool:
    try:
        import torch  # noqa: F401
        from transformers import Qwen3_5ForCausalLM  # noqa: F401
    except Exception:
        return False
    return True


def assert_close(got, ref, rel, what):
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    err, bound = np.abs(got - ref).max(), rel * max(1.0, np.abs(ref).max())
    assert err <= bound, f"{what}: max error {err:.3g} > {bound:.3g}"


class Case:
    """One config: the luce model, its references and helpers to run sequences."""

    def __init__(self, name: str, gguf_path: Path, ref: dict):
        self.name, self.ref = name, ref
        self.hf = json.loads(str(ref["config_json"]))
        self.model = load_model(gguf_path, "cpu")
        self.tokens = [int(t) for t in ref["tokens"]]

    def new_state(self, slots: int = 1):
        return self.model.new_state(max_pages=slots * pages_needed(len(self.tokens) + 8), max_slots=slots)

    def pages(self, slot: int) -> list[int]:
        n = pages_needed(len(self.tokens) + 8)
        return list(range(slot * n, (slot + 1) * n))

    def run(self, state, segments, capture=()):
        """segments: (slot, start, end, logits) over self.tokens -> ForwardOutput."""
        specs = [SegmentSpec(slot, self.tokens[a:b], a, self.pages(slot), logits=lg)
                 for slot, a, b, lg in segments]
        return self.model.forward(build_batch(specs, capture_layers=capture), state)


@pytest.fixture(scope="module", params=NAMES)
def case(request, tmp_path_factory):
    name = request.param
    spec = oracle.CONFIGS[name]
    fixture = FIXTURES / f"{name}.npz"
    stored = dict(np.load(fixture)) if fixture.exists() else None
    if _have_transformers():
        ref = oracle.run_oracle(name)
        if stored is not None:  # the committed fixture must still describe this oracle
            assert json.loads(str(stored["config_json"])) == spec["hf"], f"{fixture} is stale: rerun tools/hf_oracle.py"
            np.testing.assert_array_equal(stored["tokens"], ref["tokens"])
            assert_close(stored["prefill_logits"], ref["prefill_logits"], HF_REL, f"{fixture} vs live oracle")
    elif stored is not None:
        ref = stored
        assert json.loads(str(ref["config_json"])) == spec["hf"], f"{fixture} is stale: rerun tools/hf_oracle.py"
    else:
        pytest.skip(f"no torch/transformers and no fixture {fixture}")
    path = write_qwen35_gguf(tmp_path_factory.mktemp("qwen35") / f"{name}.gguf", spec["hf"], spec["seed"])
    return Case(name, path, ref)


# ---- parity with transformers ---------------------------------------------------------------

def test_full_prefill_logits_and_layer_captures(case):
    capture = tuple(int(i) for i in case.ref["capture_layers"])
    out = case.run(case.new_state(), [(0, 0, len(case.tokens), "all")], capture)
    assert isinstance(case.model, Qwen35Model)
    assert_close(out.logits, case.ref["prefill_logits"], HF_REL, f"{case.name} prefill logits")
    assert sorted(out.captured) == sorted(capture)
    for i, il in enumerate(capture):
        assert_close(out.captured[il], case.ref["captured"][i], HF_REL, f"{case.name} layer {il} output")


@pytest.mark.parametrize("T", [63, 64, 65])
def test_prefill_across_gdn_chunk_boundary(case, T):
    out = case.run(case.new_state(), [(0, 0, T, "all")])
    assert_close(out.logits, case.ref["prefill_logits"][:T], HF_REL, f"{case.name} prefill T={T}")
    k = list(case.ref["prefix_lens"]).index(T)
    assert_close(out.logits[-1], case.ref["prefix_last_logits"][k], HF_REL, f"{case.name} T={T} last row")


def test_prefill_then_incremental_decode(case):
    P, steps = int(case.ref["incr_prompt_len"]), case.ref["incr_logits"].shape[0]
    state = case.new_state()
    case.run(state, [(0, 0, P, "last")])
    rows = [case.run(state, [(0, P + i, P + i + 1, "last")]).logits[0] for i in range(steps)]
    assert_close(np.stack(rows), case.ref["incr_logits"], HF_REL, f"{case.name} incremental decode")


# ---- luce-internal consistency ---------------------------------------------------------------

def test_token_by_token_decode_equals_chunked_prefill(case):
    """AR rows (recurrent GDN path) reproduce the chunked prefill's logits at every position."""
    T = 70
    prefill = case.run(case.new_state(), [(0, 0, T, "all")]).logits
    state = case.new_state()
    rows = [case.run(state, [(0, t, t + 1, "last")]).logits[0] for t in range(T)]
    assert_close(np.stack(rows), prefill, SELF_REL, f"{case.name} decode vs prefill")


def test_prefill_cut_at_chunk_multiples_is_bitwise_identical(case):
    n = len(case.tokens)
    whole = case.run(case.new_state(), [(0, 0, n, "all")]).logits
    state = case.new_state()
    parts = [case.run(state, [(0, a, b, "all")]).logits for a, b in ((0, 64), (64, 128), (128, n))]
    np.testing.assert_array_equal(np.concatenate(parts), whole)


def test_prefill_cut_anywhere_carries_state(case):
    n = len(case.tokens)
    whole = case.run(case.new_state(), [(0, 0, n, "all")]).logits
    state = case.new_state()
    parts = [case.run(state, [(0, a, b, "all")]).logits for a, b in ((0, 50), (50, 51), (51, n))]
    assert_close(np.concatenate(parts), whole, SELF_REL, f"{case.name} prefill cut at 50, 51")


def test_rows_are_batch_invariant(case):
    """A sequence's logits are bitwise the same alone or sharing a step with other slots'
    prefill and AR rows and a padding segment."""
    alone_a = case.run(case.new_state(), [(0, 0, 70, "all")]).logits
    sb = case.new_state()
    case.run(sb, [(0, 0, 30, "none")])
    alone_b = case.run(sb, [(0, 30, 31, "last")]).logits

    state = case.new_state(slots=3)
    case.run(state, [(1, 0, 30, "none")])
    b = case.model.backend
    specs = [SegmentSpec(1, case.tokens[30:31], 30, case.pages(1), logits="last"),
             SegmentSpec(-1, case.tokens[:5], 0, case.pages(2), logits="none"),
             SegmentSpec(0, case.tokens[:70], 0, case.pages(0), logits="all")]
    mixed = b.to_numpy(case.model.forward(build_batch(specs), state).logits)
    np.testing.assert_array_equal(mixed[0], alone_b[0])
    np.testing.assert_array_equal(mixed[1:], alone_a)


def test_slot_reset_and_snapshot_restore(case):
    state = case.new_state()
    first = case.run(state, [(0, 0, 20, "last")]).logits
    snap = state.recurrent.snapshot(0)
    next_a = case.run(state, [(0, 20, 21, "last")]).logits
    state.recurrent.restore(0, snap)
    np.testing.assert_array_equal(case.run(state, [(0, 20, 21, "last")]).logits, next_a)
    state.reset_slot(0)
    np.testing.assert_array_equal(case.run(state, [(0, 0, 20, "last")]).logits, first)


def test_without_captures_nothing_is_captured(case):
    assert case.run(case.new_state(), [(0, 0, 3, "last")]).captured == {}


# ---- conversion ------------------------------------------------------------------------------

def test_written_gguf_reads_back_as_the_config(tmp_path):
    for name, spec in oracle.CONFIGS.items():
        path = write_qwen35_gguf(tmp_path / f"{name}.gguf", spec["hf"], spec["seed"])
        got, want = read_config(path), qwen35_model_config(spec["hf"])
        for f in dataclasses.fields(want):
            if f.name == "extra":
                continue
            g, w = getattr(got, f.name), getattr(want, f.name)
            if f.name == "rms_eps":
                assert g == pytest.approx(w, rel=1e-6)  # stored as float32
            else:
                assert g == w, f"{name}: {f.name} {g} != {w}"


def test_value_heads_grouped_to_tiled():
    # 2 key heads, 6 value heads (r = 3), head dim 1: grouped kh*3+i -> tiled i*2+kh
    x = np.arange(6)
    np.testing.assert_array_equal(grouped_to_tiled(x, 0, 2, 6, 1), [0, 3, 1, 4, 2, 5])
    w = np.arange(2 * 12).reshape(2, 12)   # columns: 6 heads of dim 2
    got = grouped_to_tiled(w, 1, 2, 6, 2)
    np.testing.assert_array_equal(got[:, 2:4], w[:, 6:8])   # tiled head 1 = grouped head 3
    np.testing.assert_array_equal(grouped_to_tiled(x, 0, 3, 3, 2), x)  # equal heads: identity
