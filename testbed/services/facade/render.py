"""`POST /v1/completions/render`, `/v1/chat/completions/render` and `/tokenize`, as a vLLM
worker answers them.

vllm-router's default policy, cache_aware, renders every request on **every** worker before it
routes it, and falls back to `/tokenize` on a worker without the render routes
(tests/services/facade/fixtures/vllm-router-0.1.17/cache_aware*.json); it counts the token ids
(`new_prefill_tokens` in its log) and matches their prefixes. It does not send them on: the
prefill and the decode get the client's text. So the ids need only the right number and equal
prefixes for equal prompt prefixes, and are made without tokenizing when the body has the load
generator's `input_tokens` and `hash_ids` (a 30K-token prompt rendered on a dozen workers would
otherwise cost each of them 0.06 s of CPU per request): each 512-token block's ids follow from
its hash id (the same words for the same hash id in the load generator's text, so the same ids
here). Other bodies (`/tokenize` gets `prompt` or `messages` only) are sized by the shipped
tokenizer as both halves size prompts (services.openai_request: a long one in a tokenizer
worker), the ids following from its block hashes.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any, Final

from aiohttp import web

from testbed.kvcache import BLOCK_TOKENS
from testbed.services import openai_request
from testbed.services.facade.openai import openai_error, prompt_size
from testbed.services.validate import json_body

__all__ = ["MAX_RENDER_TOKENS", "add_render_routes", "token_ids"]

MAX_RENDER_TOKENS: Final = openai_request.MAX_PROMPT_TOKENS
"""Token ids a render answers at most (a 400 above: some 7 MB of JSON)."""

_VOCAB: Final = 1 << 17
_STRIDE: Final = 7919


def token_ids(tokens: int, seeds: Sequence[int], unique: int) -> list[int]:
    """`tokens` ids, block by block: block i's from `seeds[i]`, blocks past the seeds from
    `unique` (the request's own)."""
    out: list[int] = []
    block = 0
    while len(out) < tokens:
        n = min(BLOCK_TOKENS, tokens - len(out))
        seed = seeds[block] if block < len(seeds) else hash((unique, block))
        base = (seed * 1_000_003) % _VOCAB
        out.extend((base + j * _STRIDE) % _VOCAB for j in range(n))
        block += 1
    return out


async def _ids(
    request: web.Request, chat: bool | None, counted: bool
) -> tuple[dict[str, Any], list[int]]:
    """The body and its ids; `chat` None: a chat prompt if the body has `messages`."""
    body = await json_body(request, error=openai_error)
    chat = "messages" in body if chat is None else chat
    tokens, seeds = await prompt_size(body, chat, counted=counted)
    if tokens > MAX_RENDER_TOKENS:
        raise openai_error(f"prompt too long to render: {tokens} tokens, at most "
                           f"{MAX_RENDER_TOKENS}")  # fmt: skip
    return body, token_ids(tokens, seeds, secrets.randbits(62))


def add_render_routes(app: web.Application, model: str) -> None:
    """The three routes on a worker's app."""

    def rendered(body: dict[str, Any], ids: list[int], kind: str) -> dict[str, Any]:
        name = body.get("model") if isinstance(body.get("model"), str) else model
        return {"request_id": f"{kind}-{secrets.token_hex(8)}", "token_ids": ids,
                "model": name, "sampling_params": {}, "token_offsets": None}  # fmt: skip

    async def completions(request: web.Request) -> web.Response:
        body, ids = await _ids(request, False, True)
        return web.json_response([rendered(body, ids, "cmpl")])

    async def chat(request: web.Request) -> web.Response:
        body, ids = await _ids(request, True, True)
        return web.json_response(rendered(body, ids, "chatcmpl"))

    async def tokenize(request: web.Request) -> web.Response:
        _body, ids = await _ids(request, None, False)
        return web.json_response({"count": len(ids), "max_model_len": MAX_RENDER_TOKENS,
                                  "tokens": ids, "token_strs": None})  # fmt: skip

    app.router.add_post("/v1/completions/render", completions)
    app.router.add_post("/v1/chat/completions/render", chat)
    app.router.add_post("/tokenize", tokenize)
