"""Prefill and decode instances of the tiny real model, shaped like the emulated engine.

`TorchPrefillEngine.run` computes a prompt layer by layer (resuming from a prefix-cache hit when
it has a cache) and hands each layer's serialized KV to a sink as soon as the layer is done:
plug a `KVTransmission.send_layer` in and the real tensors stream across the link while the next
layer computes. `TorchDecodeEngine` rebuilds the KV from the received bytes and continues greedy
decoding. Both pad their steps to the hardware profile (pacing.py) when given a pacer.

The first output token is produced by prefill (from the last prompt position) and travels on the
control path (the prefill's answer to the router), not inside the KV, as in real PD serving.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TypeVar

from testbed.engine.torch.codec import Buffer, decode_layers, encode_layer
from testbed.engine.torch.kvstate import KVState
from testbed.engine.torch.model import TinyHybridLM
from testbed.engine.torch.pacing import CpuPacer, ProfileBudget
from testbed.engine.torch.prefix import TorchPrefixCache

__all__ = ["LayerSink", "PrefillResult", "TorchDecodeEngine", "TorchPrefillEngine"]

LayerSink = Callable[[int, bytes], Awaitable[None]]
"""Called with (layer index, serialized KV of that layer) in layer order."""

_T = TypeVar("_T")


async def _compute(executor: Executor | None, fn: Callable[[], _T]) -> _T:
    """Run synchronous torch work inline, or on `executor` so the event loop stays free."""
    if executor is None:
        return fn()
    return await asyncio.get_running_loop().run_in_executor(executor, fn)


@dataclass
class PrefillResult:
    """What a prefill produced. `layers` is the transfer cache: the bytes handed to the sink,
    kept so a failed transfer can be re-sent without recomputing."""

    first_token: int
    prompt_tokens: int
    cached_tokens: int
    """Tokens reused from the prefix cache (only the rest was computed)."""
    kv_start: int
    """Latent rows before this token were left out of the KV (the decode side holds them)."""
    state: KVState
    layers: list[bytes] = field(default_factory=list)
    blocks_cached: int = 0

    @property
    def layer_sizes(self) -> list[int]:
        return [len(b) for b in self.layers]


class TorchPrefillEngine:
    """One prefill instance: a model, optionally a prefix cache and a pacer.

    With an `executor` (a live service passes a one-thread pool), each layer's compute and
    serialization run there, so the event loop keeps streaming earlier layers' KV meanwhile;
    without one (verify-model, tests) they run inline.
    """

    def __init__(
        self,
        model: TinyHybridLM,
        *,
        prefix_cache: TorchPrefixCache | None = None,
        pacer: CpuPacer | None = None,
        budget: ProfileBudget | None = None,
        executor: Executor | None = None,
    ) -> None:
        if (pacer is None) != (budget is None):
            raise ValueError("a pacer needs a budget and vice versa")
        self.model = model
        self.prefix_cache = prefix_cache
        self.pacer = pacer
        self.budget = budget
        self.executor = executor

    def layer_sizes(self, prompt_tokens: int, kv_start: int = 0) -> list[int]:
        """Wire bytes per layer a prefill of this length will emit (known before it starts)."""
        return self.model.config.layer_sizes(kv_start, prompt_tokens)

    async def run(
        self, tokens: Sequence[int], on_layer: LayerSink | None = None, *, kv_start: int = 0
    ) -> PrefillResult:
        """Prefill `tokens`, emitting each layer's KV (latent rows from `kv_start`) in order."""
        cache = self.prefix_cache
        hit = cache.lookup(tokens) if cache is not None else None
        snap = cache.snapshot_point(len(tokens)) if cache is not None else None
        run = self.model.prefill(tokens, hit.state if hit else None, snapshot_at=snap)
        cached = run.start
        if not 0 <= kv_start <= len(tokens):
            raise ValueError(f"kv_start {kv_start} outside the prompt")
        layers: list[bytes] = []
        cfg = self.model.config
        steps = iter(run)

        def next_layer() -> tuple[int, bytes] | None:
            # The layer's KV is final once the layer is done: serialize and hand it over now,
            # so its transfer overlaps with the remaining layers (layer-wise pipelining).
            layer = next(steps, None)
            if layer is None:  # the iterator's tail computed the first token
                return None
            return layer, encode_layer(cfg, run.state, layer, kv_start, len(tokens))

        started = time.monotonic()
        while (item := await _compute(self.executor, next_layer)) is not None:
            layer, data = item
            if self.pacer is not None and self.budget is not None:
                await self.pacer.pace(
                    "prefill_layer", started, self.budget.prefill_layer_s(len(tokens) - cached)
                )
            started = time.monotonic()
            layers.append(data)
            if on_layer is not None:
                await on_layer(layer, data)
        assert run.first_token is not None
        result = PrefillResult(run.first_token, len(tokens), cached, kv_start, run.state, layers)
        if cache is not None:
            result.blocks_cached = await _compute(
                self.executor, lambda: cache.store(tokens, run.state, run.snapshot)
            )
        return result


class TorchDecodeEngine:
    """One decode instance: rebuild KV from bytes, then greedy steps (paced if asked)."""

    def __init__(
        self,
        model: TinyHybridLM,
        *,
        pacer: CpuPacer | None = None,
        budget: ProfileBudget | None = None,
    ) -> None:
        if (pacer is None) != (budget is None):
            raise ValueError("a pacer needs a budget and vice versa")
        self.model = model
        self.pacer = pacer
        self.budget = budget

    def restore(self, layers: Sequence[Buffer], prefix: KVState | None = None) -> KVState:
        """The KV from received layer records (raises codec.KVFormatError if they do not fit)."""
        return decode_layers(self.model.config, layers, prefix)

    async def generate(self, state: KVState, first_token: int, max_new_tokens: int) -> list[int]:
        """[first_token, ...] greedy continuation, max_new_tokens long (a decode batch of one,
        paced per step if asked; `state` is copied, not advanced)."""
        from testbed.engine.torch.batched import DecodeBatch

        out = [int(first_token)]
        if max_new_tokens <= 1:
            return out[:max_new_tokens]
        batch = DecodeBatch(self.model)
        row = batch.add(out, state, out[0])
        while len(out) < max_new_tokens:
            started = time.monotonic()
            out.append(batch.step()[row])
            if self.pacer is not None and self.budget is not None:
                await self.pacer.pace("decode_step", started, self.budget.decode_step_s(1))
        return out
