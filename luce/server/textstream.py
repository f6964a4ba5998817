"""Token ids -> text deltas for one request, with stop strings, stop tokens and max_tokens.

The engine hands out token ids (several per step with speculation). `OutputAssembler.push`
turns them into the text a client may see now: it detokenizes without splitting UTF-8
characters, holds back a tail that could be the start of a stop string, and ends the
generation at the first end-of-generation token, stop token, completed stop string or the
`max_tokens`-th token. Tokens after the finishing one (the rest of a speculative step)
are dropped and not counted.
"""
from __future__ import annotations

from dataclasses import dataclass

from luce.detokenize import StreamDecoder


@dataclass(frozen=True)
class Piece:
    text: str                       # text the client may see now ('' is possible)
    n_tokens: int                   # tokens of this push that count as generated
    finish_reason: str | None       # "stop" | "length" once finished, else None


class OutputAssembler:
    """Incremental text for one generation (not thread-safe; one per request)."""

    def __init__(self, tokenizer, *, max_tokens: int, stop: tuple[str, ...] = (),
                 stop_token_ids: tuple[int, ...] = (), ignore_eos: bool = False):
        self._decoder = StreamDecoder(tokenizer, skip_special=True)
        self._stop = tuple(s for s in stop if s)
        self._stop_ids = frozenset(stop_token_ids) | (frozenset() if ignore_eos else frozenset(tokenizer.eot_ids))
        self._max_tokens = max_tokens
        self._held = ""                 # decoded text not yet released (a possible stop prefix)
        self.n_tokens = 0
        self.finish_reason: str | None = None
        self.stop_string: str | None = None   # the stop string that ended the text, if one did
        self.text = ""                  # everything released so far

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def push(self, token_ids) -> Piece:
        """Consume new token ids; returns what to send. After a finish, pushes are ignored."""
        if self.finished:
            return Piece("", 0, None)
        out: list[str] = []
        counted = 0
        for tok in token_ids:
            counted += 1
            self.n_tokens += 1
            if int(tok) in self._stop_ids:
                self._finish("stop", out, flush=True)
                break
            self._held += self._decoder.push(tok)
            if self._cut_at_stop(out):
                self._finish("stop", out, flush=False)
                break
            if self.n_tokens >= self._max_tokens:
                self._finish("length", out, flush=True)
                break
            keep = self._stop_prefix_len(self._held)
            if keep < len(self._held):
                out.append(self._held[: len(self._held) - keep])
                self._held = self._held[len(self._held) - keep:]
        text = "".join(out)
        self.text += text
        return Piece(text, counted, self.finish_reason)

    def finish(self, reason: str) -> Piece:
        """End from outside (engine said so, or cancelled): release held text, set the reason."""
        if self.finished:
            return Piece("", 0, None)
        out: list[str] = []
        self._finish(reason, out, flush=True)
        text = "".join(out)
        self.text += text
        return Piece(text, 0, reason)

    # ------------------------------------------------------------------ internals

    def _finish(self, reason: str, out: list[str], flush: bool) -> None:
        if flush:
            self._held += self._decoder.flush()
            if self._cut_at_stop(out):  # only if a stop string itself contains U+FFFD
                reason = "stop"
            else:
                out.append(self._held)
            self._held = ""
        self.finish_reason = reason

    def _cut_at_stop(self, out: list[str]) -> bool:
        """If a stop string occurs in the held text, release the text before it and say so."""
        if not self._stop:
            return False
        hits = [(i, s) for s in self._stop if (i := self._held.find(s)) >= 0]
        if not hits:
            return False
        first, self.stop_string = min(hits)
        out.append(self._held[:first])
        self._held = ""
        return True

    def _stop_prefix_len(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
        best = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best
