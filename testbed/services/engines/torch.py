"""The tiny real model behind the services (`engine: torch`); torch is imported only when an
instance is built (`TorchPrefill.build`, `TorchDecode.build`), so importing this module needs
none (the module's name is the engine kind; absolute imports make `import torch` the library).

Prefill: `POST /prefill` takes the prompt's token ids (`tokens`, sent by the router). The KV is
the model's real tensors, sized by TinyConfig.layer_sizes (1:1 bytes, no byte_scale); each layer
is computed on a one-thread executor (the event loop keeps streaming the layers already done and
serving /stats) and handed to the transfer as soon as it is final. The answer carries
`first_token_id`: the first output token, computed here from the last prompt position, travels
on the control path (router -> decode), never inside the KV.

Decode: the KV is rebuilt from the received bytes (`TorchDecodeEngine.restore`); a
`KVFormatError` (KV from another model, a short or misplaced layer) ends the request with its
reason, never decoded; the first token comes from the router; the batch runs in
engine.torch.batch. The final line carries `token_ids`: the first token and every decoded one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from testbed.clock import Clock
from testbed.engine.torch.batch import TorchDecodeBatcher, TorchSlot
from testbed.engine.torch.config import TinyConfig
from testbed.engine.torch.live import tiny_config
from testbed.engine.torch.pacing import CpuPacer, ProfileBudget
from testbed.profiles import MODELS
from testbed.services.spec import ServiceSpec
from testbed.services.validate import BadRequest
from testbed.transfer.payload import PayloadSource

if TYPE_CHECKING:
    from testbed.engine.torch.engine import TorchDecodeEngine, TorchPrefillEngine

__all__ = ["MAX_PROMPT_TOKENS", "TorchDecode", "TorchPrefill"]

MAX_PROMPT_TOKENS = 1 << 16
"""Refused before torch sees it; the model's own context (4096) is checked by the engine."""


def _executor(spec: ServiceSpec) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"torch-{spec.id}")


def _one_thread() -> None:
    """The tiny model is per-op overhead: extra intra-op threads only spin against the event
    loop for the same cores. This process is ours, so it is set here, never at import."""
    import torch

    torch.set_num_threads(1)


def _freeze_heap() -> None:
    """Move everything alive after start-up (torch alone leaves ~200k objects) out of the
    collector's reach: a full collection walks them all, 150 ms measured on this host, and one
    landing inside a step makes it late by that much. What the run allocates is still collected."""
    import gc

    gc.collect()
    gc.freeze()


class TorchPrefill:
    kind = "torch"
    max_body = 4 << 20
    prefix_payload: PayloadSource | None = None

    def __init__(self, engine: TorchPrefillEngine, executor: ThreadPoolExecutor) -> None:
        self.engine = engine
        self.config: TinyConfig = engine.model.config
        self.executor = executor

    @classmethod
    def build(cls, spec: ServiceSpec, clock: Clock) -> TorchPrefill:
        """The instance's model, paced to the spec's profile on its hardware / time_scale."""
        from testbed.engine.torch.engine import TorchPrefillEngine
        from testbed.engine.torch.model import TinyHybridLM

        _one_thread()
        model = TinyHybridLM(tiny_config(spec.model_seed, spec.model_dtype))
        n_layers = model.config.n_layers
        budget = ProfileBudget(MODELS[spec.model], spec.hardware, spec.hardware, n_layers)
        executor = _executor(spec)
        engine = TorchPrefillEngine(model, pacer=CpuPacer(clock), budget=budget, executor=executor)
        _freeze_heap()
        return cls(engine, executor)

    def parse(self, body: dict[str, Any]) -> list[int]:
        tokens = body.get("tokens")
        vocab = self.config.vocab_size
        if not isinstance(tokens, list) or not 1 <= len(tokens) <= MAX_PROMPT_TOKENS:
            raise BadRequest("tokens must be a non-empty list of token ids (engine: torch)")
        if not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in tokens
        ):
            raise BadRequest(f"token ids must be integers in 0..{vocab - 1}")
        return tokens

    def tokens(self, work: list[int]) -> int:
        return len(work)

    def layer_sizes(self, work: list[int]) -> list[int]:
        return self.config.layer_sizes(0, len(work))

    async def run(
        self,
        rid: str,
        work: list[int],
        sizes: Sequence[int],
        on_layer: Callable[[int, Any], None],
    ) -> dict[str, Any]:
        async def layer_done(layer: int, data: bytes) -> None:
            on_layer(layer, data)

        result = await self.engine.run(work, layer_done)
        return {"first_token_id": result.first_token}

    def payload(self, rid: str, layer: int, item: Any) -> Any:
        return item  # the serialized layer itself

    def stats(self) -> dict[str, Any]:
        pacer = self.engine.pacer
        return dict(pacer.stats()) if pacer is not None else {}

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


class TorchDecode:
    kind = "torch"
    keep_payload = True
    relays_first_token = True
    serves_prefix = False

    def __init__(
        self,
        engine: TorchDecodeEngine,
        batcher: TorchDecodeBatcher,
        executor: ThreadPoolExecutor,
    ) -> None:
        self.engine = engine
        self.batcher = batcher
        self.executor = executor
        self.config: TinyConfig = engine.model.config
        self.max_output_tokens = self.config.max_positions
        self.vocab_size = self.config.vocab_size
        self.kv_rejected = 0
        """Requests whose verified KV did not fit the model (KVFormatError): never decoded."""

    @classmethod
    def build(cls, spec: ServiceSpec, clock: Clock, bs_max: int) -> TorchDecode:
        """The instance's model (same seed and dtype as every prefill of the run)."""
        from testbed.engine.torch.engine import TorchDecodeEngine
        from testbed.engine.torch.model import TinyHybridLM

        _one_thread()
        engine = TorchDecodeEngine(TinyHybridLM(tiny_config(spec.model_seed, spec.model_dtype)))
        n_layers = engine.model.config.n_layers
        budget = ProfileBudget(MODELS[spec.model], spec.hardware, spec.hardware, n_layers)
        executor = _executor(spec)
        batcher = TorchDecodeBatcher(engine, budget, CpuPacer(clock), bs_max, executor)
        _freeze_heap()
        return cls(engine, batcher, executor)

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
    ) -> TorchSlot | str:
        from testbed.engine.torch.codec import KVFormatError

        if layers is None or first_token is None:
            return "kv payload unavailable"
        loop = asyncio.get_running_loop()
        try:
            kv = await loop.run_in_executor(self.executor, self.engine.restore, layers)
        except KVFormatError as exc:  # intact bytes that are not this model's KV
            self.kv_rejected += 1
            return f"kv rejected: {exc}"
        limit = self.config.max_positions
        if kv.n_tokens + output_tokens - 1 > limit:
            return (
                f"{kv.n_tokens} prompt + {output_tokens} output tokens exceed the model's "
                f"context ({limit})"
            )
        return TorchSlot(rid, kv, [first_token], output_tokens, emit)

    def submit(self, handle: TorchSlot) -> None:
        self.batcher.submit(handle)

    def cancel(self, handle: TorchSlot) -> None:
        self.batcher.cancel(handle)

    def error(self, handle: TorchSlot) -> str | None:
        return handle.error

    def result(self, handle: TorchSlot) -> dict[str, Any]:
        return {"token_ids": handle.ids}

    def counters(self) -> dict[str, Any]:
        return {"kv_rejected": self.kv_rejected}

    def stats(self) -> dict[str, Any]:
        return dict(self.batcher.pacer.stats())

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
