"""The shape of one OpenAI `choices` entry, for completions and chat, streamed or not.

Our router's OpenAI front (services.router.openai) and the router-facing API's decode half
(services.facade.openai) both answer clients in it; it lives below both so neither imports the
other (the router imports the decode worker, which serves the façade).
"""

from __future__ import annotations

from typing import Any

__all__ = ["choice"]


def choice(chat: bool, stream: bool, text: str, finish: str | None, first: bool) -> dict[str, Any]:
    """A completion's `text` choice, a chat stream's `delta` (with the role on the first chunk)
    or a chat answer's `message`."""
    if not chat:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    if stream:
        delta: dict[str, Any] = {"content": text}
        if first:
            delta["role"] = "assistant"
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    msg = {"role": "assistant", "content": text}
    return {"index": 0, "message": msg, "logprobs": None, "finish_reason": finish}
