"""A hybrid draft model's catch-up (prompt rows: its recurrent state advances in place): a
short one (the accepted drafts and the bonus token, up to CHAIN_CATCH_UP) runs its matmuls on
the decode family, a prompt's on the prompt GEMM. The GPU backend runs on the recording double
of cuda-python (it counts launches, computes nothing); the cpu backend, one matmul for every
row, proposes the same either way."""
from __future__ import annotations

import numpy as np
import pytest

from luce.spec.drafters import DraftLane
from luce.spec.drafters.draft_model import CHAIN_CATCH_UP, DraftModelDrafter
from tests.spec.test_draft_fed_chain import ranked_top_k

BASE = [4, 8, 15, 16, 23, 42, 7, 9]


def _catch_up_kernels(drafter, fake, extra):
    """Kernels of the first pass of a propose that catches up on `extra` tokens."""
    drafter.propose([DraftLane(0, BASE, 2, 2)])
    before, calls = len(fake.launches), []
    forward = drafter.forward

    def first(batch, state, **kw):
        out = forward(batch, state, **kw)
        calls.append(len(fake.launches))
        return out
    drafter.forward = first
    drafter.propose([DraftLane(0, BASE + extra, 2, 2)])
    drafter.forward = forward
    return [k for k, *_ in fake.launches[before:calls[0]]]


@pytest.mark.parametrize("extra, prompt", [([3, 5], False), (list(range(20, 21 + CHAIN_CATCH_UP)), True)])
def test_a_hybrid_drafts_short_catch_up_skips_the_prompt_gemm(monkeypatch, tmp_path, extra, prompt):
    from luce.models import load_model
    from luce.ops import get_backend
    from luce.testing.tiny_models import make_qwen35
    from tests.ops.test_hip_runtime import install_fakes

    fake = install_fakes(monkeypatch, tmp_path, "cuda")
    make_qwen35(tmp_path / "d.gguf", seed=11, quant_mix="q4_k_m", head_dim=64, ssm_state_size=64)
    drafter = DraftModelDrafter(load_model(tmp_path / "d.gguf", get_backend("cuda")), 1, 96, 2)
    ranked_top_k(monkeypatch, drafter.backend)
    kernels = _catch_up_kernels(drafter, fake, extra)
    matmuls = [k for k in kernels if k.startswith("_cuda_matmul.")]
    assert matmuls, kernels
    assert ("_cuda_matmul.matmul_prefill" in matmuls) == prompt, matmuls


def test_the_catch_up_route_changes_no_proposal_on_the_cpu_backend(tiny_models):
    model = tiny_models["qwen35"]
    got = []
    for extra in ([3, 5], list(range(20, 21 + CHAIN_CATCH_UP))):
        drafter = DraftModelDrafter(model, 1, 96, 3)
        drafter.propose([DraftLane(0, BASE, 2, 2)])
        got.append(drafter.propose([DraftLane(0, BASE + extra, 3, 2)])[0])
        fresh = DraftModelDrafter(model, 1, 96, 3).propose([DraftLane(0, BASE + extra, 3, 2)])[0]
        np.testing.assert_array_equal(got[-1].ids, fresh.ids)
