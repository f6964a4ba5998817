"""The speculation exactness matrix on the CUDA backend (issue 8): the engine with chain,
ddtree and specla at concurrency 1, 3 and 5, staggered arrivals and a chunked prompt arriving
while others decode gives, greedy, the same tokens as the same engine with speculation off;
and the 1,024-token boundary fixture end to end: two decoders crossing 1,024 tokens of
context (a 256-key attention partition boundary, 16-token pages) beside a width-8 tree, each
request's tokens the same as alone."""
from __future__ import annotations

import pytest

from luce.engine import Engine, EngineConfig, SamplingParams
from luce.spec.config import SpecConfig
from tests.spec.test_exactness import ARRIVALS, CASE_MODES, CASES, PROMPTS, run_spec

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda_paths(tmp_path_factory):
    """The spec tests' tiny models at sizes the kernels take (attention head_dim 64, GDN
    state 64), so target rows never fall back to the host."""
    from luce.testing.tiny_models import make_dense, make_dflash_draft, make_qwen35

    root = tmp_path_factory.mktemp("spec_models_cuda")
    paths = {"qwen35": root / "qwen35.gguf", "qwen3": root / "qwen3.gguf", "qwen3_draft": root / "qwen3_draft.gguf",
             "dflash": root / "dflash.gguf"}
    q35 = make_qwen35(paths["qwen35"], seed=11, head_dim=64, ssm_state_size=64)
    make_dense(paths["qwen3"], "qwen3", seed=12, head_dim=64)
    make_dense(paths["qwen3_draft"], "qwen3", seed=13, n_layer=1, head_dim=64)
    make_dflash_draft(paths["dflash"], q35, seed=15, block_size=4, target_layers=(0, 2), head_dim=64)
    return paths


@pytest.fixture(scope="module")
def cuda_models(cuda_paths):
    from luce.models import load_model
    from luce.ops import get_backend

    backend = get_backend("cuda")
    models = {name: load_model(path, backend) for name, path in cuda_paths.items() if name != "dflash"}
    models["dflash"] = load_model(cuda_paths["dflash"], backend, target_model=models["qwen35"])
    return models


def test_cuda_targets_run_on_the_kernels(cuda_paths):
    """Plain and speculative steps of both targets launch kernels only (no host fallback)."""
    from luce.models import load_model
    from luce.ops import get_backend

    backend = get_backend("cuda")
    for name in ("qwen35", "qwen3"):
        model = load_model(cuda_paths[name], backend)
        plain = run_spec(model, SpecConfig(), 3, False)[0]
        spec = SpecConfig(spec="specla", draft_kind="model", draft="self", ddtree_budget=6, spec_top_k=2)
        assert run_spec(model, spec, 3, False, model)[0] == plain
    assert backend.host_fallbacks == {}, backend.host_fallbacks


def plain_outputs(model, concurrency):
    return run_spec(model, SpecConfig(), concurrency, False)[0]


@pytest.mark.parametrize("concurrency", [1, 3, 5])
@pytest.mark.parametrize("case,mode", CASE_MODES)
def test_cuda_speculative_output_equals_plain_decoding(cuda_models, case, mode, concurrency):
    target_name, kind, draft_name = CASES[case]
    model = cuda_models[target_name]
    assert model.backend.name == "cuda"
    want = plain_outputs(model, 5)
    spec = SpecConfig(spec=mode, draft_kind=kind, draft=draft_name, ddtree_budget=10, spec_top_k=3, chain_depth=4)
    got, engine = run_spec(model, spec, concurrency, False, cuda_models.get(draft_name))
    assert got == want
    assert engine.spec.stats.verifies > 0
    assert len(PROMPTS) == len(ARRIVALS)


def test_cuda_boundary_fixture_end_to_end(cuda_models):
    """Two requests with 1,016-token prompts decode across KV index 1,024 while a third
    speculates with width-8 trees (ddtree budget 7) in the same steps."""
    model = cuda_models["qwen35"]
    long_a = [3 + (i * 7) % 300 for i in range(1016)]
    long_b = [5 + (i * 11) % 300 for i in range(1016)]
    short = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7]
    params = SamplingParams(max_tokens=16)

    def run(prompts, spec):
        engine = Engine(model, None, EngineConfig(max_slots=3, ctx=1100, token_budget=1100, spec=spec),
                        draft_model=model)
        ids = [engine.add_request(p, params) for p in prompts]
        engine.run()
        return [engine.take_output(i).token_ids for i in ids], engine

    spec = SpecConfig(spec="ddtree", draft_kind="model", draft="self", ddtree_budget=7, spec_top_k=2)
    together, engine = run([long_a, long_b, short], spec)
    assert engine.spec.stats.verifies > 0
    alone = [run([p], None)[0][0] for p in (long_a, long_b, short)]
    assert together == alone


@pytest.mark.parametrize("case,mode", [("qwen35+self", "specla"), ("qwen3+ngram", "ddtree"), ("qwen35+dflash", "chain")])
def test_cuda_seeded_sampling_with_speculation_equals_plain(cuda_models, case, mode):
    """Seeded sampling (top-k 40, top-p 0.95: drawn on the device, cuda/sample_rng.cu) gives
    the same tokens with speculation as without, at concurrency 5."""
    target_name, kind, draft_name = CASES[case]
    model = cuda_models[target_name]
    want = run_spec(model, SpecConfig(), 5, True)[0]
    spec = SpecConfig(spec=mode, draft_kind=kind, draft=draft_name, ddtree_budget=10, spec_top_k=3, chain_depth=4)
    got, engine = run_spec(model, spec, 5, True, cuda_models.get(draft_name))
    assert got == want and engine.spec.stats.verifies > 0
