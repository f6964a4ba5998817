"""Prompt rows on the CUDA backend (DESIGN 5 rule 1): ForwardBatch.prefill_spans and the
backend's row runs (CPU), and (GPU) Backend.matmuls sending the rows of prefill_spans to the
prompt-row GEMM (cuda/matmul_prefill.cu) and the rest to the decode family, bitwise what each
kernel gives those rows alone; LUCE_PREFILL_GEMM=0 sends every row to the decode family; through a tiny
qwen35 model, a prompt's logits are bitwise the same alone, after another prompt, and beside
an AR row, and the AR row's are what they are alone.
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from luce.models import SegmentSpec, build_batch, load_model, pages_needed

# ---- CPU ------------------------------------------------------------------------------------


def test_prefill_spans_of_a_step():
    prompt = SegmentSpec(0, list(range(40)), 0, [0, 1, 2])
    other = SegmentSpec(2, list(range(20)), 0, [6, 7])
    ar = SegmentSpec(1, [3], 17, [4, 5])
    pad = SegmentSpec(-1, [0, 0], 0, [])
    assert build_batch([prompt, ar]).prefill_spans == ((0, 40),)
    assert build_batch([prompt, pad, other, ar]).prefill_spans == ((0, 62),)   # padding between joins
    assert build_batch([prompt, pad, ar]).prefill_spans == ((0, 40),)          # trailing padding does not
    assert build_batch([ar]).prefill_spans == ()
    assert build_batch([ar, prompt, ar, other]).prefill_spans == ((1, 41), (42, 62))  # hand-made orders


def test_row_runs_cover_every_row_once():
    from luce.ops.cuda_backend import row_runs

    assert row_runs(70, ()) == [(0, 70, False)]
    assert row_runs(70, ((0, 70),)) == [(0, 70, True)]
    assert row_runs(70, ((0, 40),)) == [(0, 40, True), (40, 70, False)]
    assert row_runs(62, ((1, 41), (42, 62))) == [(0, 1, False), (1, 41, True), (41, 42, False), (42, 62, True)]
    assert row_runs(30, ((10, 50),)) == [(0, 10, False), (10, 30, True)]


# ---- GPU ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cuda():
    from luce.ops import get_backend

    return get_backend("cuda")


def _weight(cuda, qtype, n, k, seed):
    from tests.kernels.test_matmul import weights

    raw, _ = weights(qtype, n, k, seed)
    return cuda._upload_weight(raw, int(qtype), (n, k), f"test {qtype.name}"), raw


@pytest.mark.gpu
@pytest.mark.parametrize("spans", [(), ((0, 1),), ((0, 40),), ((0, 70),), ((5, 30), (33, 64))])
def test_matmuls_split_prompt_rows(cuda, spans):
    from tests.kernels.test_matmul import activations, run_kernel
    from tests.kernels.test_matmul_prefill import prefill

    k, n = 512, 97
    (wa, raw_a), (wb, raw_b) = _weight(cuda, Q.Q4_K, n, k, 0), _weight(cuda, Q.IQ4_XS, n, k, 1)
    x = activations(70, k, seed=31)
    got = [cuda.to_numpy(y) for y in cuda.matmuls(cuda.asarray(x), [wa, wb], prefill_spans=spans)]
    prompt = np.zeros(70, bool)
    for r0, r1 in spans:
        prompt[r0:r1] = True
    for y, raw, qtype in zip(got, (raw_a, raw_b), (Q.Q4_K, Q.IQ4_XS)):
        for r0, r1 in spans:
            assert np.array_equal(y[r0:r1], prefill(x[r0:r1], raw, qtype, n)), "prompt rows are not the prefill GEMM's"
        if not prompt.all():
            want = run_kernel(x[~prompt], raw, qtype, n)
            assert np.array_equal(y[~prompt], want), "decode rows are not the decode family's"


@pytest.mark.gpu
def test_switch_off_sends_every_row_to_decode(cuda):
    from tests.kernels.test_matmul import activations, run_kernel

    w, raw = _weight(cuda, Q.Q6_K, 97, 768, 2)
    x = activations(65, 768, seed=32)
    cuda.prefill_gemm = False
    try:
        y = cuda.to_numpy(cuda.matmul(cuda.asarray(x), w, prefill_spans=((0, 65),)))
    finally:
        cuda.prefill_gemm = True
    assert np.array_equal(y, run_kernel(x, raw, Q.Q6_K, 97))


@pytest.fixture(scope="module")
def tiny_qwen35(tmp_path_factory, cuda):
    from luce.testing.tiny_models import make_qwen35

    path = tmp_path_factory.mktemp("prefill_rows") / "qwen35_q4_k_m.gguf"
    make_qwen35(path, seed=5, quant_mix="q4_k_m", head_dim=64, ssm_state_size=64)
    return load_model(path, cuda)


@pytest.mark.gpu
def test_prompt_logits_do_not_depend_on_the_step(tiny_qwen35):
    model = tiny_qwen35
    rng = np.random.default_rng(8)
    a, b, c = (rng.integers(0, 400, n).tolist() for n in (70, 33, 25))
    per = pages_needed(80)
    pages = lambda s: list(range(s * per, (s + 1) * per))  # noqa: E731

    def run(segments, pick, warm=()):
        state = model.new_state(max_pages=3 * per, max_slots=3)
        for seg in warm:
            model.forward(build_batch([seg]), state)
        return model.backend.to_numpy(model.forward(build_batch(segments), state).logits)[pick]

    seg_a = SegmentSpec(0, a, 0, pages(0))
    ar_c = SegmentSpec(2, [9], len(c), pages(2))
    alone = run([seg_a], 0)
    assert np.array_equal(run([SegmentSpec(1, b, 0, pages(1)), seg_a], 1), alone), "prompt after another prompt"
    assert np.array_equal(run([seg_a, ar_c], 0, warm=[SegmentSpec(2, c, 0, pages(2))]), alone), "prompt beside an AR row"
    ar_alone = run([ar_c], 0, warm=[SegmentSpec(2, c, 0, pages(2))])
    assert np.array_equal(run([seg_a, ar_c], 1, warm=[SegmentSpec(2, c, 0, pages(2))]), ar_alone), "AR row beside a prompt"
