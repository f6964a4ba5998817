"""DFlash draft rows and the prompt-row GEMM (DFlashDraft.spans): with prompt_gemm every
matmul of a draft pass (context injection and block pass, the target's head included) is
launched as the prompt-row GEMM on the GPU backend, without it none is, and the numpy and cpu
backends, which have one matmul for every row, give the same logits either way. The GPU
backend runs on the recording double of cuda-python and the kernel library
(tests/ops/fake_cuda.py): it counts launches, it computes nothing."""
from __future__ import annotations

import numpy as np
import pytest

from luce.models.packer import SegmentSpec, build_batch
from tests.ops.test_hip_runtime import install_fakes


def _pair(tmp_path, backend):
    from luce.models import load_model
    from luce.testing.tiny_models import make_dflash_draft, make_qwen35

    if not (tmp_path / "t.gguf").exists():
        q35 = make_qwen35(tmp_path / "t.gguf", seed=21, quant_mix="q4_k_m", head_dim=64, ssm_state_size=64)
        make_dflash_draft(tmp_path / "d.gguf", q35, seed=22, block_size=4, target_layers=(0, 2), head_dim=64,
                          quant_mix="q4_k_m")
    target = load_model(tmp_path / "t.gguf", backend)
    return target, load_model(tmp_path / "d.gguf", backend, target_model=target)


def _draft_pass(draft, lanes=2):
    """Context rows 0..8 of `lanes` slots injected, then one block pass: -> logits [lanes * 3, V]."""
    state = draft.new_state(max_pages=lanes, max_slots=lanes)
    feats = np.random.default_rng(0).standard_normal((lanes * 9, draft.feature_width)).astype(np.float32)
    context = build_batch([SegmentSpec(s, [0] * 9, 0, [s], logits="none") for s in range(lanes)])
    draft.inject_context(context, draft.backend.asarray(feats), state)
    block = build_batch([SegmentSpec(s, draft.block_tokens(2 + s, draft.block_size), 9, [s], logits="block")
                         for s in range(lanes)])
    return draft.forward(block, state).logits


@pytest.mark.parametrize("prompt_gemm", [False, True])
def test_draft_matmuls_follow_prompt_gemm_on_the_gpu_backend(monkeypatch, tmp_path, prompt_gemm):
    from luce.ops import get_backend

    fake = install_fakes(monkeypatch, tmp_path, "cuda")
    monkeypatch.setenv("LUCE_DRAFT_PROMPT_GEMM", "1" if prompt_gemm else "0")
    _, draft = _pair(tmp_path, get_backend("cuda"))
    assert draft.prompt_gemm == prompt_gemm
    before = len(fake.launches)
    _draft_pass(draft)
    kernels = [k for k, *_ in fake.launches[before:]]
    prompt, decode = kernels.count("_cuda_matmul.matmul_prefill"), kernels.count("_cuda_matmul.matmul")
    # per layer: k, v of the context rows; q, k, v, out, gate/up (one merged weight), down of the
    # block rows; fc and the head
    n = len(draft.layers)
    assert prompt + decode == 1 + n * (2 + 4 + 2) + 1, kernels
    assert (prompt, decode) == ((prompt + decode, 0) if prompt_gemm else (0, prompt + decode))


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_prompt_gemm_changes_nothing_on_one_matmul_backends(monkeypatch, tmp_path, backend):
    logits = []
    for flag in ("0", "1"):
        monkeypatch.setenv("LUCE_DRAFT_PROMPT_GEMM", flag)
        _, draft = _pair(tmp_path, backend)
        assert draft.prompt_gemm == (flag == "1")
        logits.append(draft.backend.to_numpy(_draft_pass(draft)))
    assert logits[0].shape == (2 * 3, draft.config.vocab) and np.isfinite(logits[0]).all()
    assert np.array_equal(logits[0], logits[1])


