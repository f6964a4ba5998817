"""Token log-probs in OpenAI's shapes (luce.engine.request.TokenLogprob entries: the verified
target's log_softmax of the row that chose each token).

    chat:        {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}],
                  "refusal": None}
    completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}
"""
from __future__ import annotations


def token_text(tokenizer, token_id: int) -> tuple[str, list[int]]:
    """(the token's text, its UTF-8 bytes): a token that cuts a character shows U+FFFD."""
    raw = tokenizer.token_bytes(int(token_id))
    return raw.decode("utf-8", errors="replace"), list(raw)


def _entry(tokenizer, token_id: int, logprob: float) -> dict:
    text, raw = token_text(tokenizer, token_id)
    return {"token": text, "logprob": logprob, "bytes": raw}


def chat_logprobs(entries, tokenizer) -> dict | None:
    """choices[i].logprobs of a chat completion (or of one stream chunk); None when not asked."""
    if entries is None:
        return None
    return {"content": [{**_entry(tokenizer, e.token_id, e.logprob),
                         "top_logprobs": [_entry(tokenizer, t, lp) for t, lp in e.top]} for e in entries],
            "refusal": None}


def text_logprobs(entries, tokenizer, offset: int = 0) -> dict | None:
    """choices[i].logprobs of a text completion; text_offset counts characters from `offset`."""
    if entries is None:
        return None
    tokens, offsets, top = [], [], []
    for e in entries:
        text = token_text(tokenizer, e.token_id)[0]
        offsets.append(offset)
        offset += len(text)
        tokens.append(text)
        top.append({token_text(tokenizer, t)[0]: lp for t, lp in e.top})
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries], "top_logprobs": top,
            "text_offset": offsets}
