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

Where the two halves of one router request meet differs per flavour (`Meeting`): SGLang's
gateway adds `bootstrap_host`, `bootstrap_port` and `bootstrap_room` to both; vllm-router asks the
prefill with `kv_transfer_params.do_remote_decode` and hands the decode the prefill's answer,
`kv_transfer_params` naming the prefill's address, engine and KV handle.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from testbed.kvcache import BLOCK_TOKENS
from testbed.services import openai_doc, openai_request
from testbed.services.validate import int_field

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "MAX_INPUT_TOKENS",
    "FacadeRequest",
    "Meeting",
    "completion_doc",
    "openai_error",
    "parse_request",
    "prompt_size",
    "sglang_meeting",
    "sse",
    "unavailable",
    "vllm_decode_meeting",
    "vllm_prefill_meeting",
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
    """Where the halves meet (Meeting): the bootstrap room, or the prefill's KV handle."""
    bootstrap_host: str
    bootstrap_port: int
    label: str | None
    """The client's `testbed_request_id`: the run's records join on it (and on the room)."""
    engine: str | None = None
    """vllm decode: the prefill's `remote_engine_id` (its instance id), checked by the prefill."""


@dataclass(frozen=True)
class Meeting:
    """Where a request's two halves meet: the room (or handle), and the prefill's HTTP address
    whose bootstrap route the decode half registers with (facade.rooms)."""

    room: int
    host: str
    port: int
    engine: str | None = None


MeetingReader = Callable[[dict[str, Any]], Meeting]


def _error(message: str) -> web.HTTPException:
    return openai_error(message)


def _busy(message: str) -> web.HTTPException:
    """The tokenizer's queue is full: the 503 the gateway retries (as `unavailable`)."""
    return openai_error(message, web.HTTPServiceUnavailable, "service_unavailable")


async def prompt_size(
    body: dict[str, Any], chat: bool, *, counted: bool = True
) -> tuple[int, tuple[int, ...]]:
    """The prompt's tokens and one number per 512-token block that is equal for equal prefixes:
    the load generator's `input_tokens` and `hash_ids` when `counted` and the body has them (no
    tokenizing), else the shipped tokenizer's count and block hashes."""
    if counted and "input_tokens" in body:  # the load generator's own count: no tokenizing
        tokens = int_field(body, "input_tokens", 1, MAX_INPUT_TOKENS, error=_error)
        ids = body.get("hash_ids")
        if not isinstance(ids, list) or not all(type(h) is int for h in ids):
            ids = []
        return tokens, tuple(ids[: -(-tokens // BLOCK_TOKENS)])
    if chat:
        prompt: str | list[int] = openai_request.chat_text(body.get("messages"), _error)
    else:
        prompt = openai_request.completion_prompt(body.get("prompt"), _error)
    sized = await openai_request.size_prompt(prompt, error=_error, busy=_busy)
    return sized.tokens, sized.hashes


def sglang_meeting(body: dict[str, Any]) -> Meeting:
    """SGLang's gateway: the same three fields on both halves."""
    host = body.get("bootstrap_host")
    if not isinstance(host, str) or not 1 <= len(host) <= 255 or "bootstrap_room" not in body:
        raise _error(
            "not a PD request: bootstrap_host, bootstrap_port and bootstrap_room are required "
            "(this worker serves SGLang's PD handshake: run the gateway with "
            "--pd-disaggregation)"
        )
    port = int_field(body, "bootstrap_port", 1, 65535, error=_error)
    return Meeting(int_field(body, "bootstrap_room", 0, MAX_ROOM, error=_error), host, port)


def _kv_params(body: dict[str, Any], flag: str, half: str) -> dict[str, Any]:
    params = body.get("kv_transfer_params")
    if not isinstance(params, dict) or params.get(flag) is not True:
        raise _error(
            f"not a vLLM PD {half} request: kv_transfer_params.{flag} must be true (this "
            "worker serves vLLM's PD handshake: run vllm-router with --vllm-pd-disaggregation)"
        )
    return params


def vllm_prefill_meeting(body: dict[str, Any]) -> Meeting:
    """vllm-router's prefill call: the handle is the prefill's to make (facade.vllm_prefill)."""
    _kv_params(body, "do_remote_decode", "prefill")
    return Meeting(0, "", 0)


def vllm_decode_meeting(body: dict[str, Any]) -> Meeting:
    """vllm-router's decode call: the prefill's answer's kv_transfer_params, copied verbatim
    (facade.vllm_prefill made them: its address, instance id and `remote_block_ids: [handle]`)."""
    params = _kv_params(body, "do_remote_prefill", "decode")
    host = params.get("remote_host")
    engine = params.get("remote_engine_id")
    blocks = params.get("remote_block_ids")
    if not isinstance(host, str) or not 1 <= len(host) <= 255:
        raise _error("kv_transfer_params.remote_host must be the prefill's host")
    if not isinstance(engine, str) or not 1 <= len(engine) <= 64:
        raise _error("kv_transfer_params.remote_engine_id must be the prefill's engine id")
    if not isinstance(blocks, list) or len(blocks) != 1:
        raise _error("kv_transfer_params.remote_block_ids must hold one KV handle")
    port = int_field(params, "remote_port", 1, 65535, error=_error)
    room = int_field({"handle": blocks[0]}, "handle", 0, MAX_ROOM, error=_error)
    return Meeting(room, host, port, engine)


async def parse_request(
    body: dict[str, Any],
    *,
    chat: bool,
    max_output_tokens: int,
    model: str,
    meeting: MeetingReader = sglang_meeting,
) -> FacadeRequest:
    """The request's fields, checked (a 400 in OpenAI's shape for a bad one; a 503 when the
    tokenizer is busy); `model` is the served model, for a request that names none; `meeting`
    reads where its halves meet (the flavour's)."""
    meet = meeting(body)
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
        input_tokens=(await prompt_size(body, chat))[0],
        output_tokens=output,
        stream=stream,
        include_usage=usage,
        room=meet.room,
        bootstrap_host=meet.host,
        bootstrap_port=meet.port,
        label=label,
        engine=meet.engine,
    )


def completion_doc(
    req: FacadeRequest,
    cid: str,
    text: str | None,
    finish: str | None = None,
    *,
    first: bool = False,
    usage: int | None = None,
    cached: int | None = None,
) -> dict[str, Any]:
    """One completion (or, streaming, one chunk); `text` None: no choice (the usage chunk);
    `usage`: the completion tokens to report with the prompt's; `cached`: the prompt tokens
    served from a prefix cache, as `usage.prompt_tokens_details.cached_tokens` (vllm-router
    copies the prefill's into the decode's answer)."""
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
        if cached is not None:
            doc["usage"]["prompt_tokens_details"] = {"cached_tokens": cached}
    return doc


def sse(doc: dict[str, Any]) -> bytes:
    """One server-sent event."""
    return f"data: {json.dumps(doc, separators=(',', ':'))}\n\n".encode()