def test_by_default_narrow_calls_of_a_few_lanes_stay_on_the_decode_family(monkeypatch, tmp_path):
    """Both variables unset, a backend whose prompt GEMM does not split k: prompt_gemm_min_n is
    PROMPT_GEMM_MIN_N (8,192), wider than every matmul of the tiny draft but its head's, so a pass
    of up to DECODE_ROWS_MAX rows multiplies them on the decode family; past DECODE_ROWS_MAX rows
    every call takes the prompt GEMM."""
    monkeypatch.delenv("LUCE_DRAFT_PROMPT_GEMM", raising=False)
    monkeypatch.delenv("LUCE_DRAFT_PROMPT_GEMM_MIN_N", raising=False)
    _, draft = _pair(tmp_path, "numpy")
    assert draft.prompt_gemm is None and draft.prompt_gemm_min_n == draft.PROMPT_GEMM_MIN_N == 8192
    wo, rows = draft.layers[0].attn.wo, draft.PROMPT_GEMM_ROWS
    wide = np.empty((8192, 1))
    assert draft.spans(rows, [np.empty((8191, 1))]) == ()
    assert draft.spans(rows, [wo]) == () and draft.spans(draft.DECODE_ROWS_MAX, [wo]) == ()
    assert draft.spans(rows, [wide]) == ((0, rows),) and draft.spans(rows - 1, [wide]) == ()
    assert draft.spans(draft.DECODE_ROWS_MAX + 1, [wo]) == ((0, draft.DECODE_ROWS_MAX + 1),)


@pytest.mark.parametrize("split_k, tune, want", [(4, None, 4096), (1, None, 8192), (4, "0", 8192), (4, "80", 8192)])
def test_the_default_min_width_follows_the_split(monkeypatch, tmp_path, split_k, tune, want):
    """LUCE_DRAFT_PROMPT_GEMM_MIN_N unset on the CUDA backend: PROMPT_GEMM_MIN_N_SPLIT (4,096) where
    luce_matmul_prefill_split_k says the prompt GEMM splits k for the draft's out projection and the
    prompt tune is 81 (the default), else PROMPT_GEMM_MIN_N (8,192): unsplit, the narrower calls lose."""
    from luce.ops import get_backend

    fake = install_fakes(monkeypatch, tmp_path, "cuda")
    fake.prefill_split_k = split_k
    monkeypatch.delenv("LUCE_DRAFT_PROMPT_GEMM", raising=False)
    monkeypatch.delenv("LUCE_DRAFT_PROMPT_GEMM_MIN_N", raising=False)
    if tune is None:
        monkeypatch.delenv("LUCE_DRAFT_PROMPT_TUNE", raising=False)
    else:
        monkeypatch.setenv("LUCE_DRAFT_PROMPT_TUNE", tune)
    _, draft = _pair(tmp_path, get_backend("cuda"))
    assert draft.prompt_gemm_min_n == want
    assert draft.PROMPT_GEMM_MIN_N_SPLIT == 4096 and draft.PROMPT_GEMM_MIN_N == 8192


def test_without_a_min_width_passes_of_enough_rows_take_the_prompt_gemm(monkeypatch, tmp_path):
    """LUCE_DRAFT_PROMPT_GEMM unset, LUCE_DRAFT_PROMPT_GEMM_MIN_N=0: a pass's matmuls take the
    prompt GEMM from PROMPT_GEMM_ROWS rows on (a block of one lane stays on the decode family,
    several lanes' blocks go over)."""
    from luce.ops import get_backend

    fake = install_fakes(monkeypatch, tmp_path, "cuda")
    monkeypatch.delenv("LUCE_DRAFT_PROMPT_GEMM", raising=False)
    monkeypatch.setenv("LUCE_DRAFT_PROMPT_GEMM_MIN_N", "0")
    _, draft = _pair(tmp_path, get_backend("cuda"))
    assert draft.prompt_gemm is None and draft.prompt_gemm_min_n == 0
    wo = [draft.layers[0].attn.wo]
    assert draft.spans(draft.PROMPT_GEMM_ROWS - 1, wo) == () and draft.spans(0, wo) == ()
    assert draft.spans(draft.PROMPT_GEMM_ROWS, wo) == ((0, draft.PROMPT_GEMM_ROWS),)
    monkeypatch.setattr(type(draft), "PROMPT_GEMM_ROWS", 2 * 4)   # two lanes' blocks of 4 rows
    counts = []
    for lanes in (1, 2):
        before = len(fake.launches)
        _draft_pass(draft, lanes)
        kernels = [k for k, *_ in fake.launches[before:]]
        counts.append((kernels.count("_cuda_matmul.matmul_prefill"), kernels.count("_cuda_matmul.matmul")))
    n = len(draft.layers)
    # one lane: 9 context rows (fc, k, v: prompt GEMM), a block of 4 rows (q, k, v, out, gate/up,
    # down and the head's 3 rows: decode); two lanes: 18 context and 8 block rows (prompt GEMM), the
    # head's 6 rows (decode)
    assert counts[0] == (1 + 2 * n, 6 * n + 1), counts
    assert counts[1] == (1 + 8 * n, 1), counts


