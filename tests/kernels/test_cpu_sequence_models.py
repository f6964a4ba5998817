"""End to end on the cpu backend: the engine's speculative decoding (chain, ddtree = GDN
'baseline' tree mode, specla = GDN 'factor' mode) on the tiny hybrid and dense models gives
exactly the tokens of plain decoding, at concurrency 1 and 3 with staggered arrivals and a
chunked prompt (tests/spec/test_exactness.py's schedule). Tokens alone would hide a one-ulp
slip, so the last tests compare logits and states bitwise: every tree row (attention, GDN) is
the AR row at its position, commit leaves AR's KV and recurrent state, and tree rows do not
depend on the other rows of a step."""
from __future__ import annotations

import pytest

from luce.spec.config import SpecConfig
from tests.kernels.cpu_sequence_harness import cpu_backend
from tests.spec.test_exactness import run_spec


@pytest.fixture(scope="module")
def cpu_models(tmp_path_factory):
    from luce.models import load_model
    from luce.testing.tiny_models import make_dense, make_dflash_draft, make_qwen35

    backend = cpu_backend()
    root = tmp_path_factory.mktemp("cpu_spec_models")
    q35 = make_qwen35(root / "qwen35.gguf", seed=11)
    make_dense(root / "qwen3.gguf", "qwen3", seed=12)
    make_dense(root / "qwen3_draft.gguf", "qwen3", seed=13, n_layer=1)
    make_dflash_draft(root / "dflash.gguf", q35, seed=15, block_size=4, target_layers=(0, 2))
    models = {name: load_model(root / f"{name}.gguf", backend) for name in ("qwen35", "qwen3", "qwen3_draft")}
    models["dflash"] = load_model(root / "dflash.gguf", backend, target_model=models["qwen35"])
    return models


CASES = [("qwen35", "chain", "model", "self"), ("qwen35", "ddtree", "model", "self"),
         ("qwen35", "specla", "model", "self"), ("qwen35", "specla", "ngram", None),
         ("qwen35", "specla", "dflash", "dflash"), ("qwen35", "ddtree", "dflash", "dflash"),
         ("qwen3", "ddtree", "model", "qwen3_draft"), ("qwen3", "chain", "ngram", None)]


@pytest.mark.parametrize("concurrency", [1, 3])
@pytest.mark.parametrize("target,mode,kind,draft", CASES)
def test_speculative_output_equals_plain_decoding_on_cpu(cpu_models, target, mode, kind, draft, concurrency):
    model = cpu_models[target]
    assert model.backend.name == "cpu"
    want = run_spec(model, SpecConfig(), 3, False)[0]
    draft_model = model if draft == "self" else cpu_models.get(draft)
    spec = SpecConfig(spec=mode, draft_kind=kind, draft=draft, ddtree_budget=10, spec_top_k=3, chain_depth=4)
    got, engine = run_spec(model, spec, concurrency, False, draft_model)
    assert got == want
    stats = engine.spec.stats
    assert stats.verifies > 0
    if mode != "chain":
        assert stats.verify_rows > stats.verifies * 2   # real trees were verified


# tests/spec/test_tree_verify.py's model-level properties, bitwise, on the cpu backend: every
# tree node's logits equal AR decoding's along its path, commit leaves AR's KV and recurrent
# state, tree rows are batch invariant.
@pytest.mark.parametrize("arch,mode", [("qwen35", "factor"), ("qwen35", "baseline"), ("qwen3", None)])
def test_tree_nodes_and_commit_equal_ar_decoding_on_cpu(cpu_models, arch, mode):
    from tests.spec import test_tree_verify as tv

    tv.test_tree_nodes_and_commit_equal_ar_decoding(cpu_models, mode, arch)
    cpu_models["qwen35"].gdn_tree_mode = "factor"


def test_tree_rows_batch_invariant_on_cpu(cpu_models):
    from tests.spec import test_tree_verify as tv

    tv.test_tree_rows_are_batch_invariant(cpu_models)
