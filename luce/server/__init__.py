"""luce.server: an OpenAI- and Anthropic-compatible HTTP server over the luce engine (h11 for HTTP).

- `App`, `ServerConfig` (app.py): HTTP/1.1 on asyncio, routing, auth, browser policy, SSE, drain.
- `EngineBridge`, `EngineCore` (bridge.py): the engine thread and the interface it drives.
- `serve_forever`, `ServerThread` (runner.py): foreground with signals, or a background thread.
- `luce-serve` / `luce-run` entry points: luce.server.serve_cli / luce.server.run_cli.
See docs/SERVER.md.
"""
from luce.server.app import App, ServerConfig
from luce.server.bridge import (EngineBridge, EngineCore, EngineStats, GenerationEvent, ModelInfo,
                                QueueFullError, RequestHandle, StepOutput)
from luce.server.runner import ServerThread, serve_forever

__all__ = ["App", "ServerConfig", "EngineBridge", "EngineCore", "EngineStats", "GenerationEvent",
           "ModelInfo", "QueueFullError", "RequestHandle", "StepOutput", "ServerThread", "serve_forever"]
