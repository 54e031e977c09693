"""Malformed requests get one log line, not aiohttp's traceback (testbed.serving).

aiohttp answers a request it cannot parse (a bad request line, `Content-Length: -1`, a broken
chunked body) with a 400 and logs it with `logger.exception(..., exc_info=exc)`: a dozen lines
of its own parser's traceback per request, so one client could write 5,000 lines a second. Such
an error is the client's, not the server's: it gets one INFO line naming the server and the
reason. Only aiohttp's parse errors (the HttpProcessingError family) are shortened; anything
else, a handler's bug among them, is logged as aiohttp logs it, traceback and all.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError

__all__ = ["ServerLog", "one_line", "parse_error", "reported"]

_ERROR_CHARS = 160  # of a parse error, which quotes the client's bytes (an 8 KiB line, say)


def one_line(exc: HttpProcessingError) -> str:
    """aiohttp's parse error in one short printable line.

    Its message spans lines (the reason, the offending bytes, a caret under them); the caret
    line is dropped, the rest joined, control characters escaped, the whole cut."""
    parts = [p.strip() for p in str(exc.message or type(exc).__name__).splitlines()]
    text = " ".join(p for p in parts if p and set(p) != {"^"})
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    if len(text) > _ERROR_CHARS:
        text = text[: _ERROR_CHARS - 3] + "..."
    return f"{exc.code} {text}"


def reported(exc: BaseException) -> bool:
    """True the second time a parse error is seen: aiohttp may log one error twice (handler,
    then its lingering read of the same body), and a request gets one line."""
    seen = bool(getattr(exc, "_testbed_logged", False))
    with contextlib.suppress(AttributeError):
        exc._testbed_logged = True  # type: ignore[attr-defined]
    return seen


class ServerLog(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's per-connection logger ("aiohttp.server") with its parse errors made one line.

    aiohttp logs a malformed request with `logger.exception(..., exc_info=exc)`, a traceback of
    its own parser; that is the client's error, not the server's, and gets one INFO line with
    the server's name and the reason (DEBUG stays DEBUG). Every other record (a handler's
    exception: a bug) passes through untouched, traceback and all.
    """

    def __init__(self, name: str) -> None:
        super().__init__(logging.getLogger("aiohttp.server"), {})
        self.server_name = name

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        exc = parse_error(_exc_of(kwargs.get("exc_info")))
        if exc is None:
            super().log(level, msg, *args, **kwargs)
            return
        if reported(exc):
            return
        text = str(msg) % args if args else str(msg)
        self.logger.log(
            min(level, logging.INFO),
            "%s: %s: %s",
            self.server_name,
            text,
            one_line(exc),
        )


def parse_error(exc: object) -> HttpProcessingError | None:
    """The aiohttp parse error `exc` is or wraps (aiohttp re-raises a body's error on its own
    later read as a RequestPayloadError caused by it), else None."""
    for e in (exc, getattr(exc, "__cause__", None)):
        if isinstance(e, HttpProcessingError):
            return e
    return None


def _exc_of(exc_info: object) -> object:
    if isinstance(exc_info, tuple) and len(exc_info) == 3:
        return exc_info[1]
    return sys.exc_info()[1] if exc_info is True else exc_info
