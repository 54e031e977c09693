"""Request validation shared by the services: every bad request is a 4xx JSON error.

`json_errors` is an aiohttp middleware that turns aiohttp's own HTTP errors (404, 405, 413 for
an oversized body, ...) into JSON bodies `{"error": "..."}` as the handlers' own errors are.
`int_field` / `str_field` read one field strictly (no bools, no fractions, no NaN/inf, no
numeric strings) within bounds. Errors are `BadRequest` (`{"error": "..."}`) unless the caller
passes another `error` factory: the router answers in the OpenAI error shape
(services.router.openai).
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from testbed.link.jsonbody import lone_surrogate

__all__ = [
    "BadRequest",
    "ErrorFactory",
    "int_field",
    "json_body",
    "json_errors",
    "parse_json_object",
    "str_field",
]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ErrorFactory = Callable[[str], web.HTTPException]
"""Builds the 4xx error a message is answered with."""


class BadRequest(web.HTTPBadRequest):
    def __init__(self, message: str) -> None:
        super().__init__(text=json.dumps({"error": message}), content_type="application/json")


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object, or ValueError with a one-line reason.

    Hostile bodies are refused here, not deep in a handler: invalid UTF-8, nesting deeper than
    the parser can recurse (RecursionError), integers longer than Python converts (ValueError),
    a string that is not Unicode (a lone surrogate escape: it fails the first write of it, a
    500 with a traceback), and anything that is not an object.
    """
    try:
        text = raw.decode("utf-8")
        body = json.loads(text)
    except UnicodeDecodeError:
        raise ValueError("body is not valid UTF-8") from None
    except RecursionError:
        raise ValueError("body is nested too deeply") from None
    except ValueError:  # JSONDecodeError, and integers over the 4300-digit conversion limit
        raise ValueError("body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ValueError("body must be a JSON object")
    try:
        bad = lone_surrogate(body, text)
    except RecursionError:
        raise ValueError("body is nested too deeply") from None
    if bad:
        raise ValueError("body has a string that is not valid Unicode (a lone UTF-16 surrogate)")
    return body


async def json_body(request: web.Request, error: ErrorFactory = BadRequest) -> dict[str, Any]:
    """The request's JSON object body, or a 400."""
    try:
        return parse_json_object(await request.read())
    except ValueError as exc:
        raise error(str(exc)) from None


def _show(v: Any) -> str:
    """A value for an error message, cut short: a 400-digit number is not worth echoing."""
    text = json.dumps(v) if not isinstance(v, float) else repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def int_field(
    body: dict[str, Any],
    key: str,
    lo: int,
    hi: int,
    *,
    default: int | None = None,
    error: ErrorFactory = BadRequest,
) -> int:
    """An integer field in [lo, hi]: a JSON integer (or a float with an integral value);
    `default` when the field is absent (an explicit null is still an error)."""
    if key not in body:
        if default is not None:
            return default
        raise error(f"{key} is required")
    v = body[key]
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise error(f"{key} must be an integer, got {_show(v)}")
    if isinstance(v, float) and (not math.isfinite(v) or v != int(v)):
        raise error(f"{key} must be an integer, got {v!r}")
    if not lo <= v <= hi:  # exact for ints of any size: no float conversion
        raise error(f"{key} must be between {lo} and {hi}, got {_show(v)}")
    return int(v)


def str_field(body: dict[str, Any], key: str, max_len: int) -> str:
    """A non-empty string field of at most `max_len` UTF-8 bytes (a body from `json_body` has
    no lone surrogate; one built otherwise is refused here too, never encoded into a 500)."""
    v = body.get(key)
    if not isinstance(v, str) or not v:
        raise BadRequest(f"{key} must be a non-empty string")
    try:
        size = len(v.encode("utf-8"))
    except UnicodeEncodeError:
        raise BadRequest(f"{key} is not valid Unicode (a lone UTF-16 surrogate)") from None
    if size > max_len:
        raise BadRequest(f"{key} must be at most {max_len} bytes")
    return v


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400 or exc.content_type == "application/json":
            raise
        return web.json_response({"error": exc.reason}, status=exc.status)


async def health(_request: web.Request) -> web.Response:
    """`GET /health`: the process is up and serving (the router's health watcher polls it)."""
    return web.json_response({"ok": True})
