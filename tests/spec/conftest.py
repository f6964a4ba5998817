"""Tiny models shared by the spec tests (written once per session)."""
from __future__ import annotations

import pytest

from luce.models import load_model
from luce.testing.tiny_models import make_dense, make_dflash_draft, make_qwen35


@pytest.fixture(scope="session")
def tiny_paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("spec_models")
    paths = {"qwen35": root / "qwen35.gguf", "qwen3": root / "qwen3.gguf", "qwen3_draft": root / "qwen3_draft.gguf",
             "qwen2": root / "qwen2.gguf", "dflash": root / "dflash.gguf"}
    q35 = make_qwen35(paths["qwen35"], seed=11)
    make_dense(paths["qwen3"], "qwen3", seed=12)
    make_dense(paths["qwen3_draft"], "qwen3", seed=13, n_layer=1)
    make_dense(paths["qwen2"], "qwen2", seed=14)
    make_dflash_draft(paths["dflash"], q35, seed=15, block_size=4, target_layers=(0, 2))
    return paths


@pytest.fixture(scope="session")
def tiny_models(tiny_paths):
    models = {name: load_model(path, "cpu") for name, path in tiny_paths.items() if name != "dflash"}
    models["dflash"] = load_model(tiny_paths["dflash"], "cpu", target_model=models["qwen35"])
    return models
