"""The prefix cache on the CUDA backend: the multi-turn conversation of
test_prefix_cache_exact (a middle edit, a repeat, concurrent sharers) gives with the cache on
exactly the tokens and logits of the cache-off run, greedy and seeded, plain and n-gram
DDTree (eagerly: the logits recorder reads every step's rows on the host, which capture
refuses); snapshots are device copies (the backend's arrays, not host arrays) and partly used
pages of the dense model are copied on the device (kv_move_rows)."""
from __future__ import annotations

import numpy as np
import pytest

from tests.engine.test_prefix_cache_exact import conversation, make_engine

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", params=["qwen35", "qwen3"])
def cuda_tiny(request, tmp_path_factory):
    from luce.models import load_model
    from luce.ops import get_backend
    from luce.testing.tiny_models import make_dense, make_qwen35

    path = tmp_path_factory.mktemp("prefix_cuda") / f"{request.param}.gguf"
    if request.param == "qwen35":
        make_qwen35(path, seed=5, head_dim=64, ssm_state_size=64)    # sizes the kernels take
    else:
        make_dense(path, "qwen3", seed=5, head_dim=64)
    return request.param, load_model(path, get_backend("cuda"))


def emitted_rows(recorder, rid, n_tokens: int) -> dict:
    """{position: logits row} of the request's emitted tokens: from its prompt's last row on
    (the first position recorded), n_tokens of them. A row launched ahead for a request that
    ended meanwhile (luce.engine.ahead) is recorded too, and left out here."""
    rows = {pos: row for (r, pos), row in recorder.rows.items() if r == rid}
    first = min(rows, default=0)
    return {pos: row for pos, row in rows.items() if pos < first + n_tokens}


@pytest.mark.parametrize("spec", [False, True], ids=["plain", "ddtree"])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded"])
def test_cuda_cache_hit_is_byte_identical_to_cache_off(cuda_tiny, sampled, spec):
    name, model = cuda_tiny
    runs = {}
    for cache in (False, True):
        engine, recorder = make_engine(model, cache, spec)
        results, ids = conversation(engine, sampled)
        logits = [emitted_rows(recorder, rid, len(tokens)) for rid, (tokens, _) in zip(ids, results)]
        runs[cache] = results, logits, engine
    (cold, cold_logits, _), (warm, warm_logits, engine) = runs[False], runs[True]
    assert [t for t, _ in warm] == [t for t, _ in cold] and warm_logits == cold_logits
    assert sum(c for _, c in warm) > 0 and engine.stats.cached_prompt_tokens == sum(c for _, c in warm)
    if name == "qwen35":
        snaps = [e.snapshot for e in engine.cache.entries.values() if e.snapshot is not None]
        assert snaps and engine.cache.stats.snapshot_hits > 0
        for snap in snaps:
            for conv, gdn in snap.layers.values():
                assert not isinstance(conv, np.ndarray) and not isinstance(gdn, np.ndarray)   # device arrays
    engine.cache.clear()
    engine.check()
    assert engine.pool.n_used == 0 and engine.cache.bytes == 0
