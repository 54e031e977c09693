"""The OpenAI request as both halves of the router-facing API read it, and the shapes they
answer in.

A body with `input_tokens` (and `hash_ids`) is sized from them, without tokenizing: the load
generator sends both with its text prompt, and a 30K-token prompt would otherwise cost 0.06 s of
CPU per half. Otherwise the prompt (`prompt`, or chat `messages`) is read and sized as our
router's OpenAI front reads it (services.openai_request: a long one in a tokenizer worker
process, a 400 above its token cap, a 503 when the tokenizer's queue is full, which the gateway
retries). `n`, `best_of`, `stream`, `stream_options.include_usage` and `model` are checked as
there; `model` may be any name (the gateway forwards its client's name, as SGLang's workers take
it), but it must be a short string, since it is echoed in every chunk. Unknown fields are
ignored (the gateway adds a dozen of its own: tests/services/facade/fixtures). Errors are in
OpenAI's shape, so the gateway forwards a reason a client can read.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from testbed.services import openai_doc, openai_request
from testbed.services.validate import int_field

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "MAX_INPUT_TOKENS",
    "FacadeRequest",
    "completion_doc",
    "openai_error",
    "parse_request",
    "sse",
    "unavailable",
]

MAX_INPUT_TOKENS = 10_000_000
DEFAULT_MAX_TOKENS = 16
MAX_ROOM = (1 << 64) - 1


def openai_error(
    message: str, status: type[web.HTTPException] = web.HTTPBadRequest, kind: str = ""
) -> web.HTTPException:
    """An error answer in OpenAI's shape."""
    err = {"message": message, "type": kind or "invalid_request_error"}
    return status(text=json.dumps({"error": err}), content_type="application/json")


def unavailable(message: str) -> web.Response:
    """The 503 a half answers when it cannot serve this attempt: the gateway retries it (both
    halves, with a new room: tests/services/facade/fixtures/decode_503_retried.json)."""
    err = {"message": message, "type": "service_unavailable"}
    return web.json_response({"error": err}, status=503)


@dataclass(frozen=True)
class FacadeRequest:
    """What a half needs of one gateway request."""

    chat: bool
    model: str
    input_tokens: int
    output_tokens: int
    stream: bool
    include_usage: bool
    room: int
    bootstrap_host: str
    bootstrap_port: int
    label: str | None
    """The client's `testbed_request_id`: the run's records join on it (and on the room)."""


def _error(message: str) -> web.HTTPException:
    return openai_error(message)


def _busy(message: str) -> web.HTTPException:
    """The tokenizer's queue is full: the 503 the gateway retries (as `unavailable`)."""
    return openai_error(message, web.HTTPServiceUnavailable, "service_unavailable")


async def _prompt_tokens(body: dict[str, Any], chat: bool) -> int:
    if "input_tokens" in body:  # the load generator's own count: no tokenizing
        return int_field(body, "input_tokens", 1, MAX_INPUT_TOKENS, error=_error)
    if chat:
        prompt: str | list[int] = openai_request.chat_text(body.get("messages"), _error)
    else:
        prompt = openai_request.completion_prompt(body.get("prompt"), _error)
    sized = await openai_request.size_prompt(prompt, error=_error, busy=_busy)
    return sized.tokens


async def parse_request(
    body: dict[str, Any], *, chat: bool, max_output_tokens: int, model: str
) -> FacadeRequest:
    """The request's fields, checked (a 400 in OpenAI's shape for a bad one; a 503 when the
    tokenizer is busy); `model` is the served model, for a request that names none."""
    host = body.get("bootstrap_host")
    if not isinstance(host, str) or not 1 <= len(host) <= 255 or "bootstrap_room" not in body:
        raise _error(
            "not a PD request: bootstrap_host, bootstrap_port and bootstrap_room are required "
            "(this worker serves SGLang's PD handshake: run the gateway with "
            "--pd-disaggregation)"
        )
    port = int_field(body, "bootstrap_port", 1, 65535, error=_error)
    room = int_field(body, "bootstrap_room", 0, MAX_ROOM, error=_error)
    key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    output = int_field(body, key, 1, max_output_tokens, default=DEFAULT_MAX_TOKENS, error=_error)
    label = body.get("testbed_request_id")
    if label is not None and (not isinstance(label, str) or not 1 <= len(label.encode()) <= 64):
        raise _error("testbed_request_id must be a string of 1 to 64 bytes")
    openai_request.one_choice(body, _error)
    name = openai_request.model_field(body, model, _error)
    stream = openai_request.stream_field(body, _error)
    usage = openai_request.include_usage(body, _error)
    return FacadeRequest(
        chat=chat,
        model=name,
        input_tokens=await _prompt_tokens(body, chat),
        output_tokens=output,
        stream=stream,
        include_usage=usage,
        room=room,
        bootstrap_host=host,
        bootstrap_port=port,
        label=label,
    )


def completion_doc(
    req: FacadeRequest,
    cid: str,
    text: str | None,
    finish: str | None = None,
    *,
    first: bool = False,
    usage: int | None = None,
) -> dict[str, Any]:
    """One completion (or, streaming, one chunk); `text` None: no choice (the usage chunk);
    `usage`: the completion tokens to report with the prompt's."""
    kind = "text_completion"
    if req.chat:
        kind = "chat.completion.chunk" if req.stream else "chat.completion"
    doc: dict[str, Any] = {
        "id": cid,
        "object": kind,
        "created": int(time.time()),
        "model": req.model,
        "choices": []
        if text is None
        else [openai_doc.choice(req.chat, req.stream, text, finish, first)],
    }
    if usage is not None:
        doc["usage"] = {
            "prompt_tokens": req.input_tokens,
            "completion_tokens": usage,
            "total_tokens": req.input_tokens + usage,
        }
    return doc


def sse(doc: dict[str, Any]) -> bytes:
    """One server-sent event."""
    return f"data: {json.dumps(doc, separators=(',', ':'))}\n\n".encode()
