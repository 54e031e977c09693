"""The transport under the HTTP policy (testbed.policy.http): lanes, deadlines, a size cap.

What makes a decision's outcome honest, on both clients:

- a *lane* is one exchange at a time with its own `router` id and delta base (`DeltaEncoder`),
  so the wire stays `prfaas-policy/1` (a service keeps one base per router id) while a policy
  runs `lanes` exchanges at once; a decision that finds no free lane before its deadline is
  `queued` (never sent);
- the deadline is total, per decision, on a monotonic clock: an answer counts only when its last
  byte was read before it, so an answer the router's busy event loop reads late (its timer could
  not fire) is `late`, and so is a service that trickles bytes (the blocking client re-arms the
  socket's timeout to what is left before every read, instead of once per read);
- an answer is at most MAX_ANSWER_BYTES (`garbage: too large`: Content-Length first, then at
  most cap + 1 bytes read, so an endless body costs bounded memory and time);
- redirects are never followed (a 3xx is `status: HTTP 3xx`): the policy URL is the contract.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import math
import secrets
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any, cast

from testbed.policy.protocol import DeltaEncoder, ProtocolError

__all__ = [
    "DEFAULT_LANES",
    "MAX_ANSWER_BYTES",
    "MAX_LANES",
    "Answered",
    "BlockingClient",
    "Lane",
    "Lanes",
    "late",
    "read_capped",
    "too_large",
]

MAX_ANSWER_BYTES = 1 << 20
"""The largest answer (decision or feedback) read: 1 MiB. A route is a few hundred bytes; past
this a body is `garbage: too large`, and reading stops (a 10 MB answer once took a 5 s run to
67 s wall)."""
DEFAULT_LANES = 8
"""Exchanges one policy client runs at once (`#lanes=N`): a burst's arrivals come 0.4 ms apart,
a service answers in a few ms, so one lane queues decisions behind each other."""
MAX_LANES = 64

Clock = Callable[[], float]


class Answered(ProtocolError):
    """An answer read in time that is no route (a status, garbage): the fallback decides, and
    the decision still reports how long the service took (`answer_s`)."""

    def __init__(self, reason: str, answer_s: float) -> None:
        super().__init__(reason)
        self.answer_s = answer_s


def late(timeout_s: float, after_s: float | None = None) -> TimeoutError:
    """No whole answer by the deadline; `after_s`: one was read, that long after it."""
    if after_s is None:
        return TimeoutError(f"late: no answer within {timeout_s * 1e3:g}ms")
    return TimeoutError(
        f"late: answer read {after_s * 1e3:.3g}ms after the {timeout_s * 1e3:g}ms deadline"
    )


def too_large(n: int | None = None) -> ProtocolError:
    size = f"{n:,} bytes" if n is not None else "more"
    return ProtocolError(f"garbage: too large ({size}; the cap is {MAX_ANSWER_BYTES:,} bytes)")


class Lane:
    """One exchange at a time: a router id and the delta base the service holds for it."""

    __slots__ = ("encoder", "router")

    def __init__(self) -> None:
        self.router = f"r-{secrets.token_hex(4)}"
        self.encoder = DeltaEncoder()


class Lanes:
    """A policy client's lanes. A decision takes the most recently freed one (so a client that
    asks one decision at a time always uses lane 0, on one base), and gives it back after."""

    def __init__(self, n: int) -> None:
        self.all = tuple(Lane() for _ in range(n))
        self._free: asyncio.LifoQueue[Lane] | None = None  # made on the first live decision

    async def take(self, deadline: float, clock: Clock) -> Lane | None:
        """A free lane, or None if none frees up before `deadline` (the decision is queued)."""
        if self._free is None:
            self._free = asyncio.LifoQueue()
            for lane in reversed(self.all):
                self._free.put_nowait(lane)
        try:
            lane = self._free.get_nowait()
        except asyncio.QueueEmpty:
            left = deadline - clock()
            if left <= 0:
                return None
            try:
                async with asyncio.timeout(left):
                    lane = await self._free.get()
            except TimeoutError:
                return None
        if clock() >= deadline:  # the loop woke this waiter late: too late to send
            self.give(lane)
            return None
        return lane

    def give(self, lane: Lane) -> None:
        assert self._free is not None
        self._free.put_nowait(lane)


async def read_capped(resp: Any) -> bytes:
    """An aiohttp response's body, at most MAX_ANSWER_BYTES (else `garbage: too large`)."""
    n = resp.content_length
    if n is not None and n > MAX_ANSWER_BYTES:
        raise too_large(n)
    buf = bytearray()
    while len(buf) <= MAX_ANSWER_BYTES:
        chunk = await resp.content.read(MAX_ANSWER_BYTES + 1 - len(buf))
        if not chunk:
            return bytes(buf)
        buf += chunk
    raise too_large()


