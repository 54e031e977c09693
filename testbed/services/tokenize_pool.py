"""A small, bounded pool of worker processes for CPU-bound prompt work (tokenizing, hashing).

Why processes: the tokenizer holds the GIL for the whole of one call (~1 CPU second per MiB of
text), so in a thread it stalls the event loop anyway: one ~1 MiB prompt put a 1.8 s gap in
another client's stream (issue 33). In a worker process it stalls nothing of the server's.

Bounded three ways. `workers` jobs run at once (one per worker); at most `queue` more wait in
this process (a job beyond that raises `PoolBusy`: the fronts answer 503); and a job is handed to
the executor only when a worker is free, so a waiting job is only an asyncio future here and a
client that leaves while it waits takes it out of the queue at once. A job already running when
its client leaves runs to its end (the executor cannot stop one worker) and its result is
dropped; the prompt's size bounds that work (the body limit, and the caller's token cap).

Memory comes back: the workers are stopped once the pool has been idle `idle_s` seconds and
started again on the next job. They are forked from a fork server (multiprocessing's
"forkserver" context: a clean process, safe to start from a threaded server) that has imported
this module's work and the server's main module already, so a restart costs milliseconds, not an
interpreter start; each worker dies with the fork server (testbed.lifeline) and with the server
(`_arm_worker`), and the fork server exits once its workers have.

One pool per process (`shared_pool`), like the tokenizer it runs: the accounting is thread-safe
and each waiter is woken on its own event loop, so the apps of one process (tests) share it.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from testbed.lifeline import PARENT_PID_ENV, die_with_parent

__all__ = [
    "POOL_IDLE_S",
    "POOL_QUEUE",
    "POOL_WORKERS",
    "PoolBusy",
    "TokenizePool",
    "shared_pool",
]

T = TypeVar("T")

POOL_WORKERS = max(1, (os.cpu_count() or 2) - 1)
"""Worker processes: one core is left to the servers. On 2 cores, with six ~1 MiB prompts at
once, one worker kept another client's stream within 81-90 ms of a 62 ms token interval; two
(both cores) let it slip to 105-125 ms though they are niced."""
POOL_QUEUE = 16
"""Jobs that may wait for a worker; each holds its prompt (at most the 1 MiB body) meanwhile."""
POOL_IDLE_S = 5.0
"""Seconds without a job after which the workers are stopped (their memory returned)."""
POOL_NICE = 10
"""Niceness added to a worker: on a busy host the server (streaming, answering) runs first."""

_PRELOAD = "testbed.services.tokenizer"


class PoolBusy(Exception):
    """Every worker is busy and the queue is full (or a worker died): try again later."""


SERVER_CHECK_S = 0.5
"""Seconds between a worker's checks that the server it works for is still there."""


def _arm_worker(server: int) -> None:
    """A worker dies with the fork server that forked it, and with the server (pid `server`),
    and yields the CPU to the server's own processes.

    The fork server exits only once every copy of its "alive" pipe is closed, and each worker
    holds one (multiprocessing hands it to every child), while a worker waits for jobs on a
    queue whose write end it holds too: a server that dies without shutting the pool down
    (SIGKILL, or `os._exit`: testbed.services.host) would leave both waiting forever. So each
    worker watches the server and leaves when it is gone; the fork server follows."""
    os.environ[PARENT_PID_ENV] = str(os.getppid())
    die_with_parent()
    os.nice(POOL_NICE)
    threading.Thread(target=_watch_server, args=(server,), daemon=True).start()


def _watch_server(server: int) -> None:
    while True:
        time.sleep(SERVER_CHECK_S)
        try:
            os.kill(server, 0)
        except ProcessLookupError:
            os._exit(0)
        except PermissionError:  # the pid now belongs to someone else's process
            os._exit(0)


def _context() -> multiprocessing.context.BaseContext:
    ctx = multiprocessing.get_context("forkserver")
    main = getattr(sys.modules["__main__"].__spec__, "name", None)
    preload = [_PRELOAD]
    if main and not main.endswith("__main__"):  # a worker imports the main module again
        preload.append(main)
    ctx.set_forkserver_preload(preload)
    return ctx


