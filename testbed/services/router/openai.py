"""The OpenAI surface: `POST /v1/completions`, `POST /v1/chat/completions`, `GET /v1/models`.

Prompts are counted with the shipped tokenizer (services.tokenizer), so `usage` is what a
client counting with the same tokenizer counts, and text prompts get prefix-cache block hashes
from their token ids. The prompt shapes, the limits on them and the checked fields are both
OpenAI fronts' (services.openai_request): a long text prompt is tokenized in a worker process,
never on the event loop; above MAX_PROMPT_TOKENS tokens it is a 400, and with the tokenizer's
queue full a 503 (`type: server_error`). A client that leaves while its prompt is being sized
leaves a record (failed, "client disconnected", no tokens). `/v1/completions` also takes the
explicit `input_tokens` (and `hash_ids`) of a trace replay, which then replace the count and
the hashes. Output is `max_tokens` tokens (`max_completion_tokens` for chat; default 16),
`finish_reason` "length": the emulated engine generates counts, shown as whole-word tokens
that re-tokenize to the same count; with `engine: torch` the text is the tiny model's real
output, decoded (streamed as it is generated).

`model` must name the served model (`GET /v1/models`; absent: that one): another name is a 404
`NotFoundError`, "The model `x` does not exist.", as vLLM answers. `n` and `best_of` other
than 1, and a `stream` or `stream_options.include_usage` that is not a boolean, are 400s.

`stream: true` sends server-sent events, one chunk per batch of tokens the decode instance
produced (every token at `testbed up`), then `data: [DONE]`; with
`stream_options.include_usage` a last chunk carries `usage`, as OpenAI's API does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from testbed.metrics.records import RequestRecord
from testbed.services import openai_doc, openai_request
from testbed.services.openai_request import Sized
from testbed.services.router.dispatch import RouterState
from testbed.services.router.errors import CLIENT_GONE, SHUT_DOWN
from testbed.services.router.intake import (
    STATE,
    api_error,
    claim,
    hash_ids_field,
    positive_int,
    read_body,
    token_sink,
)
from testbed.services.router.text import codec

__all__ = ["MAX_INPUT_TOKENS", "MAX_OUTPUT_TOKENS", "chat_completions", "completions", "models"]

MAX_INPUT_TOKENS = 10_000_000
MAX_OUTPUT_TOKENS = 1_000_000
DEFAULT_MAX_TOKENS = 16


def _max_tokens(body: dict[str, Any]) -> int:
    """`max_completion_tokens` (OpenAI's newer name) or `max_tokens`; default 16."""
    key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    return positive_int(body, key, MAX_OUTPUT_TOKENS, DEFAULT_MAX_TOKENS)


def _error(
    status: type[web.HTTPException], message: str, kind: str, **extra: Any
) -> web.HTTPException:
    return status(
        text=json.dumps({"error": {"message": message, "type": kind, **extra}}),
        content_type="application/json",
    )


def _busy(message: str) -> web.HTTPException:
    """The tokenizer's queue is full: a 503 a client may retry."""
    return _error(web.HTTPServiceUnavailable, message, "server_error")


def _served(state: RouterState) -> list[str]:
    """The models this router serves: what `GET /v1/models` lists."""
    return [state.spec.model]


@dataclass(frozen=True)
class _Fields:
    """A request's fields other than the prompt, checked before the prompt is sized."""

    model: str
    stream: bool
    include_usage: bool
    output_tokens: int


def _fields(state: RouterState, body: dict[str, Any]) -> _Fields:
    openai_request.one_choice(body, api_error)
    model = openai_request.model_field(body, state.spec.model, api_error)
    if model not in _served(state):  # as vLLM answers a name it does not serve
        raise _error(web.HTTPNotFound, f"The model `{model}` does not exist.", "NotFoundError",
                     param="model", code=404)  # fmt: skip
    return _Fields(
        model,
        openai_request.stream_field(body, api_error),
        openai_request.include_usage(body, api_error),
        _max_tokens(body),
    )


async def _sized(
    state: RouterState, arrival: float, fields: _Fields, prompt: str | list[int]
) -> Sized:
    """The prompt's size; a client that leaves meanwhile (its handler is cancelled) leaves a
    record saying so, as one that leaves mid-stream does (services.router.dispatch)."""
    try:
        return await openai_request.size_prompt(prompt, error=api_error, busy=_busy)
    except asyncio.CancelledError:
        rec = RequestRecord(
            id=claim(state, {}),
            input_tokens=0,
            output_tokens=fields.output_tokens,
            arrival=arrival,
            failure_reason=SHUT_DOWN if state.closing else CLIENT_GONE,
        )
        state.record_log.append(rec)
        raise


class _Call:
    """One OpenAI request: the shape of its chunks and how it runs on the router."""

    def __init__(self, state: RouterState, fields: _Fields, chat: bool, arrival: float) -> None:
        self.state = state
        self.chat = chat
        self.rid = claim(state, {})
        self.cid = f"{'chatcmpl' if chat else 'cmpl'}-{self.rid}"
        self.created = int(time.time())
        self.model = fields.model
        self.stream = fields.stream
        self.include_usage = fields.include_usage
        self.arrival = arrival
        """When the router received the request (before reading and tokenizing it)."""

    def doc(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        kind = "text_completion"
        if self.chat:
            kind = "chat.completion.chunk" if self.stream else "chat.completion"
        return {
            "id": self.cid,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def choice(self, text: str, finish: str | None, first: bool = False) -> dict[str, Any]:
        return openai_doc.choice(self.chat, self.stream, text, finish, first)

    async def run(
        self,
        request: web.Request,
        input_tokens: int,
        output_tokens: int,
        hash_ids: tuple[int, ...],
    ) -> web.StreamResponse:
        state = self.state
        if self.stream:
            return await self._stream(request, input_tokens, output_tokens, hash_ids)
        total = 0

        async def count(n: int) -> None:
            nonlocal total
            total += n

        rec = await state.handle(
            self.rid, input_tokens, output_tokens, count, hash_ids, self.arrival
        )
        if rec.status != "completed":
            return web.json_response(
                {"error": {"message": rec.failure_reason, "type": "server_error"}}, status=503
            )
        doc = self.doc([self.choice(_output_text(rec, total), "length")])
        doc["usage"] = _usage(rec)
        return web.json_response(doc)

    async def _stream(
        self,
        request: web.Request,
        input_tokens: int,
        output_tokens: int,
        hash_ids: tuple[int, ...],
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        sent = 0

        def encode(n: int) -> bytes:
            nonlocal sent
            rec = self.state.live.get(self.rid)
            ids = rec.output_ids if rec is not None else None
            if ids is not None and len(ids) >= sent + n:  # engine: torch: the model's text
                text = codec().decode(ids[sent : sent + n])
            else:
                text = codec().filler_text(sent, n)
            doc = self.doc([self.choice(text, None, first=sent == 0)])
            sent += n
            return _event(doc)

        sink = token_sink(resp, encode)
        rec = await self.state.handle(
            self.rid, input_tokens, output_tokens, sink, hash_ids, self.arrival
        )
        if rec.status == "completed":
            tail = _event(self.doc([self.choice("", "length")]))
            if self.include_usage:
                usage = self.doc([])
                usage["usage"] = _usage(rec)
                tail += _event(usage)
        else:
            err = {"error": {"message": rec.failure_reason, "type": "server_error"}}
            tail = _event(err)
        with contextlib.suppress(ConnectionError, aiohttp.ClientConnectionResetError):
            await resp.write(tail + b"data: [DONE]\n\n")
        return resp


def _event(doc: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(doc, separators=(',', ':'))}\n\n".encode()


def _usage(rec: RequestRecord) -> dict[str, int]:
    return {
        "prompt_tokens": rec.input_tokens,
        "completion_tokens": rec.tokens_out,
        "total_tokens": rec.input_tokens + rec.tokens_out,
    }


def _output_text(rec: RequestRecord, n: int) -> str:
    """The model's real output when the engine has one (torch), else the filler words."""
    if rec.output_ids:
        return codec().decode(rec.output_ids)
    return codec().filler_text(0, n)


async def completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    arrival = state.clock.now()
    body = await read_body(request)
    if "prompt" not in body:
        raise api_error("prompt is required")
    fields = _fields(state, body)
    if "input_tokens" in body:  # a trace replay: its length and blocks, whatever the text
        input_tokens = positive_int(body, "input_tokens", MAX_INPUT_TOKENS)
        hash_ids = hash_ids_field(body, input_tokens)
    else:
        prompt = openai_request.completion_prompt(body["prompt"], api_error)
        sized = await _sized(state, arrival, fields, prompt)
        input_tokens, hash_ids = sized.tokens, sized.hashes
    call = _Call(state, fields, False, arrival)  # last: a refused request uses up no id
    return await call.run(request, input_tokens, fields.output_tokens, hash_ids)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    arrival = state.clock.now()
    body = await read_body(request)
    fields = _fields(state, body)
    text = openai_request.chat_text(body.get("messages"), api_error)
    sized = await _sized(state, arrival, fields, text)
    call = _Call(state, fields, True, arrival)
    return await call.run(request, sized.tokens, fields.output_tokens, sized.hashes)


async def models(request: web.Request) -> web.Response:
    """The one model the deployment serves (a request naming another is a 404)."""
    state = request.app[STATE]
    return web.json_response(
        {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "prfaas-testbed",
                    "max_model_len": MAX_INPUT_TOKENS,
                }
                for name in _served(state)
            ],
        }
    )
