"""The OpenAI request as both OpenAI fronts read it: the prompt, its size and block hashes, and
the fields that must be what they say.

Our router's OpenAI front (services.router.openai) and the router-facing API's halves
(services.facade.openai) read the same shapes: a completions `prompt` (a string, one string in a
list, token ids, or one list of token ids) or chat `messages` (string content or text parts, one
line per message). It lives below both, as services.openai_doc does, so neither imports the
other.

Sizing a text prompt is CPU work (~1 s per MiB of text, holding the GIL), so a prompt longer
than INLINE_CHARS is tokenized and block-hashed in a worker process (services.tokenize_pool);
what crosses back is its token count and hashes. Limits, each an answer rather than a stall:

- MAX_PROMPT_TOKENS tokens per text prompt (400 above it). 2^20: a body is at most 1 MiB on
  every front and a byte-level BPE token is at least one byte, so no prompt a body can carry is
  refused today; the cap keeps the work and memory of one prompt bounded should a body limit
  grow, and it is far below MAX_INPUT_TOKENS (10M), the count a trace replay may state without
  any text.
- POOL_QUEUE prompts waiting for a tokenizer worker (503 beyond, in the front's error shape: a
  client may retry).
- A client that leaves while its prompt waits takes it out of the queue; one that leaves while
  it is being tokenized has its result dropped (the worker finishes that prompt: at most ~1 s).

Fields checked as vLLM's OpenAI server checks them (a 400 naming the field): `n` and `best_of`
must be 1 (one choice per request is all either front makes), `stream` and
`stream_options.include_usage` must be booleans (`"false"` is not), `stream_options` an object,
and `model` a string of at most MAX_MODEL_CHARS characters; whether it names a served model is
the front's to say (the router answers 404, as vLLM does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from testbed.services.tokenize_pool import PoolBusy, shared_pool
from testbed.services.tokenizer import block_hashes, measure_text
from testbed.services.validate import ErrorFactory

__all__ = [
    "INLINE_CHARS",
    "MAX_MODEL_CHARS",
    "MAX_PROMPT_TOKENS",
    "Sized",
    "chat_text",
    "completion_prompt",
    "include_usage",
    "model_field",
    "one_choice",
    "size_prompt",
    "stream_field",
]

MAX_PROMPT_TOKENS = 1 << 20
"""Tokens a text (or token-id) prompt may have (see the module's docstring for why 2^20)."""
INLINE_CHARS = 1024
"""Text prompts this short are tokenized on the event loop (~1 ms): no round trip to a worker."""
MAX_MODEL_CHARS = 256
"""Longest `model` name taken: it is echoed in every chunk of the answer."""
MAX_TOKEN_ID = 2**31


@dataclass(frozen=True)
class Sized:
    """A prompt's token count and its 512-token block hashes."""

    tokens: int
    hashes: tuple[int, ...]


def completion_prompt(prompt: Any, error: ErrorFactory) -> str | list[int]:
    """A completions `prompt`: a string, a list of one string, token ids, or a list of one list
    of token ids (one prompt per request)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and _token_ids(prompt):
        return prompt
    raise error("prompt must be a string or a non-empty list of token ids (one prompt)")


def _token_ids(values: list[Any]) -> bool:
    """Every value an int (not a bool) in 0..2^31-1, checked at C speed (a 1 MiB body holds
    half a million of them)."""
    return set(map(type, values)) <= {int} and min(values) >= 0 and max(values) < MAX_TOKEN_ID


def chat_text(messages: Any, error: ErrorFactory) -> str:
    """Chat `messages` as one text: each message's text content, one per line."""
    if not isinstance(messages, list) or not messages:
        raise error("messages must be a non-empty list")
    parts = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):  # content parts: keep the text ones
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise error("each message needs a string content (or text parts)")
        parts.append(content)
    return "\n".join(parts)


async def size_prompt(prompt: str | list[int], *, error: ErrorFactory, busy: ErrorFactory) -> Sized:
    """A prompt's token count and block hashes: `error` (400) above MAX_PROMPT_TOKENS, `busy`
    (503) when the tokenizer's queue is full. A long text is sized in a worker process."""
    if isinstance(prompt, list):
        if len(prompt) > MAX_PROMPT_TOKENS:
            raise error(_too_long(len(prompt)))
        return Sized(len(prompt), block_hashes(prompt))
    cap = MAX_PROMPT_TOKENS
    if len(prompt) <= INLINE_CHARS:
        tokens, hashes = measure_text(prompt, cap)
    else:
        try:
            tokens, hashes = await shared_pool().run(measure_text, prompt, cap)
        except PoolBusy as exc:
            raise busy(str(exc)) from None
    if tokens > cap:
        raise error(_too_long(tokens))
    return Sized(tokens, hashes)


def _too_long(n: int) -> str:
    return f"prompt too long: at least {n} tokens, at most {MAX_PROMPT_TOKENS} are taken"


def one_choice(body: dict[str, Any], error: ErrorFactory) -> None:
    """`n` and `best_of`: absent, null or 1 (each front makes one choice per request)."""
    for key in ("n", "best_of"):
        v = body.get(key)
        if v is not None and (type(v) is not int or v != 1):
            raise error(f"{key} must be 1 (one choice per request), got {_show(v)}")


def _flag(value: Any, key: str, error: ErrorFactory) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise error(f"{key} must be a boolean, got {_show(value)}")
    return value


def stream_field(body: dict[str, Any], error: ErrorFactory) -> bool:
    """`stream`: a boolean (absent or null: false)."""
    return _flag(body.get("stream"), "stream", error)


def include_usage(body: dict[str, Any], error: ErrorFactory) -> bool:
    """`stream_options.include_usage`: a boolean; `stream_options` an object (or absent)."""
    opts = body.get("stream_options")
    if opts is None:
        return False
    if not isinstance(opts, dict):
        raise error(f"stream_options must be an object, got {_show(opts)}")
    return _flag(opts.get("include_usage"), "stream_options.include_usage", error)


def model_field(body: dict[str, Any], default: str, error: ErrorFactory) -> str:
    """`model`: a string of at most MAX_MODEL_CHARS characters; absent, null or empty:
    `default` (as vLLM takes an empty name)."""
    v = body.get("model")
    if v is None or v == "":
        return default
    if not isinstance(v, str) or len(v) > MAX_MODEL_CHARS:
        raise error(f"model must be a string of at most {MAX_MODEL_CHARS} characters")
    return v


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."