class TokenizePool:
    """`await pool.run(fn, *args)`: `fn(*args)` in a worker process (fn and args picklable)."""

    def __init__(
        self, workers: int = POOL_WORKERS, queue: int = POOL_QUEUE, idle_s: float = POOL_IDLE_S
    ) -> None:
        self.workers = workers
        self.queue = queue
        self.idle_s = idle_s
        self.running = 0
        """Jobs in a worker (or being handed to one)."""
        self.jobs = 0
        """Jobs started so far."""
        self.dropped = 0
        """Jobs whose client left: taken out of the queue, or their result dropped."""
        self.retired = 0
        """Times the workers were stopped for being idle."""
        self._lock = threading.Lock()
        self._waiting: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()
        self._executor: ProcessPoolExecutor | None = None
        self._idle: threading.Timer | None = None

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def started(self) -> bool:
        """Whether worker processes are up (or starting)."""
        return self._executor is not None

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` in a worker: PoolBusy at once if `queue` jobs already wait."""
        await self._acquire()
        # starting a worker may wait on the fork server: in a thread, never on the event loop
        submit = asyncio.ensure_future(asyncio.to_thread(self._submit, fn, *args))
        try:
            job: Future[T] = await asyncio.shield(submit)
        except asyncio.CancelledError:
            submit.add_done_callback(self._abandon)
            self.dropped += 1
            raise
        except BaseException:
            self._release()
            raise
        job.add_done_callback(lambda _job: self._release())
        try:
            return await asyncio.wrap_future(job)
        except asyncio.CancelledError:
            self.dropped += 1  # a pending job is cancelled; a running one's result is dropped
            raise
        except BrokenProcessPool:  # a worker was killed (OOM?): the next job gets new ones
            self._discard()
            raise PoolBusy("a tokenizer worker died; try again") from None

    def _abandon(self, submit: asyncio.Future[Future[Any]]) -> None:
        """The client left while its job was being handed over: cancel it once it is."""
        if submit.cancelled() or submit.exception() is not None:
            self._release()
            return
        job = submit.result()
        job.cancel()
        job.add_done_callback(lambda _job: self._release())

    async def _acquire(self) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self.running < self.workers and not self._waiting:
                self._take()
                return
            if len(self._waiting) >= self.queue:
                raise PoolBusy(
                    f"the tokenizer is busy ({self.running} prompts tokenizing, "
                    f"{len(self._waiting)} waiting); try again"
                )
            fut: asyncio.Future[None] = loop.create_future()
            self._waiting.append((loop, fut))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # granted a worker, then cancelled
                self._release()
            else:
                with self._lock:
                    if (loop, fut) in self._waiting:
                        self._waiting.remove((loop, fut))
            self.dropped += 1
            raise

    def _take(self) -> None:
        """Count a job in (lock held)."""
        self.running += 1
        self.jobs += 1
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _release(self) -> None:
        """A job left its worker (any thread): wake the next waiter, or start the idle clock."""
        with self._lock:
            self.running -= 1
            while self._waiting:
                loop, fut = self._waiting.popleft()
                if fut.done() or loop.is_closed():
                    continue
                self._take()
                try:
                    loop.call_soon_threadsafe(self._grant, fut)
                except RuntimeError:  # its loop closed meanwhile
                    self.running -= 1
                    continue
                return
            if self.running == 0 and self._executor is not None and self._idle is None:
                self._idle = threading.Timer(self.idle_s, self._retire)
                self._idle.daemon = True
                self._idle.start()

    def _grant(self, fut: asyncio.Future[None]) -> None:
        if fut.done():  # cancelled between the wake-up and now: pass the worker on
            self._release()
        else:
            fut.set_result(None)

    def _submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        with self._lock:
            if self._executor is None:
                self._executor = ProcessPoolExecutor(
                    self.workers,
                    mp_context=_context(),
                    initializer=_arm_worker,
                    initargs=(os.getpid(),),
                )
            executor = self._executor
        return executor.submit(fn, *args)

    def _retire(self) -> None:
        """Idle for `idle_s`: stop the workers (timer thread)."""
        with self._lock:
            if self.running or self._waiting or self._executor is None:
                return
            executor, self._executor, self._idle = self._executor, None, None
            self.retired += 1
        executor.shutdown(wait=False)

    def _discard(self) -> None:
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        """Stop the workers now (a job still waiting gets PoolBusy or its worker's result)."""
        with self._lock:
            if self._idle is not None:
                self._idle.cancel()
                self._idle = None
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)


_POOL: TokenizePool | None = None
_POOL_LOCK = threading.Lock()


def shared_pool() -> TokenizePool:
    """This process's pool (created on first use; its workers start with the first job)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = TokenizePool()
        return _POOL
