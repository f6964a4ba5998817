"""OpenAI-style API errors: `{"error": {"message", "type", "param", "code"}}`.

Every failure the server reports to a client is an `APIError`; the helpers below fix the
status, type and code per kind so handlers only say what is wrong and with which field.
"""
from __future__ import annotations

import json


ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                         404: "not_found_error", 413: "request_too_large", 415: "invalid_request_error",
                         429: "rate_limit_error", 500: "api_error", 503: "overloaded_error"}


class APIError(Exception):
    """An error response. `param` names the offending request field (dotted path), if any."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def body_bytes(self) -> bytes:
        return json.dumps(self.body()).encode("utf-8")

    def anthropic_body_bytes(self) -> bytes:
        """The Anthropic Messages API error shape: {"type": "error", "error": {"type", "message"}}."""
        kind = ANTHROPIC_ERROR_TYPES.get(self.status, "api_error" if self.status >= 500 else "invalid_request_error")
        return json.dumps({"type": "error", "error": {"type": kind, "message": self.message}}).encode("utf-8")

    def __repr__(self) -> str:
        return f"APIError({self.status}, {self.message!r}, param={self.param!r})"


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    """400: the request is malformed or a field is invalid; `param` names the field."""
    if param is not None and not message.startswith(param):
        message = f"{param}: {message}"
    return APIError(400, message, param=param, code=code)


def unauthorized() -> APIError:
    return APIError(401, "missing or invalid API key: send 'Authorization: Bearer <key>'",
                    type="authentication_error", code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"})


def not_found(path: str) -> APIError:
    return APIError(404, f"no endpoint {path[:200]!r}: luce serves /v1/chat/completions, /v1/completions, "
                         "/v1/messages, /v1/responses, /v1/models, /tokenize, /detokenize, /health, /metrics, "
                         "/props and /slots (docs/SERVER.md)",
                    type="not_found_error", code="not_found")


def method_not_allowed(method: str, path: str, allowed: list[str]) -> APIError:
    allow = ", ".join(sorted(allowed))
    return APIError(405, f"{method} is not allowed on {path}; use {allow}",
                    code="method_not_allowed", headers={"Allow": allow})


def payload_too_large(limit: int) -> APIError:
    return APIError(413, f"request body is larger than the server's limit of {limit} bytes "
                         "(luce-serve --max-body-bytes)", code="request_too_large")


def queue_full(retry_after: int) -> APIError:
    return APIError(429, "the server is at capacity (all slots busy and the queue full); retry later",
                    type="rate_limit_error", code="queue_full",
                    headers={"Retry-After": str(retry_after)})


def unavailable(message: str, retry_after: int | None = None) -> APIError:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
    return APIError(503, message, type="unavailable_error", code="unavailable", headers=headers)


def internal(message: str) -> APIError:
    return APIError(500, message, type="server_error", code="internal_error")
