"""Request finish rules and streamed text: stop strings (held back, cut), stop ids, EOS,
max_tokens, context length, UTF-8-whole deltas that add up to the final text."""
import pytest

from luce.engine.request import FinishReason, Request
from luce.engine.sampler import SamplingParams
from luce.testing.tiny_models import make_qwen35
from luce.tokenizer import Tokenizer

TEXT = "héllo 😀 world. bye"


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "m.gguf"
    make_qwen35(path, seed=0)
    return Tokenizer.from_gguf(path)


def feed(tok, params, ids=None, ctx=4096, prompt=(1,)):
    r = Request("r", list(prompt), params, 0, tokenizer=tok, eos_ids=tok.eot_ids, ctx=ctx)
    deltas = []
    for t in tok.encode(TEXT) if ids is None else ids:
        if r.finished:
            break
        r.add_tokens([t])
        deltas.append(r.take_delta())
    deltas.append(r.take_delta())
    return r, deltas


def test_deltas_are_whole_characters_and_add_up(tok):
    r, deltas = feed(tok, SamplingParams(max_tokens=100))
    assert "".join(deltas) == r.text == TEXT
    assert all("\ufffd" not in d for d in deltas)
    assert "" in deltas          # a partial multi-byte character produced no text yet
    assert r.finish_reason is None


def test_stop_string_across_tokens_is_cut_and_never_streamed(tok):
    r, deltas = feed(tok, SamplingParams(max_tokens=100, stop=("ld. b",)))
    assert r.finish_reason == FinishReason.STOP and r.stop_reason == "ld. b"
    # deltas only ever append, so adding up to the cut text means nothing past the cut was sent
    assert r.text == "héllo 😀 wor" == "".join(deltas)


def test_prefix_of_a_stop_string_is_released_when_it_cannot_match(tok):
    r, deltas = feed(tok, SamplingParams(max_tokens=100, stop=("worlds",)))
    assert r.finish_reason is None and "".join(deltas) == TEXT
    sent = ""
    for d in deltas:
        sent += d
        assert not sent.endswith(" world")   # " world" could have become "worlds": held back then


def test_stop_token_eos_and_ignore_eos(tok):
    eos = tok.eos_id
    r, _ = feed(tok, SamplingParams(max_tokens=10, stop_token_ids=(102,)), ids=[71, 102, 75])
    assert r.finish_reason == FinishReason.STOP and r.stop_reason == 102 and r.output_ids == [71, 102]
    r, _ = feed(tok, SamplingParams(max_tokens=10), ids=[71, eos, 75])
    assert r.finish_reason == FinishReason.STOP and r.stop_reason is None and r.text == "h"
    r, _ = feed(tok, SamplingParams(max_tokens=3, ignore_eos=True), ids=[71, eos, 75, 75])
    assert r.finish_reason == FinishReason.LENGTH and r.output_ids == [71, eos, 75]


def test_length_by_max_tokens_and_by_context(tok):
    r, _ = feed(tok, SamplingParams(max_tokens=2))
    assert r.finish_reason == FinishReason.LENGTH and len(r.output_ids) == 2
    r, _ = feed(tok, SamplingParams(max_tokens=50), ctx=5, prompt=(1, 2))
    assert r.finish_reason == FinishReason.LENGTH and r.n_tokens == 5


def test_unfinished_character_is_flushed_at_finish(tok):
    r, deltas = feed(tok, SamplingParams(max_tokens=2), ids=[71, 127])   # "h" + first byte of "é"
    assert r.text == "h\ufffd" and "".join(deltas) == r.text
