"""What a request is for the engine the deployment runs: its prompt and its KV size.

The router treats both engines alike except here. The emulated engine sizes KV from the model
profile (scaled by byte_scale) and works on token counts; the tiny real model (`engine: torch`)
needs the prompt's token ids, sends the whole prompt's real KV tensors (so no prefix cache), and
hands its first output token to the decode instance through the router (the control path).
"""

from __future__ import annotations

from typing import Any, Protocol

from testbed.engine.emulated import wire_layer_bytes
from testbed.engine.torch import live
from testbed.metrics.records import RequestRecord
from testbed.profiles import MODELS
from testbed.services.spec import ServiceSpec

__all__ = ["EmulatedRequests", "EngineRequests", "TorchRequests", "engine_requests"]


class EngineRequests(Protocol):
    """The router's strategy for one engine kind."""

    prefix_cache: bool
    """Whether the router's prefix cache (kvcache.manager) may shorten what prefill computes."""
    relays_first_token: bool
    """Whether the prefill's answer carries the first token, which the router forwards to the
    decode instance (`POST /decode/{id}/first_token`)."""

    def kv_wire_bytes(self, input_tokens: int, kv_tokens: int) -> int:
        """Wire bytes of the KV a request's decode instance must receive."""
        ...

    def prefill_fields(self, rec: RequestRecord, tokens: int, kv_tokens: int) -> dict[str, Any]:
        """The engine's own fields of `POST /prefill` (it may note the prompt in `rec`)."""
        ...


class EmulatedRequests:
    """Token counts only; KV sized by the model profile, divided by byte_scale."""

    prefix_cache = True
    relays_first_token = False

    def __init__(self, spec: ServiceSpec) -> None:
        self.model = MODELS[spec.model]
        self.byte_scale = spec.byte_scale

    def kv_wire_bytes(self, input_tokens: int, kv_tokens: int) -> int:
        return sum(wire_layer_bytes(self.model, kv_tokens, self.byte_scale))

    def prefill_fields(self, rec: RequestRecord, tokens: int, kv_tokens: int) -> dict[str, Any]:
        # decode holds part of the prompt, or needs more than is computed (prefix cache)
        return {"kv_tokens": kv_tokens} if kv_tokens != tokens else {}


class TorchRequests:
    """Real token ids drawn from (prompt seed, request id, length); the whole prompt's real KV.
    Torch-free: sizes and prompts come from the model's config (engine.torch.live)."""

    prefix_cache = False
    relays_first_token = True

    def __init__(self, spec: ServiceSpec) -> None:
        self.config = live.tiny_config(spec.model_seed, spec.model_dtype)
        self.prompt_seed = spec.prompt_seed

    def kv_wire_bytes(self, input_tokens: int, kv_tokens: int) -> int:
        return sum(self.config.layer_sizes(0, input_tokens))  # real tensors, the whole prompt

    def prefill_fields(self, rec: RequestRecord, tokens: int, kv_tokens: int) -> dict[str, Any]:
        ids = live.prompt_ids(self.prompt_seed, rec.id, rec.input_tokens, self.config.vocab_size)
        rec.prompt_digest = live.ids_digest(ids)
        return {"tokens": ids}


def engine_requests(spec: ServiceSpec) -> EngineRequests:
    """The strategy for the spec's engine."""
    return TorchRequests(spec) if spec.engine == "torch" else EmulatedRequests(spec)