def test_narrow_matmuls_stay_on_the_decode_family_with_a_min_width(monkeypatch, tmp_path):
    """LUCE_DRAFT_PROMPT_GEMM_MIN_N: in a pass of PROMPT_GEMM_ROWS..DECODE_ROWS_MAX rows, a call
    whose weights have fewer output rows in all stays on the decode family; wider ones, and every
    call of a pass of more rows, take the prompt GEMM. The tiny draft's widths: fc 256, context
    k|v 256, block q|k|v 512, out 256, gate|up 1,024, down 256, head 420."""
    from luce.ops import get_backend

    fake = install_fakes(monkeypatch, tmp_path, "cuda")
    monkeypatch.delenv("LUCE_DRAFT_PROMPT_GEMM", raising=False)
    monkeypatch.setenv("LUCE_DRAFT_PROMPT_GEMM_MIN_N", "420")
    _, draft = _pair(tmp_path, get_backend("cuda"))
    assert draft.prompt_gemm is None and draft.prompt_gemm_min_n == 420
    wo, head, rows = draft.layers[0].attn.wo, draft.head.output, draft.PROMPT_GEMM_ROWS
    assert draft.spans(rows, [wo]) == () and draft.spans(rows, [head]) == ((0, rows),)
    assert draft.spans(rows - 1, [head]) == ()                    # too few rows for the prompt GEMM
    assert draft.spans(129, [wo]) == ((0, 129),)                  # past DECODE_ROWS_MAX (128): any width
    monkeypatch.setattr(type(draft), "PROMPT_GEMM_ROWS", 2 * 4)   # two lanes' blocks of 4 rows

    def counts(lanes):
        before = len(fake.launches)
        _draft_pass(draft, lanes)
        kernels = [k for k, *_ in fake.launches[before:]]
        return kernels.count("_cuda_matmul.matmul_prefill"), kernels.count("_cuda_matmul.matmul")

    n = len(draft.layers)
    # two lanes: 18 context rows (fc, k|v: narrow, decode), 8 block rows (q|k|v and gate/up: prompt;
    # out and down: decode), the head's 6 rows (under PROMPT_GEMM_ROWS: decode)
    assert counts(2) == (4 * n, 2 + 4 * n)
    monkeypatch.setattr(type(draft), "DECODE_ROWS_MAX", 16)       # the 18 context rows: prompt GEMM
    assert counts(2) == (1 + 2 * n + 4 * n, 1 + 2 * n)


def test_a_bad_min_width_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("LUCE_DRAFT_PROMPT_GEMM_MIN_N", "wide")
    with pytest.raises(ValueError, match="LUCE_DRAFT_PROMPT_GEMM_MIN_N='wide': give a number"):
        _pair(tmp_path, "numpy")


@pytest.mark.parametrize("env, want, other_env, other_want",
                         [(None, 15, None, 0), ("0", 0, None, 0), ("14", 14, None, 0), (None, 15, "13", 13)])
