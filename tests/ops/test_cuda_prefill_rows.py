"""Prompt rows on the CUDA backend (DESIGN 5 rule 1): ForwardBatch.prefill_spans and the
backend's row runs (CPU), and (GPU) Backend.matmuls sending the rows of prefill_spans to the
prompt-row GEMM (cuda/matmul_prefill.cu) and the rest to the decode family, bitwise what each
kernel gives those rows alone; LUCE_PREFILL_GEMM=0 sends every row to the decode family; through a tiny
qwen35 model, a prompt's logits are bitwise the same alone, after another prompt, and beside
an AR row, and the AR row's are what they are alone. With the fused decode ops (issue #17):
every matmul of a layer gets the step's prefill_spans (CPU, a recording backend), the fused
add + RMSNorm / SwiGLU ops send prompt rows to the prompt-row GEMM and give the other rows
the fused path's bits (GPU), and a tiny qwen3 (merged q/k/v, gate/up) has the model property too.
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from luce.models import SegmentSpec, build_batch, load_model, pages_needed
from luce.ops.numpy_backend import NumpyBackend

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


class _Recording(NumpyBackend):
    """The numpy backend, recording the prefill_spans of each matmul (one entry per weight)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def matmul(self, x, w, bias=None, prefill_spans=()):
        self.calls.append(tuple(prefill_spans))
        return super().matmul(x, w, bias)

    def matmuls(self, x, weights, biases=None, prefill_spans=()):
        biases = list(biases) if biases is not None else [None] * len(weights)
        return [self.matmul(x, w, b, prefill_spans) for w, b in zip(weights, biases)]


@pytest.mark.parametrize("arch", ["qwen35", "qwen3", "qwen2"])
def test_every_layer_matmul_gets_the_prefill_spans(tmp_path, arch):
    """Through the fused ops (add_rmsnorm_matmuls, swiglu_matmul) every matmul of every layer
    sees the step's prompt rows; only the lm head (the logits rows) does not."""
    from luce.testing.tiny_models import make_dense, make_qwen35

    path = tmp_path / f"{arch}.gguf"
    make_qwen35(path, seed=3) if arch == "qwen35" else make_dense(path, arch, seed=3)
    backend = _Recording()
    model = load_model(path, backend)
    per = pages_needed(40)
    state = model.new_state(max_pages=2 * per, max_slots=2)
    model.forward(build_batch([SegmentSpec(0, list(range(1, 9)), 0, list(range(per)))]), state)
    backend.calls.clear()
    batch = build_batch([SegmentSpec(1, list(range(3, 20)), 0, list(range(per, 2 * per))),
                         SegmentSpec(0, [5], 8, list(range(per)))])
    model.forward(batch, state)
    assert batch.prefill_spans == ((0, 17),)
    n_layer = int(model.config.n_layer)
    assert backend.calls[-1] == () and len(backend.calls) > 3 * n_layer
    assert all(c == ((0, 17),) for c in backend.calls[:-1]), backend.calls


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


@pytest.fixture(scope="module", params=["qwen35", "qwen3"])
def tiny_model(request, tmp_path_factory, cuda):
    """A tiny q4_k_m qwen35, or qwen3 (its q/k/v and gate/up merged on cuda, issue #17)."""
    from luce.testing.tiny_models import make_dense, make_qwen35

    path = tmp_path_factory.mktemp("prefill_rows") / f"{request.param}_q4_k_m.gguf"
    if request.param == "qwen35":
        make_qwen35(path, seed=5, quant_mix="q4_k_m", head_dim=64, ssm_state_size=64)
        return load_model(path, cuda)
    make_dense(path, "qwen3", seed=6, quant_mix="q4_k_m", head_dim=64)
    model = load_model(path, cuda)
    assert model.layers[0].attn.merged is not None and model.layers[0].ffn.gate_up is not None
    return model


@pytest.mark.gpu
def test_prompt_logits_do_not_depend_on_the_step(tiny_model):
    model = tiny_model
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


@pytest.mark.gpu
@pytest.mark.parametrize("spans", [((0, 40),), ((0, 70),), ((5, 30), (33, 64))])
def test_fused_ops_send_prompt_rows_to_the_prefill_gemm(cuda, spans):
    """add_rmsnorm_matmuls and swiglu_matmul (merged gate|up too) with prompt rows: the sum is
    add's, the prompt rows are the prefill GEMM's on the unfused norm / SwiGLU output, and
    every other row is bitwise what the fused decode path gives it with no prompt in the step."""
    from tests.kernels.test_matmul import activations
    from tests.kernels.test_matmul_prefill import prefill

    k, n = 512, 97
    (wa, raw_a), (wb, raw_b) = _weight(cuda, Q.Q4_K, n, k, 3), _weight(cuda, Q.Q8_0, 40, k, 4)
    wd, raw_d = _weight(cuda, Q.Q6_K, 64, 256, 5)
    x, res = (cuda.asarray(activations(70, k, seed=s)) for s in (33, 34))
    norm = cuda.asarray(np.linspace(0.5, 1.5, k, dtype=np.float32))
    decode = np.ones(70, bool)
    for r0, r1 in spans:
        decode[r0:r1] = False
    rows, np_ = np.flatnonzero(decode), cuda.to_numpy

    s, outs = cuda.add_rmsnorm_matmuls(x, res, norm, 1e-6, [wa, wb], prefill_spans=spans)
    assert np.array_equal(np_(s), np_(cuda.add(x, res)))
    normed = np_(cuda.rmsnorm(s, norm, 1e-6))
    _, alone = cuda.add_rmsnorm_matmuls(cuda.asarray(np_(x)[rows]), cuda.asarray(np_(res)[rows]), norm, 1e-6,
                                        [wa, wb])
    for y, ya, raw, qtype, width in zip(outs, alone, (raw_a, raw_b), (Q.Q4_K, Q.Q8_0), (n, 40)):
        y = np_(y)
        for r0, r1 in spans:
            assert np.array_equal(y[r0:r1], prefill(normed[r0:r1], raw, qtype, width)), "prompt rows"
        assert np.array_equal(y[rows], np_(ya)), "decode rows differ from the fused path alone"

    gu = cuda.asarray(activations(70, 512, seed=35))   # merged gate | up, F = 256
    act = np_(cuda.swiglu(*cuda.split(gu, [256, 256])))
    y = np_(cuda.swiglu_matmul(gu, None, wd, prefill_spans=spans))
    for r0, r1 in spans:
        assert np.array_equal(y[r0:r1], prefill(act[r0:r1], raw_d, Q.Q6_K, 64)), "swiglu prompt rows"
    assert np.array_equal(y[rows], np_(cuda.swiglu_matmul(cuda.asarray(np_(gu)[rows]), None, wd)))

