"""The offline Python API, in the spirit of vLLM's `LLM`:

    from luce import LLM, SamplingParams
    llm = LLM("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")            # a path or a cached model name
    outs = llm.generate(["def fib(n):", "import numpy"], SamplingParams(max_tokens=32))
    fast = LLM("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
               draft="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", spec="ddtree")   # same output, faster
    print(outs[0].text, outs[0].finish_reason)                      # also outs[0].outputs[0].text (vLLM)
    outs = llm.generate("def fib(n):", SamplingParams(n=2, seed=1, logprobs=3, temperature=0.8))
    outs[0].outputs[1].text, outs[0].outputs[0].logprobs[0]         # {token id: Logprob} per token
    for piece in llm.stream("def fib(n):", SamplingParams(max_tokens=32)):
        print(piece, end="")                                         # whole UTF-8 characters
    out = llm.chat([{"role": "user", "content": "Weather in Paris?"}], tools=[...])[0]
    out.outputs[0].tool_calls, out.outputs[0].content, out.outputs[0].reasoning_content

All prompts of one `generate` call run together (continuous batching over `max_slots`
slots); each request's output is the same as it would be alone.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Iterator, Sequence

from luce.engine.engine import Engine, EngineConfig
from luce.engine.request import FinishReason, RequestOutput
from luce.engine.sampler import SamplingParams
from luce.engine.slots import QueueFull
from luce.spec.config import DRAFT_VOCAB


@dataclass(frozen=True)
class Logprob:
    """vLLM's Logprob: a token's log-prob under the target, its rank among the top entries
    (1 = most likely; None when it is not among them) and its text."""
    logprob: float
    rank: int | None
    decoded_token: str


@dataclass
class CompletionOutput:
    """One generated sequence, as vLLM's `RequestOutput.outputs[i]`; chat() also fills the
    parsed content, reasoning and tool calls (luce.server.tool_calls.ToolCall). logprobs
    (SamplingParams.logprobs = k): per token, {token id: Logprob} of the chosen token and
    the k most likely."""
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: str | int | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float | None = None


def _vllm_logprobs(entries, tokenizer) -> list[dict[int, Logprob]] | None:
    if entries is None:
        return None
    text = lambda t: tokenizer.decode([t]) if tokenizer is not None else ""  # noqa: E731
    out = []
    for e in entries:
        ranked = {t: Logprob(lp, rank, text(t)) for rank, (t, lp) in enumerate(e.top, 1)}
        ranked.setdefault(e.token_id, Logprob(e.logprob, None, text(e.token_id)))
        out.append(ranked)
    return out


@dataclass
class LLMOutput(RequestOutput):
    """The engine's RequestOutput of the first sequence (`.text`, `.token_ids`, ...) with
    vLLM's `.outputs` (n sequences) beside it."""
    outputs: list[CompletionOutput] = field(default_factory=list)

    @classmethod
    def of(cls, out: RequestOutput, others: Sequence[RequestOutput] = (), tokenizer=None) -> "LLMOutput":
        result = cls(**{f.name: getattr(out, f.name) for f in fields(RequestOutput)})
        result.outputs = [CompletionOutput(i, o.text, list(o.token_ids), o.finish_reason, o.stop_reason,
                                           logprobs=_vllm_logprobs(o.logprobs, tokenizer),
                                           cumulative_logprob=None if o.logprobs is None else
                                           sum(e.logprob for e in o.logprobs))
                          for i, o in enumerate([out, *others])]
        return result


class GenerationError(RuntimeError):
    """A streamed request ended with an error (the engine retired its step's cohort)."""


def resolve_model_path(model) -> Path:
    """A GGUF path as given, or the cached file of a model name (luce.fetch.find_model)."""
    path = Path(model).expanduser()
    if path.is_file():
        return path
    if path.name == str(model):
        from luce.fetch import find_model

        found = find_model(str(model))
        if found is not None:
            return found
    raise FileNotFoundError(f"no model file {model!r}: pass a GGUF path, or fetch the model first "
                            "(python tools/fetch_models.py, or `make models`)")


