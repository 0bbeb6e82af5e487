"""Who may see the ledger: one access token per server, as Jupyter does it.

``serve`` prints a URL with ``?token=…``. Opening it sets an HttpOnly, SameSite=Strict session
cookie (an HMAC of the token, so the token itself is not kept by the browser) and redirects to
the same URL without the token, so it leaves the address bar and the history. Every other
request needs that cookie or ``Authorization: Bearer <token>``: pages, streams, the API and the
static files alike; anything else is a bare 401 that says nothing about the ledger.

Actions are POSTs. A cookie-authenticated POST must carry the CSRF token (an HMAC of the token
for another purpose) in the ``csrf`` form field or the ``X-CSRF-Token`` header, and an
``Origin`` naming another host is refused; a bearer token cannot be sent by a foreign page, so
it needs neither. Every response carries a strict Content-Security-Policy (scripts from this
server only, no inline script) and sends a Referer only to itself.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

COOKIE = "procledger_session"
CSRF_HEADER = "x-csrf-token"
SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        b"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]
Scope = dict[str, Any]


def new_token() -> str:
    """A fresh access token: 192 random bits, URL-safe."""
    return secrets.token_urlsafe(24)


class Keys:
    """What the token opens: the session cookie's value and the CSRF token, both derived from
    it, so a server restarted with the same ``--token`` accepts the same browser session."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.session = _derive(token, "session")
        self.csrf = _derive(token, "csrf")

    def bearer_ok(self, header: str) -> bool:
        scheme, _, value = header.partition(" ")
        return scheme.lower() == "bearer" and _same(value.strip(), self.token)

    def csrf_ok(self, value: str | None) -> bool:
        return value is not None and _same(value, self.csrf)


def _derive(token: str, purpose: str) -> str:
    return hmac.new(token.encode(), purpose.encode(), hashlib.sha256).hexdigest()


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


class TokenGate:
    """ASGI middleware: refuses every HTTP request without the token (401), turns a token URL
    into the session cookie, and adds the security headers to every response. It marks the
    scope's ``state`` with ``bearer`` (so actions may skip the CSRF check) and the CSRF token
    (so pages can embed it)."""

    def __init__(self, app: Any, keys: Keys) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # no websockets here: closed unanswered
            await send({"type": "websocket.close", "code": 1008})
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        given = query.get("token")
        by_url = given is not None and _same(given, self.keys.token)
        if by_url and scope["method"] == "GET" and not scope["path"].startswith("/api/"):
            await _to_session(scope, send, self.keys, query)
            return
        bearer = by_url or self.keys.bearer_ok(headers.get("authorization", ""))
        if not (bearer or self._cookie_ok(headers.get("cookie", ""))):
            await _plain(send, 401, "401 Unauthorized: open the URL procledger serve printed\n")
            return
        if scope["method"] == "POST" and not bearer and not _same_origin(headers):
            await _plain(send, 403, "403 Forbidden: a request from another site\n")
            return
        state = scope.setdefault("state", {})
        state.update(bearer=bearer, csrf=self.keys.csrf, keys=self.keys)
        await self.app(scope, receive, _secured(send))

    def _cookie_ok(self, header: str) -> bool:
        cookie: SimpleCookie = SimpleCookie()
        try:
            cookie.load(header)
        except Exception:  # a malformed Cookie header authenticates nobody
            return False
        morsel = cookie.get(COOKIE)
        return morsel is not None and _same(morsel.value, self.keys.session)


def _same_origin(headers: dict[str, str]) -> bool:
    """No ``Origin`` (not a cross-site browser request), or one naming this very host."""
    origin = headers.get("origin")
    return origin is None or urlsplit(origin).netloc == headers.get("host")


def _secured(send: Any) -> Any:
    async def wrapped(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
        await send(message)

    return wrapped


async def _to_session(scope: Scope, send: Any, keys: Keys, query: dict[str, str]) -> None:
    """A token URL: set the session cookie and redirect to the same URL without the token."""
    rest = urlencode({k: v for k, v in query.items() if k != "token"})
    location = scope.get("root_path", "") + scope["path"] + (f"?{rest}" if rest else "")
    cookie = f"{COOKIE}={keys.session}; Path=/; HttpOnly; SameSite=Strict"
    headers = [
        (b"location", location.encode("latin-1", "replace")),
        (b"set-cookie", cookie.encode()),
        (b"content-length", b"0"),
        *SECURITY_HEADERS,
    ]
    await send({"type": "http.response.start", "status": 303, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


async def _plain(send: Any, status: int, text: str) -> None:
    body = text.encode()
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
        (b"www-authenticate", b'Bearer realm="procledger"'),
        *SECURITY_HEADERS,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
