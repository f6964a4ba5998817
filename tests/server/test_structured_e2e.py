"""Structured output, log-probs, n and logit_bias end to end: a tiny GGUF model on the real
engine (plain decoding, and chain speculation with the model drafting for itself), the HTTP
server, the official openai client. Tiny models write random text, so the checks are what a
grammar guarantees (the output parses and matches the schema) and log-probs equal a numpy
log-softmax of logits from one model-level prefill (luce.models, no engine, no server)."""
from __future__ import annotations

import json

import numpy as np
import pytest

pydantic = pytest.importorskip("pydantic")   # with the openai SDK (the GPU machine has neither)
BaseModel, Field = pydantic.BaseModel, pydantic.Field

from luce.models import SegmentSpec, build_batch, load_model
from luce.models.kv_cache import pages_needed
from luce.server import App, ServerConfig, ServerThread
from luce.server.engine_core import ServeOptions, load_bridge
from luce.testing.tiny_models import make_dense
from luce.tokenizer import Tokenizer

openai = pytest.importorskip("openai")
CTX = 384


class Person(BaseModel):
    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=120)
    member: bool


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "tiny-qwen3.gguf"
    make_dense(path, arch="qwen3", seed=3)
    return path


@pytest.fixture(scope="module", params=["plain", "spec"])
def served(request, model_path):
    spec = dict(draft=str(model_path), draft_kind="model", spec="chain", draft_max=3) if request.param == "spec" else {}
    bridge = load_bridge(ServeOptions(model=str(model_path), backend="cpu", max_slots=3, ctx=CTX, max_queue=8,
                                      token_budget=256, **spec), progress=False, say=lambda m: None)
    server = ServerThread(App(ServerConfig(host="127.0.0.1", port=0), bridge)).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def oracle(model_path):
    """logits [len(ids), V] of every position of `ids`: one prefill through the model."""
    model = load_model(model_path, "cpu")
    tok = Tokenizer.from_gguf(model_path)

    def logits(ids):
        pages = list(range(pages_needed(len(ids))))
        state = model.new_state(max_pages=len(pages), max_slots=1)
        out = model.forward(build_batch([SegmentSpec(0, list(ids), 0, pages, logits="all")]), state)
        return np.asarray(model.backend.to_numpy(out.logits), dtype=np.float64)

    return logits, tok


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)


ASK = [{"role": "user", "content": "Who is it?"}]


def log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def test_parse_with_a_pydantic_model(served):
    for seed in (1, 2):
        r = client(served).beta.chat.completions.parse(model="m", messages=ASK, response_format=Person,
                                                       max_tokens=120, temperature=0.8, seed=seed)
        person = r.choices[0].message.parsed
        assert isinstance(person, Person) and r.choices[0].finish_reason == "stop"
        assert Person.model_validate_json(r.choices[0].message.content) == person


def test_json_object_and_schema_outputs_parse(served):
    c = client(served)
    r = c.chat.completions.create(model="m", messages=ASK, max_tokens=200, temperature=0,
                                  response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:   # cut by max_tokens: still a prefix of a JSON object
        assert r.choices[0].message.content.startswith("{")
    schema = {"type": "object", "properties": {"k": {"enum": ["a", "b"]}, "v": {"type": "integer", "maximum": 9}},
              "required": ["k", "v"], "additionalProperties": False}
    r = c.chat.completions.create(model="m", messages=ASK, max_tokens=60, temperature=0, response_format={
        "type": "json_schema", "json_schema": {"name": "kv", "schema": schema, "strict": True}})
    value = json.loads(r.choices[0].message.content)
    assert value["k"] in ("a", "b") and 0 <= value["v"] <= 9 and set(value) == {"k", "v"}


def test_chat_logprobs_are_the_targets_log_softmax(served, oracle):
    logits_of, tok = oracle
    r = client(served).chat.completions.create(model="m", messages=ASK, max_tokens=10, temperature=0,
                                               logprobs=True, top_logprobs=3)
    entries = r.choices[0].logprobs.content
    by_bytes = {}
    for i in range(tok.vocab_size):
        by_bytes.setdefault(tok.token_bytes(i), i)
    ids = [by_bytes[bytes(e.bytes)] for e in entries]
    prompt = tok.encode(tok.apply_chat_template(ASK, add_generation_prompt=True))
    assert len(entries) == r.usage.completion_tokens == len(ids)
    lp = log_softmax(logits_of(prompt + ids)[len(prompt) - 1:])
    for j, e in enumerate(entries):
        assert e.logprob == pytest.approx(lp[j, ids[j]], abs=1e-4)
        want = np.argsort(-lp[j], kind="stable")[:3]
        assert [t.logprob for t in e.top_logprobs] == pytest.approx(lp[j, want].tolist(), abs=1e-4)
        assert e.top_logprobs[0].token == e.token            # greedy: the best token was chosen


def test_completion_logprobs_streamed_and_not(served, oracle):
    logits_of, tok = oracle
    prompt = tok.encode("The quick brown")
    c = client(served)
    r = c.completions.create(model="m", prompt=prompt, max_tokens=8, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == r.usage.completion_tokens
    streamed = [x for chunk in c.completions.create(model="m", prompt=prompt, max_tokens=8, temperature=0,
                                                    logprobs=2, stream=True)
                for x in (chunk.choices[0].logprobs.token_logprobs if chunk.choices[0].logprobs else [])]
    assert streamed == pytest.approx(lp.token_logprobs)
    first = log_softmax(logits_of(prompt)[-1])
    assert lp.token_logprobs[0] == pytest.approx(first.max(), abs=1e-4)


def test_n_choices_are_the_seeded_requests_alone(served):
    c = client(served)
    both = c.chat.completions.create(model="m", messages=ASK, max_tokens=12, temperature=0.9, seed=7, n=2)
    assert [ch.index for ch in both.choices] == [0, 1]
    alone = [c.chat.completions.create(model="m", messages=ASK, max_tokens=12, temperature=0.9, seed=s)
             .choices[0].message.content for s in (7, 8)]
    assert [ch.message.content for ch in both.choices] == alone
    streamed = {0: "", 1: ""}
    for chunk in c.chat.completions.create(model="m", messages=ASK, max_tokens=12, temperature=0.9, seed=7, n=2,
                                           stream=True):
        for ch in chunk.choices:
            streamed[ch.index] += ch.delta.content or ""
    assert [streamed[0], streamed[1]] == alone


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_logit_bias_forces_and_forbids_tokens(served, oracle, temperature):
    _, tok = oracle
    c = client(served)
    forced = tok.encode(" fox")[0]
    r = c.completions.create(model="m", prompt="hello", max_tokens=6, temperature=temperature, seed=3,
                             logit_bias={str(forced): 100})
    assert r.choices[0].text == tok.decode([forced] * 6)
    plain = c.completions.create(model="m", prompt="hello", max_tokens=1, temperature=0)
    first = tok.encode(plain.choices[0].text)[0]
    banned = c.completions.create(model="m", prompt="hello", max_tokens=1, temperature=0,
                                  logit_bias={str(first): -100})
    assert banned.choices[0].text != plain.choices[0].text
