"""`POST /v1/completions`, OpenAI-compatible: `prompt` (a string, a list of strings or of token
ids; about 4 characters a token) or `input_tokens`, `max_tokens` (default 16), and `stream: true`
for server-sent events. The text is placeholder tokens (` t0 t1 ...`): the emulated engine
generates counts, not words."""

from __future__ import annotations

import contextlib
import json
import math
import time
from typing import Any

import aiohttp
from aiohttp import web

from testbed.services.router.intake import (
    STATE,
    api_error,
    claim,
    positive_int,
    read_body,
    token_sink,
)

__all__ = ["MAX_INPUT_TOKENS", "MAX_OUTPUT_TOKENS", "completions"]

MAX_INPUT_TOKENS = 10_000_000
MAX_OUTPUT_TOKENS = 1_000_000
DEFAULT_MAX_TOKENS = 16


def _prompt_tokens(prompt: Any) -> int:
    """Rough token count of an OpenAI prompt (about 4 characters a token)."""
    if isinstance(prompt, list):
        if all(isinstance(p, int) for p in prompt):
            return max(1, len(prompt))
        prompt = "".join(str(p) for p in prompt)
    return max(1, math.ceil(len(str(prompt)) / 4))


def _token_text(start: int, n: int) -> str:
    return "".join(f" t{i}" for i in range(start, start + n))


async def completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    body = await read_body(request)
    if "prompt" not in body:
        raise api_error("prompt is required")
    if "input_tokens" in body:
        input_tokens = positive_int(body, "input_tokens", MAX_INPUT_TOKENS)
    else:
        input_tokens = _prompt_tokens(body["prompt"])
        if input_tokens > MAX_INPUT_TOKENS:
            raise api_error(f"prompt too long (at most {MAX_INPUT_TOKENS} tokens)")
    output_tokens = positive_int(body, "max_tokens", MAX_OUTPUT_TOKENS, DEFAULT_MAX_TOKENS)
    rid = claim(state, {})
    cid = f"cmpl-{rid}"
    created = int(time.time())
    model = str(body.get("model", state.spec.model))

    def chunk(text: str, finish: str | None) -> dict[str, Any]:
        return {
            "id": cid,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
        }

    if body.get("stream"):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        sent = 0

        def encode(n: int) -> bytes:
            nonlocal sent
            doc = chunk(_token_text(sent, n), None)
            sent += n
            return f"data: {json.dumps(doc)}\n\n".encode()

        rec = await state.handle(rid, input_tokens, output_tokens, token_sink(resp, encode))
        if rec.status == "completed":
            tail = f"data: {json.dumps(chunk('', 'length'))}\n\n"
        else:
            err = {"error": {"message": rec.failure_reason, "type": "server_error"}}
            tail = f"data: {json.dumps(err)}\n\n"
        with contextlib.suppress(ConnectionError, aiohttp.ClientConnectionResetError):
            await resp.write(tail.encode() + b"data: [DONE]\n\n")
        return resp

    total = 0

    async def count(n: int) -> None:
        nonlocal total
        total += n

    rec = await state.handle(rid, input_tokens, output_tokens, count)
    if rec.status != "completed":
        return web.json_response(
            {"error": {"message": rec.failure_reason, "type": "server_error"}}, status=503
        )
    doc = chunk(_token_text(0, total), "length")
    doc["usage"] = {
        "prompt_tokens": input_tokens,
        "completion_tokens": total,
        "total_tokens": input_tokens + total,
    }
    return web.json_response(doc)
