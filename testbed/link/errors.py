"""Errors of the link emulator's HTTP API, shaped like Toxiproxy's.

Toxiproxy answers every failed call with `{"error": "<message>", "status": <code>}` and the same
HTTP status; clients (toxiproxy-python among them) branch on the status alone: 400 bad input,
404 unknown proxy or toxic, 409 duplicate name. Keeping one exception type for all of them means a
handler can validate deep inside the emulator and the HTTP layer only has to render it.
"""

from __future__ import annotations

__all__ = [
    "ApiError",
    "bad_request",
    "missing_field",
    "proxy_exists",
    "proxy_not_found",
    "show",
    "too_many",
    "toxic_exists",
    "toxic_not_found",
]


class ApiError(Exception):
    """A failed API call: `message` and HTTP `status`, rendered as Toxiproxy renders them."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status

    def to_json(self) -> dict[str, object]:
        return {"error": self.message, "status": self.status}


# Longest rendering of a caller's value in an error message; a hostile body can hold a
# 400-digit number or a megabyte string, and the error must stay one short line.
SHOW_LIMIT = 40


def show(value: object, limit: int = SHOW_LIMIT) -> str:
    """`repr(value)` for an error message, cut to `limit` characters."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 100:
        # repr() of a huge int is slow (and refused past 4300 digits): give its size instead
        return f"<a {value.bit_length()}-bit integer>"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def bad_request(detail: str) -> ApiError:
    return ApiError(f"bad request body: {detail}", 400)


def missing_field(name: str) -> ApiError:
    return ApiError(f"missing required field: {name}", 400)


def proxy_not_found() -> ApiError:
    return ApiError("proxy not found", 404)


def proxy_exists() -> ApiError:
    return ApiError("proxy already exists", 409)


def toxic_not_found() -> ApiError:
    return ApiError("toxic not found", 404)


def toxic_exists() -> ApiError:
    return ApiError("toxic already exists", 409)


def too_many(what: str, cap: int) -> ApiError:
    """A create beyond one of the emulator's caps (Toxiproxy has none): 409, as a duplicate
    name, since the body is fine and it is the current state that refuses it; removing one
    makes room."""
    return ApiError(f"too many {what}: at most {cap}; delete one first", 409)