class LLM:
    def __init__(self, model_path, draft=None, backend="auto", max_slots: int = 5, ctx: int = 4096,
                 token_budget: int | None = None, kv_pages: int | None = None, seed: int = 0, *, spec: str | None = None,
                 draft_kind: str | None = None, ddtree_budget: int = 22, ddtree_tau: float = 6.0,
                 spec_top_k: int = 4, draft_max: int = 8, draft_min: int | None = 0,
                 draft_vocab: int = DRAFT_VOCAB, prefix_cache: bool = True, cache_memory: int = 4 << 30,
                 **engine_options):
        """Load a GGUF model (and its tokenizer) on `backend` ('auto': CUDA when a GPU and the
        kernel library are there, else the cpu backend's C kernels, else numpy; or a Backend) and start an engine.
        Speculative decoding (luce.spec.config): `draft` (a path or cached model name) turns it
        on in chain mode unless `spec` says otherwise; draft_kind='ngram' needs no draft.
        prefix_cache: reuse cached prompt prefixes across requests (KV pages, recurrent snapshots)
        within cache_memory bytes. `engine_options` are further EngineConfig fields (max_queue, pad_steps, ...)."""
        from luce.models.loader import load_model
        from luce.spec.config import resolve_spec_config
        from luce.tokenizer import Tokenizer

        draft_path = resolve_model_path(draft) if draft is not None else None
        spec_config = resolve_spec_config(spec, draft_path, draft_kind, ddtree_budget=ddtree_budget,
                                          ddtree_tau=ddtree_tau, spec_top_k=spec_top_k, chain_depth=draft_max,
                                          draft_min=None if draft_min is None else min(draft_min, draft_max),
                                          draft_vocab=draft_vocab)
        path = resolve_model_path(model_path)
        self.model_path = path
        self.model = load_model(path, backend)
        self.tokenizer = Tokenizer.from_gguf(path)
        limit = int(getattr(self.model.config, "context_length", 0) or 0)
        if limit and ctx > limit:
            raise ValueError(f"ctx {ctx} exceeds the model's context length {limit}")
        config = EngineConfig(max_slots=max_slots, ctx=ctx, token_budget=token_budget, kv_pages=kv_pages,
                              seed=seed, spec=spec_config, prefix_cache=prefix_cache, cache_memory=cache_memory,
                              **engine_options)
        self.engine = Engine(self.model, self.tokenizer, config)

    @property
    def stats(self):
        return self.engine.stats

    def encode(self, prompt) -> list[int]:
        """Token ids of a prompt given as text or as ids."""
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_bos=self.tokenizer.adds_bos)
        return [int(t) for t in prompt]

    def _submit(self, prompt, params: SamplingParams):
        text = prompt if isinstance(prompt, str) else None
        return self.engine.add_request(self.encode(prompt), params, prompt_text=text)

    def generate(self, prompts, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None
                 ) -> list[LLMOutput]:
        """Run every prompt (a str, a list of str, or token id lists) to completion; outputs in
        prompt order. Errors and cancellations show as finish_reason, not exceptions."""
        prompts = _as_prompt_list(prompts)
        params = _as_params_list(sampling_params, len(prompts))
        waiting = [((i, j), prompt, _choice(p, j)) for i, (prompt, p) in enumerate(zip(prompts, params))
                   for j in range(p.n)]
        ids: dict[tuple[int, int], object] = {}
        try:
            while waiting or any(not self.engine.get(rid).finished for rid in ids.values()):
                while waiting:
                    try:
                        ids[waiting[0][0]] = self._submit(waiting[0][1], waiting[0][2])
                    except QueueFull:
                        break
                    waiting.pop(0)
                self.engine.step()
            outs = []
            for i, p in enumerate(params):
                seqs = [self.engine.take_output(ids[(i, j)]) for j in range(p.n)]
                outs.append(LLMOutput.of(seqs[0], seqs[1:], self.tokenizer))
            return outs
        finally:
            for rid in ids.values():
                if rid in self.engine.requests:
                    self.engine.cancel(rid)
                    self.engine.take_output(rid)

    def chat(self, messages, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, *,
             tools: list[dict] | None = None, chat_template_kwargs: dict | None = None,
             add_generation_prompt: bool = True, reasoning: bool = True) -> list[LLMOutput]:
        """Generate the assistant's turn for one conversation (a list of OpenAI-style messages)
        or several (a list of them), through the model's chat template, with `tools` (OpenAI
        function definitions) offered. Each output's `.outputs[0]` has the raw `text` and the
        parsed `content`, `reasoning_content` (<think> text, unless reasoning=False) and
        `tool_calls` (Hermes or Qwen3 XML calls, as the template teaches)."""
        from luce.server.assistant_output import THINK_OPEN, AssistantOutput
        from luce.server.chat_request import chat_messages, parse_tools
        from luce.server.errors import APIError
        from luce.server.tool_calls import template_format

        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        try:
            tools = parse_tools(tools)
            rendered = [self.tokenizer.apply_chat_template(chat_messages(conv), add_generation_prompt=add_generation_prompt,
                                                           tools=tools, **(chat_template_kwargs or {}))
                        for conv in conversations]
        except APIError as e:
            raise ValueError(e.message) from None
        outs = self.generate([self.tokenizer.encode(text) for text in rendered], sampling_params)
        fmt = template_format(self.tokenizer.chat_template) if tools else None
        for text, out in zip(rendered, outs):
            parser = AssistantOutput(reasoning=reasoning, in_reasoning=reasoning and text.rstrip().endswith(THINK_OPEN),
                                     tools=tools, fmt=fmt)
            parser.push(out.text)
            parser.finish()
            done = out.outputs[0]
            done.content, done.reasoning_content, done.tool_calls = parser.content, parser.reasoning or None, parser.calls
        return outs

    def stream(self, prompt, sampling_params: SamplingParams | None = None) -> Iterator[str]:
        """Text deltas of one request as it is generated (whole UTF-8 characters; stop strings
        never appear). Other queued requests advance too. Closing the iterator early cancels
        the request; an engine error raises GenerationError after the text produced so far."""
        rid = self._submit(prompt, sampling_params or SamplingParams())
        request = self.engine.get(rid)
        try:
            while not request.finished:
                for update in self.engine.step():
                    if update.request_id == rid and update.text:
                        yield update.text
            if request.finish_reason == FinishReason.ERROR:
                raise GenerationError(request.error)
        finally:
            if not request.finished:
                self.engine.cancel(rid)
            self.engine.requests.pop(rid, None)


def _as_prompt_list(prompts) -> list:
    if isinstance(prompts, str):
        return [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(t, int) for t in prompts):
        return [prompts]          # one prompt given as token ids
    for p in prompts:
        if not isinstance(p, str) and not (isinstance(p, (list, tuple)) and all(isinstance(t, int) for t in p)):
            raise TypeError(f"a prompt is a str or a list of token ids, got {type(p).__name__}")
    return prompts


def _choice(params: SamplingParams, j: int) -> SamplingParams:
    """Sequence j of n: seed + j when a seed is given (else the engine draws distinct seeds)."""
    if j == 0 or params.seed is None:
        return params
    return replace(params, seed=(params.seed + j) & ((1 << 64) - 1))


def _as_params_list(params, n: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    params = list(params)
    if len(params) != n or not all(isinstance(p, SamplingParams) for p in params):
        raise ValueError(f"sampling_params must be one SamplingParams or a list of {n}, got {len(params)}")
    return params
