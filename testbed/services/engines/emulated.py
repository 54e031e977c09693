"""The emulated engine behind the services: profile-timed prefill whose KV is deterministic
bytes (transfer.payload), sized by S_kv / byte_scale; profile-timed continuous batching."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from testbed.clock import Clock
from testbed.engine.emulated import DecodeBatcher, DecodeSlot, PrefillEngine, wire_layer_bytes
from testbed.profiles import MODELS
from testbed.services.spec import ServiceSpec
from testbed.services.validate import int_field
from testbed.transfer.payload import PayloadSource

__all__ = ["EmulatedDecode", "EmulatedPrefill", "PrefillWork"]

MAX_TOKENS = 10_000_000
MAX_OUTPUT_TOKENS = 1_000_000


@dataclass(frozen=True)
class PrefillWork:
    uncached_tokens: int
    kv_tokens: int | None = None
    """Tokens whose KV goes to decode, when not the computed ones (prefix cache: the decode
    side already holds part of the prompt, or needs a cached part this prefill skipped)."""
    ready_at: float = field(default_factory=time.monotonic, compare=False)
    """Wall instant the request reached the worker (PrefillEngine.start_of)."""


class EmulatedPrefill:
    """`POST /prefill` takes `uncached_tokens` (and optionally `kv_tokens`)."""

    kind = None
    max_body = 1 << 20

    def __init__(self, spec: ServiceSpec, clock: Clock) -> None:
        self.engine = PrefillEngine(MODELS[spec.model], spec.hardware, clock, spec.byte_scale)
        self.byte_scale = spec.byte_scale
        self._source = PayloadSource(seed=hash(spec.id) & 0xFFFF)
        self.prefix_payload: PayloadSource | None = self._source

    def parse(self, body: dict[str, Any]) -> PrefillWork:
        tokens = int_field(body, "uncached_tokens", 1, MAX_TOKENS)
        kv = int_field(body, "kv_tokens", 1, MAX_TOKENS) if "kv_tokens" in body else None
        return PrefillWork(tokens, kv)

    def tokens(self, work: PrefillWork) -> int:
        return work.uncached_tokens

    def layer_sizes(self, work: PrefillWork) -> list[int]:
        kv_tokens = work.uncached_tokens if work.kv_tokens is None else work.kv_tokens
        return wire_layer_bytes(self.engine.model, kv_tokens, self.byte_scale)

    async def run(
        self,
        rid: str,
        work: PrefillWork,
        sizes: Sequence[int],
        on_layer: Callable[[int, Any], None],
    ) -> dict[str, Any]:
        async def layer_done(layer: int, nbytes: int) -> None:
            on_layer(layer, sizes[layer])  # the layer's KV as decode needs it

        await self.engine.run(work.uncached_tokens, layer_done, work.ready_at)
        # the start the profile's time counts from (PrefillEngine.start_of), for the record
        return {"prefill_start": self.engine.clock.at(self.engine.started_at)}

    def payload(self, rid: str, layer: int, item: Any) -> memoryview:
        return self._source.layer(rid, layer, int(item))

    def stats(self) -> dict[str, Any]:
        return self.engine.timing.stats()

    def close(self) -> None:
        pass


class EmulatedDecode:
    """The profile's T_decode(batch) on the run's clock, tokens coalesced per flush."""

    kind = None
    keep_payload = False
    relays_first_token = False
    serves_prefix = True
    max_output_tokens = MAX_OUTPUT_TOKENS
    vocab_size = 0

    def __init__(self, spec: ServiceSpec, clock: Clock, bs_max: int) -> None:
        profile = MODELS[spec.model].decode[spec.hardware]
        self.batcher = DecodeBatcher(profile.step_time, bs_max, clock, spec.flush_interval_s)

    def active(self) -> int:
        return len(self.batcher.active)

    def waiting(self) -> int:
        return len(self.batcher.waiting)

    async def run(self) -> None:
        await self.batcher.run()

    async def admit(
        self,
        rid: str,
        output_tokens: int,
        layers: list[bytearray] | None,
        first_token: int | None,
        emit: Callable[[int], None],
    ) -> DecodeSlot | str:
        return DecodeSlot(rid, output_tokens, emit=lambda k, _t: emit(k))

    def submit(self, handle: DecodeSlot) -> None:
        self.batcher.submit(handle)

    def cancel(self, handle: DecodeSlot) -> None:
        self.batcher.cancel(handle)

    def error(self, handle: DecodeSlot) -> str | None:
        return None

    def result(self, handle: DecodeSlot) -> dict[str, Any]:
        return {}

    def counters(self) -> dict[str, Any]:
        return {}

    def stats(self) -> dict[str, Any]:
        return self.batcher.timing.stats()

    def close(self) -> None:
        pass
