"""Strict JSON for the link API: numbers that fit, finite, and shallow nesting.

Python's json module accepts what Toxiproxy's Go decoder refuses: integers of any length (a
400-digit one then overflows the first float() it meets), NaN and Infinity, and nesting as deep
as the interpreter's recursion limit. Every body the API reads and every config file the server
loads goes through `decode`, so the rest of the emulator only ever sees int64 integers, finite
floats and structures a few levels deep, and anything else is one clear 400.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from testbed.link.errors import show

__all__ = ["MAX_DEPTH", "JsonBodyError", "decode", "lone_surrogate"]

# Deepest nesting a request may have. Toxiproxy's bodies go 4 deep (a schedule's steps inside a
# toxic's attributes); anything much deeper is not an API call.
MAX_DEPTH = 32
INT_MIN, INT_MAX = -(2**63), 2**63 - 1  # Go's int64, what Toxiproxy decodes numbers into
_INT_DIGITS = len(str(INT_MAX))


class JsonBodyError(ValueError):
    """A body that is not JSON the API accepts; the message says why, in one short line."""


def _parse_int(text: str) -> int:
    digits = text.lstrip("-")
    if len(digits) <= _INT_DIGITS:
        value = int(text)
        if INT_MIN <= value <= INT_MAX:
            return value
    shown = text if len(text) <= 24 else f"{text[:12]}...({len(digits)} digits)"
    raise JsonBodyError(f"integer {shown} is out of range (it must fit in 64 bits)")


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JsonBodyError(f"number {show(text, 24)} is out of range")
    return value


def _parse_constant(name: str) -> Any:
    raise JsonBodyError(f"{name} is not a JSON value")


def _depth_ok(value: Any) -> bool:
    """True if `value` nests at most MAX_DEPTH containers deep (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > MAX_DEPTH:
            return False
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return True


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
"""A `\\uD800`-`\\uDFFF` escape: the only way a lone surrogate gets into parsed JSON (a UTF-8
or UTF-16 decoder refuses one written out as bytes)."""


def lone_surrogate(value: Any, text: str | None = None) -> bool:
    """True if a string of `value` (parsed JSON: keys too) holds a lone UTF-16 surrogate.

    json.loads turns `"\\ud800"` into a str that is not Unicode text: it cannot be encoded,
    so the first log line, response or metric that writes it fails (a 500, then every later
    `GET /metrics` of the link emulator). Refused where JSON is read, for every server.
    `text`, the body as decoded text, lets a body with no such escape skip the check.
    """
    if text is not None and _SURROGATE_ESCAPE.search(text) is None:
        return False
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def decode(raw: bytes | str) -> Any:
    """Parse `raw` as strict JSON; raise JsonBodyError with a one-line reason."""
    try:
        value = json.loads(
            raw,
            parse_int=_parse_int,
            parse_float=_parse_float,
            parse_constant=_parse_constant,
        )
    except JsonBodyError:
        raise
    except RecursionError:
        raise JsonBodyError(f"JSON nested more than {MAX_DEPTH} levels deep") from None
    except UnicodeDecodeError:
        raise JsonBodyError("not UTF-8 text") from None
    except ValueError as exc:
        # json's own messages give a position, never the content ("Expecting value: line 1...")
        raise JsonBodyError(str(exc).splitlines()[0]) from None
    if not _depth_ok(value):
        raise JsonBodyError(f"JSON nested more than {MAX_DEPTH} levels deep")
    if lone_surrogate(value):  # bodies and config files here are small: no pre-filter
        raise JsonBodyError("a string is not valid Unicode (a lone UTF-16 surrogate)")
    return value
