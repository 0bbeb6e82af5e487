"""An action's body, read bounded and checked before anything is done (docs/design.md
§16.2): one reader for the API's actions and the pages' forms, which both import it."""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request

from procledger.web.actions import MAX_BODY, BadAction, BodyT, parse_body

__all__ = ["action_body", "check_csrf"]


async def action_body(request: Request, model: type[BodyT]) -> BodyT:
    """An action's fields, checked before anything is done (``actions.parse_body``); the
    CSRF token is checked for a request authenticated by the session cookie (a bearer token
    needs none).

    Raises:
        BadAction: the body is not the action's fields (a 400 naming the field at fault).
    """
    body = parse_body(model, await _bounded_body(request), request.headers.get("content-type", ""))
    check_csrf(request, body.csrf)
    return body


async def _bounded_body(request: Request) -> bytes:
    """The body, read no further than ``MAX_BODY``: an action's fields are short.

    Raises:
        BadAction: the body is longer.
    """
    too_long = BadAction(f"the body is longer than {MAX_BODY} bytes")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:
        raise too_long
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise too_long
        chunks.append(chunk)
    return b"".join(chunks)


def check_csrf(request: Request, value: Any) -> None:
    token = value if isinstance(value, str) else request.headers.get("x-csrf-token")
    if not request.state.bearer and not request.state.keys.csrf_ok(token):
        raise HTTPException(403, "missing or wrong CSRF token: reload the page")
