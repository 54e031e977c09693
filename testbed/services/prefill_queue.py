"""What every prefill worker shares, whatever its engine: a FIFO of jobs run one at a time, KV
senders per decode address, the transfers still streaming, the counters `/stats` reports, and
the shutdown. The prefill worker (services/prefill.py) adds the request's fields and the
engine adapter (services/engines), which says how a job is prefilled and what its KV is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any, Generic, Protocol, TypeVar

from testbed.clock import LiveClock
from testbed.services.kv_targets import KVTargets
from testbed.services.spec import ServiceSpec
from testbed.transfer.sender import KVSender, pooled_sender

__all__ = ["PrefillQueue"]

log = logging.getLogger(__name__)


class Job(Protocol):
    id: str
    result: asyncio.Future[dict[str, Any]]
    times: dict[str, float]


def job_id(job: Job) -> str:
    return job.id


J = TypeVar("J", bound=Job)


class PrefillQueue(Generic[J]):
    def __init__(self, spec: ServiceSpec) -> None:
        self.spec = spec
        self.clock = LiveClock.of(spec)
        self.queue: asyncio.Queue[J] = asyncio.Queue()
        self.senders: dict[tuple[str, int], KVSender] = {}
        self.running: J | None = None
        self._running_task: asyncio.Task[None] | None = None
        self.queued_tokens = 0
        self.transfers: set[asyncio.Task[None]] = set()
        self._transfer_of: dict[int, asyncio.Task[None]] = {}
        """A job's transfer task, by id(job), while it streams (see cancel)."""
        self.cancelled = 0
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

    async def run_job(self, job: J) -> dict[str, Any]:
        """Queue a job and wait for its answer. If the requester goes away meanwhile (the
        services run with aiohttp's handler cancellation, so a closed connection cancels the
        handler), the job is cancelled with it."""
        self.submit(job)
        try:
            return await asyncio.shield(job.result)
        except asyncio.CancelledError:
            self.cancel(job, "cancelled: the requester went away")
            raise

    async def sender(self, target: tuple[str, int]) -> KVSender:
        return await pooled_sender(self.senders, target, self.spec.connections, self.spec.kv_netns)

    def track(self, job: J, transfer: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run a job's transfer on its own task (the engine does not wait for it) and make sure
        the job ends: whatever the transfer raises, even an exception nobody foresaw or a
        cancellation, the job is answered as failed with the reason, never left hanging (a
        hung `/prefill` would make the router blame a healthy instance after its timeout)."""

        async def guarded() -> None:
            try:
                await transfer
            except asyncio.CancelledError:
                self._fail(job, "kv transfer: cancelled")
                raise
            except Exception as exc:  # the reason goes to the router; the worker carries on
                log.warning("kv transfer of %s failed: %r", job_id(job), exc)
                self._fail(job, f"kv transfer: {exc!r}")
            finally:
                self._fail(job, "kv transfer: ended without a result")

        task = asyncio.get_running_loop().create_task(guarded())
        self.transfers.add(task)
        self._transfer_of[id(job)] = task

        def done(t: asyncio.Task[None]) -> None:
            self.transfers.discard(t)
            self._transfer_of.pop(id(job), None)

        task.add_done_callback(done)
        return task

    def cancel(self, job: J, reason: str) -> None:
        """Stop spending time on a job whose requester went away: a queued job is skipped when
        its turn comes, a running prefill is interrupted, a streaming transfer is aborted. A
        10M-token prompt abandoned by its client must not hold the FIFO for half a minute."""
        if job.result.done():
            return
        self.cancelled += 1
        job.result.set_result({**job.times, "error": reason})
        if self.running is job and self._running_task is not None:
            self._running_task.cancel()
        transfer = self._transfer_of.get(id(job))
        if transfer is not None:
            transfer.cancel()

    def _fail(self, job: J, reason: str, **extra: Any) -> None:
        """Answer a job as failed, unless it already has its answer."""
        if not job.result.done():
            self.failed += 1
            job.result.set_result({**job.times, **extra, "error": reason})

    def _complete(self, job: J, **extra: Any) -> None:
        """Answer a job as done (its KV sent and acknowledged), unless it already has its answer
        (the router cancelled it meanwhile)."""
        if not job.result.done():
            self.completed += 1
            job.result.set_result({**job.times, **extra})

    async def worker(self) -> None:
        """One prefill at a time, in arrival order; jobs cancelled while queued are skipped."""
        while True:
            job = await self.queue.get()
            try:
                if job.result.done():  # cancelled while it waited
                    continue
                self.running = job
                self._running_task = asyncio.get_running_loop().create_task(self.prefill(job))
                try:
                    await self._running_task
                except asyncio.CancelledError:
                    task = asyncio.current_task()
                    if task is not None and task.cancelling():
                        raise  # the worker itself is being stopped
                    # only this job was cancelled (see cancel): on to the next one
                except Exception as exc:  # a broken job must not stop the instance
                    self._fail(job, f"prefill failed: {exc!r}")
            finally:
                self.queued_tokens -= self.job_tokens(job)
                self.running = None
                self._running_task = None

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
            "cancelled": self.cancelled,
            "egress_bytes_per_s": sum(s.egress_rate_ewma for s in senders),
            "in_flight_bytes": sum(s.inflight_bytes for s in senders),
            "bytes_sent": sum(s.bytes_sent for s in senders),
            "stall_s": sum(s.stall_s for s in senders),
            "bytes_acked": sum(s.bytes_acked for s in senders),
            "queued_bytes": sum(s.queued_bytes for s in senders),
        }

    async def aclose(self, worker: asyncio.Task[None]) -> None:
        """Stop the worker and every transfer, close the senders."""
        if self._running_task is not None:
            self._running_task.cancel()
        worker.cancel()
        for t in list(self.transfers):
            t.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
        # together: each sender may spend up to its flush timeout (1 s) on frames for a receiver
        # that is stopping too, and one after the other that outlasted the runner's stop grace
        await asyncio.gather(*(s.aclose() for s in self.senders.values()))
