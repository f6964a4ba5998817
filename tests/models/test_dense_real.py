"""Dense qwen2 on the real Qwen2.5-Coder Q4_K_M files (skipped when absent; `make models`).

- 0.5B: greedy continuations of code prompts, token for token.
- 1.5B (`real`): the first 32 greedy tokens equal those of transformers loading the same
  GGUF (`from_pretrained(dir, gguf_file=...)` dequantizes it to float32).
"""
from __future__ import annotations

import gc
import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

from luce.models import SegmentSpec, build_batch, generate_greedy, load_model

MODEL_05B = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
MODEL_15B = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"


def real_model(name: str) -> Path:
    for root in (os.environ.get("LUCE_MODELS"), Path.home() / ".cache" / "luce" / "models"):
        if root and (Path(root) / name).is_file():
            return Path(root) / name
    pytest.skip(f"{name} not in $LUCE_MODELS or ~/.cache/luce/models (make models)")


@pytest.fixture(scope="module")
def model_05b():
    path = real_model(MODEL_05B)
    from luce.tokenizer import Tokenizer

    return load_model(path, "numpy"), Tokenizer.from_gguf(path)


def test_05b_fib_return_continuation(model_05b):
    """MODELS.md's fact: greedy (no chat template, no BOS) writes the one-line Fibonacci. The
    continuation ' n if n <= 1 ...' follows 'return', so the prompt ends with it."""
    model, tok = model_05b
    want = " n if n <= 1 else fib(n-1) + fib(n-2)"
    n = len(tok.encode(want))
    got = generate_greedy(model, tok.encode("def fib(n):\n    return"), n)
    # the last ')' may merge with what follows (')\n\n' is one token), so compare text
    assert tok.decode(got).startswith(want)
    assert got[:n - 1] == tok.encode(want)[:n - 1]


def test_05b_fib_signature_continuation_matches_transformers(model_05b):
    """On 'def fib(n):' itself, transformers 5.24 (float32, the same GGUF dequantized) writes
    these 22 tokens greedily: '\\n    if n <= 1:\\n        return n\\n    else:\\n        return fib(n-1)'."""
    model, tok = model_05b
    prompt = tok.encode("def fib(n):")
    assert prompt == [750, 15801, 1445, 1648]
    transformers_tokens = [198, 262, 421, 308, 2651, 220, 16, 510, 286, 470, 308, 198, 262, 770, 510,
                           286, 470, 15801, 1445, 12, 16, 8]
    assert generate_greedy(model, prompt, len(transformers_tokens)) == transformers_tokens


PROMPT_15B = "# Return the n-th Fibonacci number, iteratively.\ndef fib(n):"
N_GREEDY = 32


def transformers_greedy(path: Path, prompt: list[int], n: int) -> tuple[list[int], np.ndarray]:
    """transformers' greedy tokens and its teacher-forced logits [len(prompt) + n - 1, V]."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    if importlib.util.find_spec("accelerate") is None:
        pytest.skip("transformers needs accelerate to load a GGUF (pip install accelerate)")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    try:
        with torch.no_grad():
            ids = torch.tensor([prompt])
            out = model.generate(ids, max_new_tokens=n, do_sample=False, num_beams=1,
                                 attention_mask=torch.ones_like(ids))
            tokens = out[0, len(prompt):].tolist()
            logits = model(input_ids=out[:, :-1]).logits[0].float().numpy()
    finally:
        del model
        gc.collect()
    return tokens, logits


@pytest.mark.real
def test_15b_first_32_greedy_tokens_match_transformers():
    path = real_model(MODEL_15B)
    from luce.tokenizer import Tokenizer

    prompt = Tokenizer.from_gguf(path).encode(PROMPT_15B)
    hf_tokens, hf_logits = transformers_greedy(path, prompt, N_GREEDY)
    model = load_model(path, "numpy")
    got = generate_greedy(model, prompt, N_GREEDY)
    full = prompt + got[:-1]
    state = model.new_state(max_pages=4, max_slots=1)
    logits = model.forward(build_batch([SegmentSpec(0, full, 0, [0, 1, 2, 3], logits="all")]), state).logits
    diff = float(np.abs(logits - hf_logits).max())
    print(f"1.5B: max |logit - transformers| over {len(full)} rows = {diff:.3g}")
    assert got == hf_tokens
    assert diff < 1e-4 * max(1.0, float(np.abs(hf_logits).max()))  # measured 3.6e-5
