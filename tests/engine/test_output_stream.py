"""OutputStream, the one stop rule (the engine applies it, the server renders it): detokenized
deltas, stop strings across tokens, stop ids, end of generation, max_tokens, UTF-8, several
tokens per step (speculation) cut at the finishing one."""
from __future__ import annotations

import pytest

from luce.engine.output_stream import OutputStream
from luce.engine.sampler import SamplingParams
from tests.server.conftest import tiny_tokenizer


class Run:
    """An OutputStream fed like the engine feeds it, several tokens per step."""

    def __init__(self, tok, **kw):
        kw.setdefault("max_tokens", 10_000)
        self.out = OutputStream(SamplingParams(**kw), tokenizer=tok, eos_ids=tok.eot_ids)
        self.n_tokens = 0

    @property
    def finish_reason(self):
        return self.out.finish_reason

    @property
    def finished(self):
        return self.out.finished

    @property
    def text(self):
        return self.out.text


def run(ids, per_push=1, **kw):
    asm = Run(tiny_tokenizer(), **kw)
    deltas = []
    for i in range(0, len(ids), per_push):
        asm.n_tokens += len(asm.out.add_many(ids[i:i + per_push]))
        deltas.append(asm.out.take_delta())
        if asm.finished:
            break
    if not asm.finished:
        asm.out.finish("stop")
        deltas.append(asm.out.take_delta())
    return asm, deltas


TEXT = "The quick brown fox jumps over the lazy dog."


@pytest.mark.parametrize("per_push", [1, 2, 3, 7])
def test_plain_text_round_trips_and_counts_every_token(per_push):
    ids = tiny_tokenizer().encode(TEXT)
    asm, deltas = run(ids, per_push)
    assert "".join(deltas) == TEXT == asm.text
    assert asm.n_tokens == len(ids)


@pytest.mark.parametrize("per_push", [1, 4])
@pytest.mark.parametrize("stop", ["fox", "x j", "lazy dog.", "T", "brown fox jumps"])
def test_stop_string_cuts_text_and_counts_tokens_up_to_the_completing_one(stop, per_push):
    tok = tiny_tokenizer()
    ids = tok.encode(TEXT)
    # the first n such that the first n tokens' text contains the stop string
    n_expected = next(n for n in range(1, len(ids) + 1) if stop in tok.decode(ids[:n]))
    asm, deltas = run(ids, per_push, stop=(stop,))
    assert asm.finish_reason == "stop"
    assert "".join(deltas) == TEXT[: TEXT.index(stop)]
    assert asm.n_tokens == n_expected


def test_text_that_could_start_a_stop_string_is_held_then_released():
    tok = tiny_tokenizer()
    ids = tok.encode(TEXT)
    asm, deltas = run(ids, stop=("fox!",))      # "fox" occurs, "fox!" never does
    assert "".join(deltas) == TEXT
    assert asm.finish_reason == "stop"          # finished from outside (run() calls finish)
    # while "fox" was pending nothing after "brown " had been released
    released = ""
    for d in deltas:
        released += d
        assert not released.endswith("fo") and not released.endswith("fox")


def test_earliest_of_several_stop_strings_wins():
    asm, deltas = run(tiny_tokenizer().encode(TEXT), stop=("lazy", "quick"))
    assert "".join(deltas) == "The "


def test_eos_token_ends_generation_and_counts_but_never_shows():
    tok = tiny_tokenizer()
    ids = tok.encode("abc") + [tok.eos_id] + tok.encode("def")
    asm, deltas = run(ids)
    assert "".join(deltas) == "abc" and asm.finish_reason == "stop"
    assert asm.n_tokens == len(tok.encode("abc")) + 1


def test_ignore_eos_keeps_going_and_stop_token_ids_end():
    tok = tiny_tokenizer()
    ids = tok.encode("abc") + [tok.eos_id] + tok.encode("def")
    asm, deltas = run(ids, ignore_eos=True)
    assert "".join(deltas) == "abcdef"
    stop_id = tok.encode("def")[0]
    asm, deltas = run(ids, ignore_eos=True, stop_token_ids=(stop_id,))
    assert "".join(deltas) == "abc"


@pytest.mark.parametrize("per_push", [1, 3])
def test_max_tokens_truncates_a_multi_token_push(per_push):
    tok = tiny_tokenizer()
    ids = tok.encode(TEXT)
    asm, deltas = run(ids, per_push, max_tokens=5)
    assert asm.finish_reason == "length" and asm.n_tokens == 5
    assert "".join(deltas) == tok.decode(ids[:5])


def test_multibyte_characters_are_never_split():
    tok = tiny_tokenizer()
    text = "héllo 🙂 wörld ✓"
    ids = tok.encode(text)
    assert len(tok.encode("🙂")) > 1          # the emoji really spans several tokens
    asm, deltas = run(ids)
    assert "".join(deltas) == text
    for d in deltas:
        assert "\ufffd" not in d              # no partial character was ever released


def test_pushes_after_finish_are_ignored():
    tok = tiny_tokenizer()
    asm = Run(tok, max_tokens=2)
    assert len(asm.out.add_many(tok.encode("abcdef"))) == 2 and asm.finished
    text = asm.out.take_delta()
    assert asm.out.add_many(tok.encode("xyz")) == [] and asm.out.take_delta() == ""
    assert asm.out.token_ids == tok.encode("abcdef")[:2] and asm.text == text
