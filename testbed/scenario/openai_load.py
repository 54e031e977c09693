"""The load generator's side of an external router: each request as an OpenAI
`/v1/completions` call, streamed, and what the client saw of it.

The prompt is text, made per 512-token block from the request's hash ids (each block the same
words for the same hash id), so a router's text radix tree (SGLang's cache_aware) sees the
prefix sharing the trace has; token-id prompts are never sent (sglang-router 0.3.2 answers them
422). The body also carries `input_tokens` and `hash_ids` (the workers size the prompt from them
without tokenizing) and `testbed_request_id`, which the records join on: SGLang's gateway passes
unknown top-level fields of completions requests through (tests/services/facade/fixtures).
"""

from __future__ import annotations

import asyncio
import json
import random
import zlib
from dataclasses import dataclass
from typing import Any

import aiohttp

from testbed.clock import LiveClock
from testbed.kvcache import BLOCK_TOKENS
from testbed.services.router.text import codec
from testbed.workload.generate import RequestSpec

__all__ = ["ClientView", "PromptText", "submit"]


@dataclass
class ClientView:
    """One request as the client saw it (times on the load's clock)."""

    sent: float
    first_token: float | None = None
    last_token: float | None = None
    tokens: int = 0
    error: str | None = None


class PromptText:
    """Prompt text by blocks: 512 one-token words per block, chosen by the block's hash id."""

    def __init__(self) -> None:
        self.words = codec().filler
        self.blocks: dict[tuple[int, int], str] = {}

    def block(self, hash_id: int, n: int) -> str:
        key = (hash_id, n)
        text = self.blocks.get(key)
        if text is None:
            rng = random.Random(hash_id)
            text = "".join(rng.choice(self.words) for _ in range(n))
            self.blocks[key] = text
        return text

    def prompt(self, req: RequestSpec) -> str:
        blocks = -(-req.input_tokens // BLOCK_TOKENS)
        ids = list(req.hash_ids[:blocks])
        # blocks the trace did not hash are the request's own
        ids += [zlib.crc32(f"{req.id}/{i}".encode()) for i in range(len(ids), blocks)]
        parts = []
        for i, h in enumerate(ids):
            n = min(BLOCK_TOKENS, req.input_tokens - i * BLOCK_TOKENS)
            parts.append(self.block(h, n))
        return "".join(parts)


def request_body(req: RequestSpec, prompt: str, model: str) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": req.output_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "input_tokens": req.input_tokens,
        "hash_ids": list(req.hash_ids),
        "testbed_request_id": req.id,
    }


def _message(text: str) -> str:
    try:
        err = json.loads(text).get("error")
    except (ValueError, AttributeError):
        return text.strip()[:300]
    if isinstance(err, dict):
        err = err.get("message", err)
    return str(err)[:300]


async def submit(
    session: aiohttp.ClientSession,
    url: str,
    req: RequestSpec,
    body: dict[str, Any],
    clock: LiveClock,
) -> ClientView:
    """Send one request to the router at `url`; the view is complete when the stream ended (an
    error is the router's reason, as the client got it)."""
    view = ClientView(sent=clock.now())
    text = ""
    usage: int | None = None
    try:
        async with session.post(f"{url}/v1/completions", json=body) as resp:
            if resp.status != 200:
                view.error = f"router answered HTTP {resp.status}: {_message(await resp.text())}"
                return view
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                doc = json.loads(data)
                if "error" in doc:
                    view.error = f"router: {_message(data.decode())}"
                    continue
                if isinstance(doc.get("usage"), dict):
                    usage = int(doc["usage"].get("completion_tokens", 0))
                for choice in doc.get("choices") or ():
                    piece = choice.get("text") or (choice.get("delta") or {}).get("content")
                    if piece:
                        t = clock.now()
                        view.first_token = t if view.first_token is None else view.first_token
                        view.last_token = t
                        text += piece
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        view.error = f"client: {type(exc).__name__}: {exc}"
    if usage is None:  # no usage chunk (a broken stream): count what came
        usage = len(await asyncio.to_thread(codec().encode, text)) if text else 0
    view.tokens = usage
    if view.error is None and usage != req.output_tokens:
        view.error = f"router: streamed {usage} of {req.output_tokens} tokens"
    return view
