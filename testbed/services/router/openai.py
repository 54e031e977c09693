"""The OpenAI surface: `POST /v1/completions`, `POST /v1/chat/completions`, `GET /v1/models`.

Prompts are counted with the shipped tokenizer (services.router.text), so `usage` is what a
client counting with the same tokenizer counts, and text prompts get prefix-cache block hashes
from their token ids. `/v1/completions` also takes the explicit `input_tokens` (and `hash_ids`)
of a trace replay, which then replace the count and the hashes. Output is `max_tokens` tokens
(`max_completion_tokens` for chat; default 16), `finish_reason` "length": the emulated engine
generates counts, shown as whole-word tokens that re-tokenize to the same count; with `engine:
torch` the text is the tiny model's real output, decoded (streamed as it is generated).

`stream: true` sends server-sent events, one chunk per batch of tokens the decode instance
produced (every token at `testbed up`), then `data: [DONE]`; with
`stream_options.include_usage` a last chunk carries `usage`, as OpenAI's API does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import aiohttp
from aiohttp import web

from testbed.metrics.records import RequestRecord
from testbed.services import openai_doc
from testbed.services.router.dispatch import RouterState
from testbed.services.router.intake import (
    STATE,
    api_error,
    claim,
    hash_ids_field,
    positive_int,
    read_body,
    token_sink,
)
from testbed.services.router.text import block_hashes, codec

__all__ = ["MAX_INPUT_TOKENS", "MAX_OUTPUT_TOKENS", "chat_completions", "completions", "models"]

MAX_INPUT_TOKENS = 10_000_000
MAX_OUTPUT_TOKENS = 1_000_000
DEFAULT_MAX_TOKENS = 16
MAX_PROMPT_CHARS = 64 << 20
"""Longest text prompt the router tokenizes (the body limit bounds it already; this says so)."""


async def _prompt_ids(prompt: Any) -> list[int]:
    """A completions `prompt` as token ids: a string, a list of one string, token ids, or a
    list of one list of token ids (one prompt per request)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return await _encode(prompt)
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**31 for t in prompt)
    ):
        return [int(t) for t in prompt]
    raise api_error("prompt must be a string or a non-empty list of token ids (one prompt)")


async def _chat_ids(messages: Any) -> list[int]:
    """Chat `messages` as token ids: each message's text content, one per line."""
    if not isinstance(messages, list) or not messages:
        raise api_error("messages must be a non-empty list")
    parts = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):  # content parts: keep the text ones
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise api_error("each message needs a string content (or text parts)")
        parts.append(content)
    return await _encode("\n".join(parts))


async def _encode(text: str) -> list[int]:
    """Token ids of a text prompt, tokenized off the event loop: a 40K-token prompt takes
    about 0.1 s, which would otherwise delay every other request's streamed tokens."""
    if len(text) > MAX_PROMPT_CHARS:
        raise api_error(f"prompt too long (at most {MAX_PROMPT_CHARS} characters)")
    ids = await asyncio.to_thread(codec().encode, text)
    return ids or [0]  # an empty prompt still prefills one token


def _max_tokens(body: dict[str, Any]) -> int:
    """`max_completion_tokens` (OpenAI's newer name) or `max_tokens`; default 16."""
    key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    return positive_int(body, key, MAX_OUTPUT_TOKENS, DEFAULT_MAX_TOKENS)


def _include_usage(body: dict[str, Any]) -> bool:
    opts = body.get("stream_options")
    return isinstance(opts, dict) and bool(opts.get("include_usage"))


class _Call:
    """One OpenAI request: the shape of its chunks and how it runs on the router."""

    def __init__(
        self, state: RouterState, body: dict[str, Any], chat: bool, arrival: float
    ) -> None:
        self.state = state
        self.chat = chat
        self.rid = claim(state, {})
        self.cid = f"{'chatcmpl' if chat else 'cmpl'}-{self.rid}"
        self.created = int(time.time())
        self.model = str(body.get("model", state.spec.model))
        self.stream = bool(body.get("stream"))
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
        body: dict[str, Any],
        input_tokens: int,
        output_tokens: int,
        hash_ids: tuple[int, ...],
    ) -> web.StreamResponse:
        state = self.state
        if self.stream:
            return await self._stream(request, body, input_tokens, output_tokens, hash_ids)
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
        body: dict[str, Any],
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
            if _include_usage(body):
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
    if "input_tokens" in body:  # a trace replay: its length and blocks, whatever the text
        input_tokens = positive_int(body, "input_tokens", MAX_INPUT_TOKENS)
        hash_ids = hash_ids_field(body, input_tokens)
    else:
        ids = await _prompt_ids(body["prompt"])
        input_tokens = len(ids)
        hash_ids = block_hashes(ids)
    if input_tokens > MAX_INPUT_TOKENS:
        raise api_error(f"prompt too long (at most {MAX_INPUT_TOKENS} tokens)")
    output_tokens = _max_tokens(body)
    call = _Call(state, body, False, arrival)  # last: a refused request uses up no id
    return await call.run(request, body, input_tokens, output_tokens, hash_ids)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    arrival = state.clock.now()
    body = await read_body(request)
    ids = await _chat_ids(body.get("messages"))
    if len(ids) > MAX_INPUT_TOKENS:
        raise api_error(f"prompt too long (at most {MAX_INPUT_TOKENS} tokens)")
    output_tokens = _max_tokens(body)
    call = _Call(state, body, True, arrival)
    return await call.run(request, body, len(ids), output_tokens, block_hashes(ids))


async def models(request: web.Request) -> web.Response:
    """The one model the deployment serves (any `model` name is accepted in requests)."""
    state = request.app[STATE]
    return web.json_response(
        {
            "object": "list",
            "data": [
                {
                    "id": state.spec.model,
                    "object": "model",
                    "created": 0,
                    "owned_by": "prfaas-testbed",
                    "max_model_len": MAX_INPUT_TOKENS,
                }
            ],
        }
    )