# ------------------------------------------------------------------------ the blocking client


class _Deadline:
    """A socket whose every read and write may take only what is left before `deadline`: a
    service trickling one byte every 15 ms cannot stretch a per-read timeout into minutes."""

    deadline: float = math.inf

    def _arm(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")
        self.settimeout(min(left, 3600.0))  # type: ignore[attr-defined]

    def recv_into(self, *args: Any, **kw: Any) -> int:
        self._arm()
        return super().recv_into(*args, **kw)  # type: ignore[misc]

    def sendall(self, *args: Any, **kw: Any) -> None:
        self._arm()
        super().sendall(*args, **kw)  # type: ignore[misc]


class _DeadlineSocket(_Deadline, socket.socket):
    pass


class _DeadlineSSLSocket(_Deadline, ssl.SSLSocket):
    pass


def _connect(address: tuple[str, int], timeout: float, *args: Any) -> socket.socket:
    raw = socket.create_connection(address, timeout, *args)
    sock = _DeadlineSocket(raw.family, raw.type, raw.proto, fileno=raw.detach())
    sock.settimeout(timeout)
    return sock


class BlockingClient:
    """One keep-alive http.client connection to a policy service, every exchange bounded by a
    total deadline and the size cap (the sim's decisions, and the /feedback worker's posts)."""

    def __init__(self, host: str, port: int, https: bool) -> None:
        self.host, self.port, self.https = host, port, https
        self._conn: http.client.HTTPConnection | None = None

    def _open(self, timeout: float) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection
        if self.https:
            ctx = ssl.create_default_context()
            ctx.sslsocket_class = _DeadlineSSLSocket
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=ctx)
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        conn._create_connection = _connect  # type: ignore[attr-defined]
        conn.connect()
        with contextlib.suppress(OSError):
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def post(
        self, path: str, body: bytes, deadline: float, clock: Clock = time.monotonic
    ) -> tuple[int, bytes, float]:
        """(status, body, the clock when the request was sent). TimeoutError past `deadline`
        (the connection is dropped: the exchange is abandoned), ProtocolError for an answer
        over the cap, OSError / HTTPException when the service cannot be reached."""
        try:
            if self._conn is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("deadline passed")
                self._conn = self._open(left)
            sock = cast(_Deadline, self._conn.sock)  # made by _connect (or its SSL wrapper)
            sock.deadline = deadline
            sent = clock()
            self._conn.request("POST", path, body, {"Content-Type": "application/json",
                                                    "Connection": "keep-alive"})  # fmt: skip
            resp = self._conn.getresponse()
            length = resp.getheader("Content-Length")
            if length is not None and length.isdigit() and int(length) > MAX_ANSWER_BYTES:
                raise too_large(int(length))
            data = resp.read(MAX_ANSWER_BYTES + 1)
            if len(data) > MAX_ANSWER_BYTES:
                raise too_large()
            if resp.will_close or not resp.isclosed():
                self.close()
            else:
                sock.deadline = math.inf
            return resp.status, data, sent
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
