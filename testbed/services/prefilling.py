"""What a prefill worker is, whatever API it is called through: its jobs and its state (the
FIFO of services.prefill_queue, the engine adapter, each job's layer-by-layer transfer). Our
router's `POST /prefill` (services.prefill) and the router-facing API of external routers
(services.facade) both queue `PrefillJob`s here, so a prompt is prefilled and its KV sent by the
same rules whichever router sent it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from testbed.services.engines import prefill_adapter
from testbed.services.engines.base import PrefillAdapter
from testbed.services.prefill_queue import PrefillQueue
from testbed.services.spec import ServiceSpec
from testbed.transfer.errors import TransferError

__all__ = ["PrefillJob", "PrefillState"]


@dataclass
class PrefillJob:
    id: str
    work: Any
    """What the engine needs of this request (PrefillAdapter.parse)."""
    target: tuple[str, int]
    result: asyncio.Future[dict[str, Any]]
    queued_at: float = 0.0
    times: dict[str, float] = field(default_factory=dict)
    answer: dict[str, Any] = field(default_factory=dict)
    """The engine's fields of the answer (PrefillAdapter.run)."""
    resolve: Callable[[PrefillJob], Awaitable[None]] | None = None
    """Where the KV goes, when it is not known as the job is queued: awaited by the transfer
    before it opens, it sets `id` (the wire id) and `target`. The router-facing API's prefill
    half (services.facade) queues at once and learns both when the room's decode registers."""
    on_prefilled: Callable[[PrefillJob], None] | None = None
    """Called once the KV is computed (prefill_end set), before the transfer has sent it all:
    the router-facing API's `vllm` flavour answers its router then and holds the KV for the
    decode's pull."""


class PrefillState(PrefillQueue[PrefillJob]):
    def __init__(self, spec: ServiceSpec, engine: PrefillAdapter[Any] | None = None) -> None:
        super().__init__(spec)
        self.engine = engine if engine is not None else prefill_adapter(spec, self.clock)
        self.prompt_tokens = 0
        """Tokens prefilled by requests that completed (vllm:prompt_tokens_total)."""

    def job_tokens(self, job: PrefillJob) -> int:
        return self.engine.tokens(job.work)

    async def prefill(self, job: PrefillJob) -> None:
        sizes = self.engine.layer_sizes(job.work)
        layers: asyncio.Queue[tuple[int, Any] | None] = asyncio.Queue()
        job.times["prefill_start"] = self.clock.now()
        self.track(job, self._transfer(job, sizes, layers))

        def on_layer(layer: int, item: Any) -> None:
            layers.put_nowait((layer, item))

        try:
            job.answer = await self.engine.run(job.id, job.work, sizes, on_layer)
            job.times["prefill_end"] = self.clock.now()
            if "prefill_start" in job.answer:  # the engine counted from an earlier start
                job.times["prefill_start"] = float(job.answer.pop("prefill_start"))
            if job.on_prefilled is not None:
                job.on_prefilled(job)
        finally:
            layers.put_nowait(None)  # after prefill_end: the transfer checks it at the sentinel

    async def _transfer(
        self, job: PrefillJob, sizes: Sequence[int], layers: asyncio.Queue[tuple[int, Any] | None]
    ) -> None:
        sent = 0
        try:
            if job.resolve is not None:  # the layers queue meanwhile: none is lost
                await job.resolve(job)
            sender = await self.sender(job.target)
            async with sender.open(job.id, list(sizes)) as tx:
                while (item := await layers.get()) is not None:
                    layer, data = item
                    if "transfer_start" not in job.times:
                        job.times["transfer_start"] = self.clock.now()
                    buf = self.engine.payload(job.id, layer, data)
                    await tx.send_layer(layer, buf)
                    sent += len(buf)
                if "prefill_end" not in job.times:  # the prefill broke: abort, never half a KV
                    raise RuntimeError("prefill did not finish")
            job.times["transfer_end"] = self.clock.now()
            self._complete(job, kv_wire_bytes_sent=sent, **job.answer)
        except (TransferError, OSError, TimeoutError, RuntimeError) as exc:  # others: track()
            reason = exc.reason if isinstance(exc, TransferError) else repr(exc)
            self._fail(job, f"kv transfer: {reason}", kv_wire_bytes_sent=sent)