def test_draft_k_and_v_take_their_decode_tune_past_16_rows(monkeypatch, tmp_path, env, want, other_env, other_want):
    """DFlashDraft.KV_DECODE_TUNE (LUCE_DRAFT_KV_TUNE): the decode-family calls of more than 16 rows
    of the draft's k and v projections pass that tune to luce_matmul (context rows and block
    rows alike); DECODE_TUNE (LUCE_DRAFT_DECODE_TUNE, default 0) the same for the draft's other
    matrices; the target's head, and calls of 16 rows or fewer, pass 0."""
    import inspect

    from luce import _cuda_matmul
    from luce.ops import get_backend
    from tests.ops import fake_hip

    signature = inspect.signature(_cuda_matmul.matmul)   # the wrapper's own, before the fake replaces it
    install_fakes(monkeypatch, tmp_path, "cuda")
    monkeypatch.setenv("LUCE_DRAFT_PROMPT_GEMM", "0")
    if env is not None:
        monkeypatch.setenv("LUCE_DRAFT_KV_TUNE", env)
    if other_env is not None:
        monkeypatch.setenv("LUCE_DRAFT_DECODE_TUNE", other_env)
    calls = fake_hip.spy_calls(monkeypatch, _cuda_matmul, "matmul", signature)
    _, draft = _pair(tmp_path, get_backend("cuda"))
    kv = {id(w) for layer in draft.layers for w in (layer.attn.wk, layer.attn.wv)}
    kv_ptrs = {w.ptr for layer in draft.layers for w in (layer.attn.wk, layer.attn.wv)}
    own_ptrs = {w.ptr for w in draft.own_weights()} - kv_ptrs
    assert len(kv) == 2 * len(draft.layers) and len(own_ptrs) == 1 + 4 * len(draft.layers)
    for lanes in (5, 3):   # 45 context rows and a block of 20 rows; 27 and 12
        del calls[:]
        _draft_pass(draft, lanes)
        rows = {"context": 9 * lanes, "block": draft.block_size * lanes}
        tunes = [(c["w"] in kv_ptrs, c["w"] in own_ptrs, c["rows"], c["tune"]) for c in calls]
        assert {(r, t) for is_kv, _, r, t in tunes if is_kv} == \
            {(n, want if n > 16 else 0) for n in rows.values()}, tunes
        own = {(r, t) for is_kv, is_own, r, t in tunes if is_own}
        assert own and own == {(r, other_want if r > 16 else 0) for _, is_own, r, _ in tunes if is_own}, tunes
        assert all(t == 0 for is_kv, is_own, _, t in tunes if not (is_kv or is_own)), tunes


@pytest.mark.parametrize("env, want", [(None, 81), ("80", 80), ("0", 0)])
def test_draft_prompt_gemm_calls_take_the_prompt_tune(monkeypatch, tmp_path, env, want):
    """DFlashDraft.PROMPT_TUNE (LUCE_DRAFT_PROMPT_TUNE, default 81): every prompt-GEMM call of the
    draft's own weights passes that tune to luce_matmul_prefill; the target's head passes 0."""
    import inspect

    from luce import _cuda_matmul
    from luce.ops import get_backend
    from tests.ops import fake_hip

    signature = inspect.signature(_cuda_matmul.matmul_prefill)
    install_fakes(monkeypatch, tmp_path, "cuda")
    monkeypatch.setenv("LUCE_DRAFT_PROMPT_GEMM", "1")
    if env is not None:
        monkeypatch.setenv("LUCE_DRAFT_PROMPT_TUNE", env)
    calls = fake_hip.spy_calls(monkeypatch, _cuda_matmul, "matmul_prefill", signature)
    _, draft = _pair(tmp_path, get_backend("cuda"))
    own_ptrs = {w.ptr for w in draft.own_weights()}
    _draft_pass(draft, 3)
    own = [c["tune"] for c in calls if c["w"] in own_ptrs]
    head = [c["tune"] for c in calls if c["w"] not in own_ptrs]
    assert len(own) == 1 + 8 * len(draft.layers) and len(head) == 1, calls
    assert set(own) == {want} and head == [0], calls


def test_a_bad_switch_value_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("LUCE_DRAFT_PROMPT_GEMM", "yes")
    with pytest.raises(ValueError, match="LUCE_DRAFT_PROMPT_GEMM='yes': give 1 .*, 0 .*, or unset it"):
        _pair(tmp_path, "numpy")


@pytest.mark.parametrize("name", ["LUCE_DRAFT_KV_TUNE", "LUCE_DRAFT_DECODE_TUNE", "LUCE_DRAFT_PROMPT_TUNE"])
def test_a_bad_tune_is_named(monkeypatch, tmp_path, name):
    monkeypatch.setenv(name, "fast")
    with pytest.raises(ValueError, match=f"{name}='fast': give a luce_matmul tune"):
        _pair(tmp_path, "numpy")
