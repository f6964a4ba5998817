"""Streaming detokenization: token ids in, text out, never a broken UTF-8 character.

A byte-level token can end in the middle of a multi-byte character (an emoji is often split
over two or three tokens), so bytes are held until the character is complete. Bytes that can
never become valid UTF-8 are emitted as U+FFFD as soon as that is certain, so a stray
invalid byte does not stall the stream; `flush()` replaces an unfinished tail the same way.
The concatenation of every push() and the final flush() equals
`tokenizer.decode(ids, skip_special)`.
"""
from __future__ import annotations

import codecs


class StreamDecoder:
    """Incremental text for one generation stream (not thread-safe; one per stream)."""

    def __init__(self, tokenizer, skip_special: bool = True):
        self.tokenizer = tokenizer
        self.skip_special = skip_special
        # The incremental decoder keeps an incomplete trailing sequence (at most 3 bytes)
        # between calls and replaces bytes that cannot start or continue a character.
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """Text completed by this token ('' while a character is still partial)."""
        token_id = int(token_id)
        if self.skip_special and self.tokenizer.is_special(token_id):
            return ""
        return self._utf8.decode(self.tokenizer.token_bytes(token_id))

    def push_many(self, token_ids) -> str:
        return "".join(self.push(t) for t in token_ids)

    @property
    def pending_bytes(self) -> bytes:
        """Bytes held back because they may start a character not yet complete."""
        return self._utf8.getstate()[0]

    def flush(self) -> str:
        """Everything still held; an unfinished character becomes U+FFFD. Resets the stream."""
        out = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return out
