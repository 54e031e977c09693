"""The transport under the HTTP policy (testbed.policy.http): lanes, deadlines, a size cap.

One rule bounds every exchange with a policy service, on both clients (aiohttp: the live
router's decisions; the blocking `BlockingClient`: the sim's decisions and the /feedback
worker's posts, live and on the sim), and it lives here only:

- a *lane* is one exchange at a time with its own `router` id and delta base (`DeltaEncoder`),
  so the wire stays `prfaas-policy/1` (a service keeps one base per router id) while a policy
  runs `lanes` exchanges at once; a decision that finds no free lane before its deadline is
  `queued` (never sent);
- the deadline is total, per exchange, on a monotonic clock (a decision's is the policy's
  `timeout`, a feedback post's `feedback_deadline_s`): an answer counts only when its last byte
  was read before it, so an answer the router's busy event loop reads late (its timer could
  not fire) is `late`, and so is a service that trickles bytes (the blocking client re-arms the
  socket's timeout to what is left before every read, instead of once per read);
- every body read, a decision's answer or a feedback post's, is at most MAX_ANSWER_BYTES
  (`BodyCap`: `garbage: too large`, Content-Length first, then at most cap + 1 bytes read, so an
  endless body costs bounded memory and time); bodies are asked for and read as sent
  (`Accept-Encoding: identity`, never decompressed), so the cap counts the bytes on the wire
  and both clients see the same body;
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
    "FEEDBACK_DEADLINE_MIN_S",
    "MAX_ANSWER_BYTES",
    "MAX_LANES",
    "REQUEST_HEADERS",
    "Answered",
    "BlockingClient",
    "BodyCap",
    "Lane",
    "Lanes",
    "apost",
    "feedback_deadline_s",
    "late",
    "new_session",
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
FEEDBACK_DEADLINE_MIN_S = 1.0
"""A /feedback post's total deadline is 10 x the decision's `timeout`, at least this: off the
decision path, so generous, but bounded (a service answering feedback a byte every 15 ms once
took a router from 78 to 667 MiB in 58 s)."""
REQUEST_HEADERS = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
"""Sent on every exchange by both clients: no compressed answers, so the cap counts what is on
the wire and an answer means the same to the sim and the live router."""

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


def feedback_deadline_s(timeout_s: float) -> float:
    """A feedback post's total deadline for a policy whose decisions have `timeout_s`."""
    return max(FEEDBACK_DEADLINE_MIN_S, timeout_s * 10)


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


class BodyCap:
    """The size cap, for both clients' readers: a declared length over MAX_ANSWER_BYTES is
    refused before a byte of the body is read, and a body is read no further than cap + 1."""

    def __init__(self, declared: int | str | None) -> None:
        if isinstance(declared, str):
            declared = int(declared) if declared.strip().isdigit() else None
        if declared is not None and declared > MAX_ANSWER_BYTES:
            raise too_large(declared)
        self._buf = bytearray()

    @property
    def want(self) -> int:
        """How much the next read may ask for."""
        return MAX_ANSWER_BYTES + 1 - len(self._buf)

    def add(self, chunk: bytes) -> None:
        self._buf += chunk
        if len(self._buf) > MAX_ANSWER_BYTES:
            raise too_large()

    def body(self) -> bytes:
        return bytes(self._buf)


async def read_capped(resp: Any) -> bytes:
    """An aiohttp response's body, at most MAX_ANSWER_BYTES (else `garbage: too large`)."""
    cap = BodyCap(resp.content_length)
    while chunk := await resp.content.read(cap.want):
        cap.add(chunk)
    return cap.body()


def new_session() -> Any:
    """The live client's aiohttp session: keep-alive, no connection limit of its own (the lanes
    bound it), bodies never decompressed (REQUEST_HEADERS)."""
    import aiohttp

    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60), auto_decompress=False
    )


async def apost(
    session: Any, url: str, body: bytes, deadline: float, clock: Clock
) -> tuple[int, bytes, float]:
    """The live client's exchange, under the same rule as `BlockingClient.post`: (status,
    body, the clock when it was sent); TimeoutError past `deadline`, ProtocolError over the
    cap, OSError / aiohttp.ClientError when the service cannot be reached."""
    sent = clock()
    if sent >= deadline:
        raise TimeoutError("deadline passed")
    async with asyncio.timeout(deadline - sent):
        async with session.post(
            url, data=body, headers=REQUEST_HEADERS, allow_redirects=False
        ) as resp:
            return resp.status, await read_capped(resp), sent


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
            self._conn.request("POST", path, body, {**REQUEST_HEADERS, "Connection": "keep-alive"})
            resp = self._conn.getresponse()  # a 3xx is an answer like any other: never followed
            cap = BodyCap(resp.getheader("Content-Length"))
            while chunk := resp.read(cap.want):
                cap.add(chunk)
            if resp.will_close or not resp.isclosed():
                self.close()
            else:
                sock.deadline = math.inf
            return resp.status, cap.body(), sent
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
