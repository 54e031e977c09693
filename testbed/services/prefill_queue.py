"""What every prefill worker shares, whatever its engine: a FIFO of jobs run one at a time, KV
senders per decode address, the transfers still streaming, the counters `/stats` reports, and
the shutdown. The emulated worker (services/prefill.py) and the torch one
(services/torch_prefill.py) differ only in how a job is prefilled and what its KV is.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Generic, Protocol, TypeVar

from testbed.services.kv_targets import KVTargets
from testbed.services.spec import RunClock, ServiceSpec
from testbed.transfer.sender import KVSender, pooled_sender

__all__ = ["PrefillQueue"]


class Job(Protocol):
    result: asyncio.Future[dict[str, Any]]


J = TypeVar("J", bound=Job)


class PrefillQueue(Generic[J]):
    def __init__(self, spec: ServiceSpec) -> None:
        self.spec = spec
        self.clock = RunClock(spec.t0, spec.time_scale)
        self.queue: asyncio.Queue[J] = asyncio.Queue()
        self.senders: dict[tuple[str, int], KVSender] = {}
        self.running: J | None = None
        self.queued_tokens = 0
        self.transfers: set[asyncio.Task[None]] = set()
        self.completed = 0
        self.failed = 0
        self.targets = KVTargets(spec.kv_targets)
        """The KV receivers this worker may send to (a 4xx before connecting, otherwise)."""

    def job_tokens(self, job: J) -> int:
        """Tokens the job adds to `queued_tokens` while it waits or runs."""
        raise NotImplementedError

    async def prefill(self, job: J) -> None:
        """Run one job: compute its KV and hand it to a transfer task (see `track`)."""
        raise NotImplementedError

    def submit(self, job: J) -> None:
        self.queued_tokens += self.job_tokens(job)
        self.queue.put_nowait(job)

    async def sender(self, target: tuple[str, int]) -> KVSender:
        return await pooled_sender(self.senders, target, self.spec.connections)

    def track(self, transfer: asyncio.Task[None]) -> None:
        """Keep a job's transfer task until it ends (the engine does not wait for it)."""
        self.transfers.add(transfer)
        transfer.add_done_callback(self.transfers.discard)

    async def worker(self) -> None:
        """One prefill at a time, in arrival order."""
        while True:
            job = await self.queue.get()
            self.running = job
            try:
                await self.prefill(job)
            except Exception as exc:  # a broken job must not stop the instance
                if not job.result.done():
                    job.result.set_result({"error": f"prefill failed: {exc!r}"})
            finally:
                self.queued_tokens -= self.job_tokens(job)
                self.running = None

    def queue_stats(self) -> dict[str, Any]:
        """The `/stats` fields every prefill worker reports (the engine's own come on top)."""
        senders = [s.stats() for s in self.senders.values()]
        return {
            "id": self.spec.id,
            "role": "prefill",
            "cluster": self.spec.cluster,
            "queued": self.queue.qsize(),
            "running": self.running is not None,
            "queued_tokens": self.queued_tokens,
            "transfers_in_flight": len(self.transfers),
            "completed": self.completed,
            "failed": self.failed,
            "egress_bytes_per_s": sum(s.egress_rate_ewma for s in senders),
            "in_flight_bytes": sum(s.inflight_bytes for s in senders),
            "bytes_sent": sum(s.bytes_sent for s in senders),
            "stall_s": sum(s.stall_s for s in senders),
            "bytes_acked": sum(s.bytes_acked for s in senders),
            "queued_bytes": sum(s.queued_bytes for s in senders),
        }

    async def aclose(self, worker: asyncio.Task[None]) -> None:
        """Stop the worker and every transfer, close the senders."""
        worker.cancel()
        for t in list(self.transfers):
            t.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
        for s in self.senders.values():
            await s.aclose()
