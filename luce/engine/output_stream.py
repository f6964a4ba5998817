"""One request's output as it grows: tokens in; visible text and the finish out. This is the
one stop and end-of-generation rule: the engine applies it to every token it emits, and the
server only renders what it decided (luce.server.bridge).

Finish rules, checked after every token, in order: a stop token id (`stop_reason` = the id),
an end-of-generation token (unless ignore_eos), a stop string (`stop_reason` = the string;
the text ends before it), max_tokens, the context length. Tokens after the finishing one
are not taken. Text is decoded incrementally (luce.detokenize.StreamDecoder, so every delta
is whole UTF-8 characters); while the output runs, text that could still turn into the start
of a stop string is held back from deltas.
"""
from __future__ import annotations

STOP, LENGTH = "stop", "length"


class OutputStream:
    def __init__(self, params, *, tokenizer=None, eos_ids=(), max_total: int | None = None, n_prompt: int = 0):
        """params: luce.engine.sampler.SamplingParams (max_tokens, stop, stop_token_ids,
        ignore_eos); tokenizer: text and stop strings (None: ids only); max_total: the
        context length, counting the n_prompt prompt tokens."""
        self.params = params
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self._eos = frozenset() if params.ignore_eos else frozenset(int(t) for t in eos_ids)
        self._stop_ids = frozenset(params.stop_token_ids)
        self._max_total, self._n_prompt = max_total, n_prompt
        self._decoder = None
        if tokenizer is not None:
            from luce.detokenize import StreamDecoder

            self._decoder = StreamDecoder(tokenizer)
        self._text = ""
        self._emitted = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def text(self) -> str:
        """Text so far (final once finished); stop strings already cut."""
        return self._text

    def add(self, token: int) -> bool:
        """Take one token unless finished; True when it finished the output."""
        if self.finish_reason is not None:
            return False
        token = int(token)
        self.token_ids.append(token)
        if token in self._stop_ids:
            self.finish(STOP, stop_reason=token)
        elif token in self._eos:
            self.finish(STOP)
        else:
            if self._decoder is not None:
                before = len(self._text)
                self._text += self._decoder.push(token)
                if self._match_stop_string(before):
                    return True
            if self.length_left() <= 0:
                self.finish(LENGTH)
        return self.finish_reason is not None

    def length_left(self) -> int:
        """Tokens the output may still take before max_tokens or the context ends it."""
        n = len(self.token_ids)
        left = self.params.max_tokens - n
        return left if self._max_total is None else min(left, self._max_total - self._n_prompt - n)

    def add_many(self, tokens) -> list[int]:
        """Take tokens in order up to the one that finishes; returns those taken."""
        taken = []
        for t in tokens:
            if self.finish_reason is not None:
                break
            self.add(t)
            taken.append(self.token_ids[-1])
        return taken

    def _match_stop_string(self, before: int) -> bool:
        stops = self.params.stop
        if not stops:
            return False
        lo = max(0, before - max(len(s) for s in stops) + 1)
        hits = [(i, s) for s in stops if (i := self._text.find(s, lo)) >= 0]
        if not hits:
            return False
        index, stop = min(hits)
        self._text = self._text[:index]
        self.finish(STOP, stop_reason=stop, flush=False)
        return True

    def finish(self, reason: str, *, stop_reason=None, flush: bool = True) -> None:
        """End the output (a rule above, or from outside: cancelled, error)."""
        if self.finished:
            return
        if flush and self._decoder is not None:
            self._text += self._decoder.flush()
        self.finish_reason = reason
        self.stop_reason = stop_reason

    def _visible_len(self) -> int:
        if self.finish_reason is not None or not self.params.stop:
            return len(self._text)
        hold = 0
        for s in self.params.stop:
            for k in range(min(len(s) - 1, len(self._text)), hold, -1):
                if self._text.endswith(s[:k]):
                    hold = k
                    break
        return len(self._text) - hold

    def take_delta(self) -> str:
        """Text not yet returned by take_delta that can no longer change."""
        end = max(self._emitted, self._visible_len())
        delta = self._text[self._emitted:end]
        self._emitted = end
        return delta
