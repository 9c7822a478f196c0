"""Who may talk to `specscope serve`: the Host, Origin and Content-Type checks that keep a web
page the user visits from driving the local model (issue 28).

- Host (DNS rebinding): an attacker's name re-resolved to 127.0.0.1 makes the browser treat the
  attacker's page and this server as one origin, so the page could read the answers. On a loopback
  bind only Host values that no DNS answer can stand for are served: `localhost`, `*.localhost`
  (RFC 6761: resolved locally, never by DNS), 127.0.0.0/8 and [::1] literals, with the bound port;
  plus the names given with --allowed-hosts (a reverse proxy, a .local name), on any port. Ollama
  fixed the same bug this way (CVE-2024-28224; an empty Host: ollama#17721).
- Content-Type: only application/json bodies, so a browser must send a CORS preflight first
  (text/plain and form bodies are "simple" requests it sends without asking).
- Origin: a request that carries one must come from an --allowed-origins origin; CORS headers go
  only to those (Starlette's CORSMiddleware, added by build_app only when origins are given).

Why not Starlette's TrustedHostMiddleware: it answers 400 with a text body (the API answers
OpenAI-style JSON errors, and this is a refusal, 403), ignores the port, and has no pattern for an
address range (127.0.0.0/8). Why not only CORSMiddleware: it lets a disallowed origin's simple
request through (without CORS headers, but the generation still runs). Hence this small ASGI
middleware, which answers before any route (so before any generation) runs. It is a plain ASGI
class, not BaseHTTPMiddleware, so streaming responses and disconnect detection are untouched."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from app.serve.protocol import ApiError

BODY_METHODS = ("POST", "PUT", "PATCH", "DELETE")


def split_host(value: str) -> tuple[str, int | None] | None:
    """A Host header as (name, port): 'a.b:8000', '127.0.0.1', '[::1]:8000'. None if malformed
    (an empty name included: `Host: :8000`)."""
    if value.startswith("["):
        name, bracket, rest = value.partition("]")
        name += bracket
    else:
        name, colon, rest = value.partition(":")
        rest = colon + rest
    if not name or name == "[" or (value.startswith("[") and not name.endswith("]")):
        return None
    if not rest:
        return name.lower(), None
    if rest[0] != ":" or not rest[1:].isdigit():
        return None
    return name.lower(), int(rest[1:])


def is_loopback_name(name: str) -> bool:
    """A name no DNS answer can stand for: localhost, *.localhost, a 127/8 or ::1 literal."""
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        if name.startswith("[") and name.endswith("]"):
            return ipaddress.IPv6Address(name[1:-1]).is_loopback
        return ipaddress.IPv4Address(name).is_loopback
    except ValueError:
        return False


@dataclass
class RequestGuard:
    """ASGI middleware: refuses (403 / 415, OpenAI-style body) before the request reaches a route.
    check_host is False only off loopback without --allowed-hosts (there the API key guards, and
    the names clients use for this machine are not known)."""

    app: ASGIApp
    check_host: bool
    allowed_hosts: frozenset[str]
    allowed_origins: frozenset[str]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self.refusal(scope)
            if refusal is not None:
                await JSONResponse(refusal.body(), status_code=refusal.status)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> ApiError | None:
        headers = Headers(scope=scope)
        if self.check_host and not self.host_allowed(headers.get("host", ""), (scope.get("server") or ("", 0))[1]):
            return ApiError(403, f"the Host {headers.get('host', '')!r} is not served: this server answers "
                            "localhost, 127.0.0.1 and [::1] on its port, and the names given with --allowed-hosts",
                            "host_not_allowed")
        origin = headers.get("origin")
        if origin is not None and origin.rstrip("/").lower() not in self.allowed_origins:
            return ApiError(403, f"the Origin {origin!r} is not allowed (--allowed-origins names those that are)",
                            "origin_not_allowed")
        if scope["method"] in BODY_METHODS:
            media_type = headers.get("content-type", "").split(";")[0].strip().lower()
            if media_type != "application/json":
                return ApiError(415, f"the request body must be application/json, not {media_type or 'untyped'}",
                                "unsupported_media_type")
        return None

    def host_allowed(self, value: str, bound_port: int) -> bool:
        parsed = split_host(value)
        if parsed is None:
            return False
        name, port = parsed
        if name in self.allowed_hosts:
            return True
        return is_loopback_name(name) and (port if port is not None else 80) == bound_port


def normalized_origins(origins: tuple[str, ...]) -> frozenset[str]:
    return frozenset(o.rstrip("/").lower() for o in origins)
