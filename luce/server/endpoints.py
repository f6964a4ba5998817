"""GET endpoints: /health, /v1/models, /metrics, /props."""
from __future__ import annotations

import luce
from luce.server.errors import unavailable
from luce.server.http import Request, Response
from luce.server.metrics import CONTENT_TYPE


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

    async def models(self, request: Request) -> Response:
        bridge = self.app.require_bridge()
        info = bridge.info
        return Response.json({"object": "list", "data": [{
            "id": info.model_id, "object": "model", "created": 0, "owned_by": "luce",
            "meta": {"path": info.path, "arch": info.arch, "n_ctx": info.n_ctx,
                     "n_vocab": bridge.tokenizer.vocab_size},
        }]})

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
