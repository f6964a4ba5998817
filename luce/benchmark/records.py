"""What the client records about one streamed request, and the per-token times derived from it.

All times are `time.perf_counter()` seconds of the benchmarking process. A "chunk" is one SSE
event that carried output text; `chunk_times[j]` is when the client read it off the socket.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestRecord:
    key: str                           # digest key: f"{prompt id}|max_tokens={M}"
    prompt_id: str
    max_tokens: int
    send_time: float = 0.0             # just before the request bytes were written
    chunk_times: list[float] = field(default_factory=list)
    chunk_texts: list[str] = field(default_factory=list)
    completion_tokens: int | None = None   # from the server's usage, when it sends one
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    end_time: float = 0.0              # the stream ended ([DONE], EOF or error)

    @property
    def text(self) -> str:
        return "".join(self.chunk_texts)

    @property
    def ok(self) -> bool:
        """Complete: no error, the stream finished and some output arrived."""
        return self.error is None and bool(self.chunk_times)

    @property
    def n_tokens(self) -> int:
        """Output tokens: the server's usage count, else one per text chunk."""
        if self.completion_tokens is not None:
            return self.completion_tokens
        return len(self.chunk_times)

    @property
    def token_source(self) -> str:
        """"usage" (server-reported count) or "chunks" (one token per chunk assumed)."""
        return "usage" if self.completion_tokens is not None else "chunks"

    @property
    def first_token_time(self) -> float | None:
        return self.chunk_times[0] if self.chunk_times else None

    @property
    def last_token_time(self) -> float | None:
        return self.chunk_times[-1] if self.chunk_times else None

    def tokens_per_chunk(self) -> list[int]:
        """How many of the n_tokens output tokens each chunk carried.

        Exact when the count equals the number of chunks (one token per chunk). Otherwise (a
        server that sends several tokens per event, e.g. with speculation, or holds text
        back) the tokens are shared out in proportion to the chunk's characters: after chunk
        j the cumulative count is round(n * chars_so_far / all_chars), at least 1 after the
        first chunk, never decreasing, and exactly n after the last."""
        n, k = self.n_tokens, len(self.chunk_times)
        if k == 0:
            return []
        if n == k:
            return [1] * k
        lengths = [len(t) for t in self.chunk_texts]
        total = sum(lengths)
        cumulative, out, chars, previous = 0, [], 0, 0
        for j, length in enumerate(lengths):
            chars += length
            if j == k - 1:
                cumulative = n
            else:
                share = (n * chars + total // 2) // total if total else 0   # round half up
                cumulative = min(n, max(previous, share, 1))
            out.append(cumulative - previous)
            previous = cumulative
        return out

    def token_times(self) -> list[float]:
        """One arrival time per output token (length n_tokens): each chunk's time repeated
        by its token count (tokens_per_chunk)."""
        out: list[float] = []
        for t, count in zip(self.chunk_times, self.tokens_per_chunk()):
            out.extend([t] * count)
        return out

    def to_json(self, origin: float = 0.0, with_text: bool = False) -> dict:
        """A JSON-able summary; times relative to `origin`."""
        rel = [round(t - origin, 6) for t in self.chunk_times]
        out = {
            "key": self.key, "prompt_id": self.prompt_id, "max_tokens": self.max_tokens,
            "send_s": round(self.send_time - origin, 6), "end_s": round(self.end_time - origin, 6),
            "chunk_times_s": rel, "chunk_tokens": self.tokens_per_chunk(),
            "n_tokens": self.n_tokens, "token_source": self.token_source,
            "prompt_tokens": self.prompt_tokens, "finish_reason": self.finish_reason, "error": self.error,
        }
        if with_text:
            out["text"] = self.text
        return out
