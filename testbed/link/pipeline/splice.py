"""A direction with no toxics moving bulk bytes in the kernel: os.splice through a pipe, on a
thread, so payload bytes are never copied into the process and back out.

Why: unshaped, the emulator's CPU per byte was the kernel's two copies (socket -> process ->
socket) plus the event loop's own copy of each read into a new bytes object; splice moves
page references from one socket to a pipe and on to the other socket instead. Why only for bulk:
a small message costs two splice calls and a poll where the event loop spends one read and one
write, so a direction hands off only once a single read fills `SPLICE_MIN` bytes (see
ToxicLink.feed), and round trips of small messages stay on the loop.

How toxics still apply: adding one (ToxicLink.add_toxic) wakes the thread through its wake pipe;
it writes out what it already holds in its pipe (at most `PIPE_SIZE` bytes, read before the
toxic existed, like bytes already in a transport's write buffer), closes and hands the direction
back to the event loop, which resumes reading the source socket into the new stage. The source
transport stays paused the whole time the thread owns its reads, and the sink transport's write
buffer was empty when the thread started, so bytes are neither reordered nor lost.

The thread works on duplicates of the two socket descriptors, so a transport closing them
cannot hand their numbers to another socket under it; the sockets close for good when the
thread lets its duplicates go, which it does at once when stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import select
import socket
import threading
from collections.abc import Callable

__all__ = ["PIPE_SIZE", "SPLICE_MIN", "Splicer", "available"]

SPLICE_MIN = 64 * 1024
"""A read at least this large hands a no-toxic direction to a Splicer (bulk, not ping-pong)."""
PIPE_SIZE = 1024 * 1024
"""The pipe's capacity: what one splice call moves at most, and what may bypass a new toxic
(as much as the transports' own write buffer high-water mark, proxy.WRITE_HIGH)."""
POLL_MS = 1000
"""A waiting thread re-checks its stop flag at least this often (wakes are immediate anyway)."""
REPORT_BYTES = 4 * 1024 * 1024
"""Byte counters reach the event loop (LinkStats, /metrics) after about this many bytes."""
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_F_GETPIPE_SZ = getattr(fcntl, "F_GETPIPE_SZ", 1032)
_FLAGS = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_NONBLOCK", 2)


def available() -> bool:
    """Whether this platform has os.splice (Linux, Python 3.10+)."""
    return hasattr(os, "splice")


class Splicer:
    """Moves a direction's bytes from `src` to `dst` on a thread until stopped, EOF or error.

    `ended(reason, moved_in, moved_out)` is called on the event loop once the thread is done,
    with reason "stopped", "eof" or "error"; `counted(received, sent)` is called on the loop
    every REPORT_BYTES or so with the bytes moved since the last call.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        src: socket.socket,
        dst: socket.socket,
        counted: Callable[[int, int], None],
        ended: Callable[[str], None],
    ) -> None:
        self._loop = loop
        self._counted = counted
        self._ended = ended
        self._src = os.dup(src.fileno())
        self._dst = os.dup(dst.fileno())
        self._pipe_r, self._pipe_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            self._cap = fcntl.fcntl(self._pipe_w, _F_SETPIPE_SZ, PIPE_SIZE)
        except OSError:  # above /proc/sys/fs/pipe-max-size: keep the default
            self._cap = fcntl.fcntl(self._pipe_w, _F_GETPIPE_SZ)
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._stop = False
        self._abort = False
        self._thread = threading.Thread(target=self._run, name="link-splice", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, *, abort: bool = False) -> None:
        """Ask the thread to hand back (after writing out its pipe, unless `abort`)."""
        self._stop = True
        self._abort = self._abort or abort
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    # -- the thread --------------------------------------------------------------------------
    def _run(self) -> None:
        reason = "error"  # a socket error (reset, broken pipe) closes the connection
        try:
            reason = self._pump()
        except OSError:
            pass
        finally:
            for fd in (self._src, self._dst, self._pipe_r, self._pipe_w, self._wake_r):
                with contextlib.suppress(OSError):
                    os.close(fd)
            with contextlib.suppress(RuntimeError):  # the loop may be closed already
                self._loop.call_soon_threadsafe(self._finish, reason)

    def _pump(self) -> str:
        held = 0  # bytes in the pipe
        cap = self._cap
        eof = False
        pending_in = pending_out = 0
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        src_events = dst_events = 0
        while True:
            if self._abort:
                return "stopped"
            if (self._stop or eof) and held == 0:
                self._report(pending_in, pending_out)
                return "eof" if eof else "stopped"
            moved = False
            if not self._stop and not eof and held < cap:
                try:
                    n = os.splice(self._src, self._pipe_w, cap - held, flags=_FLAGS)
                except BlockingIOError:
                    n = -1
                if n == 0:
                    eof = True
                elif n > 0:
                    held += n
                    pending_in += n
                    moved = True
            if held:
                try:
                    n = os.splice(self._pipe_r, self._dst, held, flags=_FLAGS)
                except BlockingIOError:
                    n = 0
                held -= n
                pending_out += n
                moved = moved or n > 0
            if pending_out >= REPORT_BYTES:
                self._report(pending_in, pending_out)
                pending_in = pending_out = 0
            if moved:
                continue
            # Nothing moved: wait for the source to have bytes, the sink room, or a wake.
            want_src = select.POLLIN if not (self._stop or eof) and held < cap else 0
            want_dst = select.POLLOUT if held else 0
            if want_src != src_events:
                _set(poller, self._src, want_src)
                src_events = want_src
            if want_dst != dst_events:
                _set(poller, self._dst, want_dst)
                dst_events = want_dst
            for fd, ev in poller.poll(POLL_MS):
                if fd == self._wake_r:
                    with contextlib.suppress(OSError):
                        os.read(self._wake_r, 64)
                elif ev & (select.POLLERR | select.POLLNVAL) or (
                    fd == self._dst and ev & select.POLLHUP
                ):
                    self._report(pending_in, pending_out)
                    return "error"

    def _report(self, received: int, sent: int) -> None:
        if received or sent:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._counted, received, sent)

    def _finish(self, reason: str) -> None:
        with contextlib.suppress(OSError):
            os.close(self._wake_w)
        self._ended(reason)


def _set(poller: select.poll, fd: int, events: int) -> None:
    if events:
        poller.register(fd, events)  # register twice = modify
    else:
        with contextlib.suppress(KeyError):
            poller.unregister(fd)
