"""What keeps web pages from using a local server behind its user's back.

- CORS: only origins in `--cors-origins` get `Access-Control-Allow-*` headers (none by default,
  so a page on another site cannot read answers); preflight `OPTIONS` requests are answered.
- POST bodies must be `Content-Type: application/json` (415 otherwise): the "simple" requests a
  page may send cross-site without a preflight (text/plain, forms) are refused unread.
- Host allow-list (DNS rebinding): a server bound to loopback without an API key answers only
  requests whose Host is a loopback name, so a page whose domain re-resolves to 127.0.0.1 is
  refused. `--allowed-hosts` adds names ('*' turns the check off).
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from luce.server.errors import APIError
from luce.server.http import Request, Response

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
ALLOWED_REQUEST_HEADERS = "Authorization, Content-Type, X-Api-Key, Anthropic-Version, Anthropic-Beta, OpenAI-Beta"
PREFLIGHT_MAX_AGE_S = 600


def is_loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name of a Host header without its port: 'localhost:8080' -> 'localhost', '[::1]:80' -> '::1'."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


@dataclass(frozen=True)
class BrowserPolicy:
    cors_origins: tuple[str, ...] = ()          # exact origins, or "*" for any
    allowed_hosts: tuple[str, ...] | None = None   # None: no Host check

    @classmethod
    def for_server(cls, host: str, api_key: str | None, cors_origins=(), allowed_hosts=None) -> "BrowserPolicy":
        """The Host check is on for a keyless loopback server unless allowed_hosts has '*'."""
        extra = tuple(h.strip().lower() for h in (allowed_hosts or ()) if h.strip())
        hosts = None
        if "*" not in extra and is_loopback(host) and api_key is None:
            hosts = LOOPBACK_NAMES + extra
        return cls(tuple(o.strip().rstrip("/") for o in cors_origins if o.strip()), hosts)

    # ---------------------------------------------------------------- Host

    def check_host(self, request: Request) -> APIError | None:
        if self.allowed_hosts is None:
            return None
        header = request.header("host")
        if header is None:           # HTTP/1.0 without Host: not a browser
            return None
        name = host_name(header)
        if name in self.allowed_hosts or name.endswith(".localhost"):
            return None
        return APIError(403, f"Host {header[:100]!r} is not allowed: a loopback server without an API key only "
                             "answers requests addressed to localhost, 127.0.0.1 or [::1] (DNS rebinding "
                             "protection); add the name with luce-serve --allowed-hosts, or set --api-key",
                        type="permission_error", code="host_not_allowed")

    # ---------------------------------------------------------------- CORS

    def _allowed_origin(self, request: Request) -> str | None:
        origin = request.header("origin")
        if origin is None or not self.cors_origins:
            return None
        if "*" in self.cors_origins:
            return "*"
        return origin if origin.rstrip("/") in self.cors_origins else None

    def cors_headers(self, request: Request) -> dict[str, str]:
        """Headers every answer to `request` carries (empty unless its Origin is allowed)."""
        origin = self._allowed_origin(request)
        if origin is None:
            return {}
        headers = {"Access-Control-Allow-Origin": origin}
        if origin != "*":
            headers["Vary"] = "Origin"
        return headers

    def preflight(self, request: Request, methods: list[str]) -> Response:
        """204 for OPTIONS; with the Access-Control-Allow-* headers when the origin is allowed."""
        allow = ", ".join(sorted(set(methods) | {"OPTIONS"}))
        headers = {"Allow": allow}
        cors = self.cors_headers(request)
        if cors:
            asked = request.header("access-control-request-headers")
            headers.update(cors)
            headers.update({"Access-Control-Allow-Methods": allow,
                            "Access-Control-Allow-Headers": asked or ALLOWED_REQUEST_HEADERS,
                            "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_S)})
        return Response(204, b"", headers=headers)


def require_json(request: Request) -> None:
    """415 unless the request says its body is JSON."""
    kind = request.header("content-type")
    media = (kind or "").split(";", 1)[0].strip().lower()
    if media == "application/json":
        return
    got = f"got {kind[:80]!r}" if kind else "the header is missing"
    raise APIError(415, f"Content-Type must be application/json ({got}): send the header "
                        "'Content-Type: application/json' with a JSON body",
                   code="unsupported_media_type")
