"""Endpoints that generate nothing: /health, /v1/models(/{id}), /metrics, /props, /slots,
/tokenize and /detokenize (llama-server's shapes, with vLLM's fields beside them)."""
from __future__ import annotations

import asyncio

import luce
from luce.server.chat_request import chat_messages, parse_tools
from luce.server.errors import APIError, bad_request, unavailable
from luce.server.http import Request, Response
from luce.server.metrics import CONTENT_TYPE
from luce.server.validation import optional_field, parse_json_body, text_field, type_name


class Endpoints:
    def __init__(self, app):
        self.app = app

    async def health(self, request: Request) -> Response:
        """200 {"status": "ok"} when serving; 503 while loading, draining or if the engine died."""
        app = self.app
        if app.draining:
            return Response.error(unavailable("the server is shutting down"))
        if app.bridge is None:
            return Response.error(unavailable(app.loading_message, retry_after=5))
        if not app.bridge.running:
            return Response.error(unavailable("the engine thread is not running"))
        stats = app.bridge.stats()
        return Response.json({"status": "ok", "slots_idle": stats.slots_total - stats.slots_busy,
                              "slots_processing": stats.slots_busy, "queue_depth": stats.queue_depth})

    def _model(self) -> dict:
        bridge = self.app.require_bridge()
        info = bridge.info
        return {"id": info.model_id, "object": "model", "created": 0, "owned_by": "luce",
                "max_model_len": info.n_ctx,
                "meta": {"path": info.path, "arch": info.arch, "n_ctx": info.n_ctx,
                         "n_vocab": bridge.tokenizer.vocab_size}}

    async def models(self, request: Request) -> Response:
        return Response.json({"object": "list", "data": [self._model()]})

    async def model(self, request: Request, model_id: str) -> Response:
        model = self._model()
        if model_id != model["id"]:
            raise APIError(404, f"model {model_id[:100]!r} not found: this server serves {model['id']!r}",
                           type="not_found_error", code="model_not_found")
        return Response.json(model)

    async def slots(self, request: Request) -> Response:
        """One entry per engine slot: whether it runs a request, which, and its KV tokens."""
        bridge = self.app.require_bridge()
        stats = bridge.stats()
        out = []
        for i, slot in enumerate(stats.slots):
            rid, n_past = slot if slot is not None else (None, 0)
            out.append({"id": i, "n_ctx": bridge.info.n_ctx, "is_processing": slot is not None,
                        "id_task": rid, "n_past": n_past})
        return Response.json(out)

    async def tokenize(self, request: Request) -> Response:
        """{"content": text} (llama-server; or vLLM's "prompt", or "messages" through the chat
        template) -> {"tokens": [...], "count", "max_model_len"}; with_pieces adds each token's text."""
        body = parse_json_body(request.body)
        bridge = self.app.require_bridge()
        tok = bridge.tokenizer
        if body.get("messages") is not None:
            messages = chat_messages(body["messages"])
            tools = parse_tools(body.get("tools"))
            add_prompt = optional_field(body, "add_generation_prompt", bool, "a boolean")
            try:
                text = tok.apply_chat_template(messages, add_generation_prompt=add_prompt is not False, tools=tools)
            except Exception as e:
                raise bad_request(f"the model's chat template rejected the messages: {e}", param="messages") from None
        else:
            name = "content" if "content" in body else "prompt"
            text = text_field(body.get(name), name)
        add_special = optional_field(body, "add_special", bool, "a boolean") or False
        parse_special = optional_field(body, "parse_special", bool, "a boolean")
        ids = await asyncio.to_thread(tok.encode, text, add_special and tok.bos_id is not None,
                                      parse_special is not False)
        tokens: list = ids
        if optional_field(body, "with_pieces", bool, "a boolean"):
            tokens = [{"id": t, "piece": _piece(tok, t)} for t in ids]
        return Response.json({"tokens": tokens, "count": len(ids), "max_model_len": bridge.info.n_ctx})

    async def detokenize(self, request: Request) -> Response:
        """{"tokens": [ids]} -> {"content": text} (and vLLM's "prompt")."""
        body = parse_json_body(request.body)
        tok = self.app.require_bridge().tokenizer
        ids = body.get("tokens")
        if not isinstance(ids, list):
            raise bad_request(f"must be an array of token ids, got {type_name(ids)}", param="tokens")
        for i, t in enumerate(ids):
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < tok.vocab_size:
                raise bad_request(f"must be a token id in 0..{tok.vocab_size - 1}, got {str(t)[:20]}",
                                  param=f"tokens[{i}]")
        text = tok.decode(ids)
        return Response.json({"content": text, "prompt": text})

    async def metrics(self, request: Request) -> Response:
        bridge = self.app.bridge
        stats = bridge.stats() if bridge is not None else None
        return Response.text(self.app.metrics.render(stats, self.app.in_flight), content_type=CONTENT_TYPE)

    async def props(self, request: Request) -> Response:
        """Model, context, backend, slots, speculation settings, generation defaults."""
        bridge = self.app.require_bridge()
        info = bridge.info
        config = self.app.config
        return Response.json({
            "model": info.model_id,
            "model_path": info.path,
            "arch": info.arch,
            "n_ctx": info.n_ctx,
            "backend": info.backend,
            "total_slots": info.max_slots,
            "max_pending_requests": bridge.max_pending,
            "speculation": {"mode": info.spec_mode, "active": info.spec_active, "draft": info.draft_path,
                            "draft_kind": info.draft_kind, "note": info.spec_note},
            "default_generation_settings": {**config.defaults.as_dict(), "n_ctx": info.n_ctx},
            "chat_template": bridge.tokenizer.chat_template,
            "api_key_required": config.api_key is not None,
            "max_body_bytes": config.max_body_bytes,
            "build_info": f"luce {luce.__version__}",
            **info.extra,
            **config.props_extra,
        })


def _piece(tokenizer, token: int):
    """A token's text, or its bytes as a list when they are not whole UTF-8 (as llama-server)."""
    raw = tokenizer.token_bytes(token)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)
