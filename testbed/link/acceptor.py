"""Accepting a proxy's connections without breaking when the process runs out of descriptors.

A proxy cannot use the event loop's own server for this. Out of file descriptors (EMFILE), the
default asyncio loop logs a traceback for every failed accept and schedules a retry for each
(hundreds of log lines a second, then errors about a closed socket once the proxy stops);
uvloop accepts and drops the waiting clients. `Acceptor` accepts itself: on EMFILE and the like
it logs one line, leaves the clients in the kernel's backlog, backs off (10 ms doubling to 1 s)
and goes on, so connections already open keep carrying data and the waiting ones are taken as
soon as descriptors free up. `descriptor_room` is the check a new listening socket passes first,
so the emulator's own proxies cannot use up what their connections need.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import resource
import socket
from collections.abc import Callable

__all__ = ["RESOURCE_ERRNOS", "Acceptor", "descriptor_room"]

_log = logging.getLogger(__name__)

RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
"""accept()/socket() failures that are the process's or the host's shortage, not the caller's."""
BACKOFF_MIN = 0.01
BACKOFF_MAX = 1.0
RESERVE_FRACTION = 4
"""A new listening socket needs 1/4 of the descriptor limit still free: the rest of the budget
is the connections' (two descriptors each), not more proxies'."""


def descriptor_room() -> str | None:
    """Why no new listening socket should be made now (too few descriptors left), or None.

    Counts this process's open descriptors (/proc/self/fd; no check where it cannot)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        used = len(os.listdir("/proc/self/fd")) - 1  # less the one listdir itself holds
    except OSError:
        return None
    if soft == resource.RLIM_INFINITY or soft - used >= soft // RESERVE_FRACTION:
        return None
    return (
        f"out of file descriptors ({used} open of a limit of {soft}; the last "
        f"{soft // RESERVE_FRACTION} are kept for connections)"
    )


class Acceptor:
    """Accepts on a bound, listening, non-blocking socket until `stop()`."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        factory: Callable[[], asyncio.Protocol],
        name: str,
    ) -> None:
        self.loop = loop
        self.sock = sock
        self.factory = factory
        self.name = name
        self.starved = 0
        """accept() calls that failed for want of descriptors or memory, so far."""
        self._task = loop.create_task(self._run())

    async def _run(self) -> None:
        backoff = BACKOFF_MIN
        short = False  # in a shortage now (logged once, and once when it ends)
        while True:
            try:
                conn, _ = await self.loop.sock_accept(self.sock)
            except OSError as exc:
                if self.sock.fileno() < 0:
                    return  # closed under us
                if exc.errno == errno.ECONNABORTED:
                    continue  # the client gave up while waiting
                self.starved += 1
                if not short:
                    short = True
                    what = "out of descriptors" if exc.errno in RESOURCE_ERRNOS else "failing"
                    _log.warning(
                        "proxy %s: accept %s (%s); new connections wait", self.name, what, exc
                    )
                await asyncio.sleep(backoff)
                backoff = min(BACKOFF_MAX, backoff * 2)
                continue
            if short:
                short = False
                _log.info("proxy %s: accepting again (%d failed tries)", self.name, self.starved)
            backoff = BACKOFF_MIN
            try:
                await self.loop.connect_accepted_socket(self.factory, conn)
            except OSError as exc:
                _log.info("proxy %s: dropped a connection: %s", self.name, exc)
                conn.close()

    async def stop(self) -> None:
        """Stop accepting and close the listening socket (open connections are not touched)."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        self.sock.close()
