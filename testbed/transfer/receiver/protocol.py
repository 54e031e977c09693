"""One sender connection on the receiver, as an `asyncio.BufferedProtocol`.

Why a BufferedProtocol and not streams: the kernel copies bytes straight into one reusable buffer,
frames are parsed and checksummed in place through memoryviews, and payload bytes are never copied
again (unless the receiver keeps payload). Why the buffer grows the way it does: a hostile peer
must not make the receiver allocate what it merely announces (see `_grow` and buffers.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol, cast

from testbed.transfer.buffers import BufferBudget
from testbed.transfer.reassembly import Reassembler
from testbed.transfer.wire import (
    HEADER_SIZE,
    ChecksumMismatch,
    Header,
    WireError,
    decode_body,
    decode_header,
    encode_frame,
)

__all__ = ["Connection", "ConnectionOwner"]

log = logging.getLogger(__name__)

_MIN_FREE = 16 << 10  # never offer the kernel less than this much buffer space
_INITIAL_BUFFER = 64 << 10  # a connection's buffer before any bytes arrived
_STREAM_BUFFER = 1 << 20  # what a connection that keeps streaming grows to (fewer copies)
_ACK_BATCH = 128  # ACK pieces (two a frame) written together at most (see _parse)


class ConnectionOwner(Protocol):
    """What a connection needs from the receiver that accepted it (KVReceiver). A protocol, so
    the receiver imports its connections and not the other way round."""

    @property
    def budget(self) -> BufferBudget: ...

    @property
    def reassembler(self) -> Reassembler: ...

    @property
    def max_payload(self) -> int: ...

    def admit(self, conn: Connection) -> bool:
        """Take a new connection in (False: it was dropped)."""
        ...

    def dropped(self, conn: Connection, exc: Exception | None) -> None:
        """The connection is gone."""
        ...

    def protocol_error(self, conn: Connection, exc: WireError) -> None:
        """The peer sent bytes that are not a valid frame: drop it."""
        ...


class Connection(asyncio.BufferedProtocol):
    """One sender connection: parse frames in place, hand them to the reassembler, ACK.

    The read buffer starts small and grows only when the bytes that really arrived fill it
    (see `_grow`), within the receiver's BufferBudget; a header's promise alone allocates
    nothing, and an idle connection's buffer shrinks back.
    """

    def __init__(self, receiver: ConnectionOwner) -> None:
        self._rx = receiver
        self._buf = bytearray()
        self._view = memoryview(self._buf)
        self._start = 0  # first unparsed byte
        self._end = 0  # one past the last received byte
        self._header: Header | None = None  # parsed header of a frame whose rest is pending
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.last_activity = time.monotonic()
        self.frame_started: float | None = None
        self.write_paused_since: float | None = None
        self.peer: object = None
        self._paused_acks = False  # the sender does not read its ACKs
        self._paused_memory = False  # the buffer is full and the budget allows no more
        self._received = 0  # bytes received so far

    @property
    def buffer_size(self) -> int:
        return len(self._buf)

    # asyncio callbacks ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it: cast, not check.
        self.transport = cast(asyncio.Transport, transport)
        self.peer = transport.get_extra_info("peername")
        if self._rx.admit(self):
            self._set_buffer(bytearray(_INITIAL_BUFFER))
            self._rx.budget.force(_INITIAL_BUFFER)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        budget = self._rx.budget
        budget.forget(self)
        size = len(self._buf)
        self._set_buffer(bytearray())
        if size:
            budget.give(self, size, done=True)
        self._rx.dropped(self, exc)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._start == self._end:
            self._start = self._end = 0
        short = len(self._buf) - self._end < _MIN_FREE
        if short and not self._grow() and self._end == len(self._buf):
            # Reading pauses before the buffer fills (buffer_updated); never offer nothing.
            self._rx.budget.force(_MIN_FREE)
            self._resize(len(self._buf) + _MIN_FREE)
        return self._view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        self._end += nbytes
        self._received += nbytes
        self.last_activity = time.monotonic()
        try:
            self._parse()
        except WireError as exc:
            self._rx.protocol_error(self, exc)
            return
        except Exception:  # a bug must not take the receiver down; drop this connection loudly
            log.exception("unexpected error on KV connection from %s", self.peer)
            self.abort()
            return
        if self._start == self._end and self._header is None:
            self._start = self._end = 0
            budget = self._rx.budget
            if len(self._buf) > _INITIAL_BUFFER and (budget.pressed or budget.overdraft is self):
                self.shrink()
        short = len(self._buf) - self._end < _MIN_FREE
        if short and not self._grow() and self._end == len(self._buf):
            self._paused_memory = True
            self._rx.budget.wait(self)
            self._update_reading()

    def eof_received(self) -> bool | None:
        if self._start != self._end or self._header is not None:
            log.info("KV connection from %s closed inside a frame", self.peer)
        return None  # close the transport

    def pause_writing(self) -> None:
        # The sender is not reading ACKs: stop reading its frames until it catches up.
        self.write_paused_since = time.monotonic()
        self._paused_acks = True
        self._update_reading()

    def resume_writing(self) -> None:
        self.write_paused_since = None
        self._paused_acks = False
        self._update_reading()

    def _update_reading(self) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        if self._paused_acks or self._paused_memory:
            t.pause_reading()
        else:
            t.resume_reading()

    # buffer --------------------------------------------------------------------------------

    def _set_buffer(self, buf: bytearray) -> None:
        self._buf = buf
        self._view = memoryview(buf)

    def _resize(self, size: int) -> None:
        """Move the unparsed bytes into a new buffer of `size` bytes (never a resize in place:
        memoryviews of the old one may still be alive)."""
        held = self._end - self._start
        new = bytearray(size)
        new[:held] = self._view[self._start : self._end]
        self._set_buffer(new)
        self._start, self._end = 0, held

    def _grow(self) -> bool:
        """Make room for at least _MIN_FREE more bytes; False if the budget allows no more.

        Moving the unparsed bytes to the front is enough while they fill at most half the
        buffer, unless the connection keeps streaming (it sent more than twice the buffer) and
        the buffer is still under _STREAM_BUFFER: then it doubles, so frames are copied forward
        less often. Either way the buffer stays within a few times the bytes the peer really
        sent: a header's promise alone grows nothing."""
        held = self._end - self._start
        size = len(self._buf)
        room = size - held >= _MIN_FREE
        streaming = size < _STREAM_BUFFER and self._received > 2 * size
        if room and held <= size // 2 and not streaming:
            self._compact()
            return True
        if self._rx.budget.take(self, max(2 * size, held + _MIN_FREE) - size):
            self._resize(max(2 * size, held + _MIN_FREE))
            return True
        if room:  # no memory to grow into: make do with what is there
            self._compact()
            return True
        return False

    def _compact(self) -> None:
        if self._start:
            held = self._end - self._start
            self._view[:held] = bytes(self._view[self._start : self._end])
            self._start, self._end = 0, held

    def retry_grow(self) -> bool:
        """The budget has memory again: grow and read on (BufferBudget's Waiter)."""
        if self.closed.done():
            return True
        if not self._grow():
            return False
        self._paused_memory = False
        self._update_reading()
        return True

    def shrink(self) -> None:
        """Give an empty buffer's memory back (back to the initial size)."""
        if self._start != self._end or self._header is not None:
            return
        size = len(self._buf)
        if size <= _INITIAL_BUFFER:
            return
        self._set_buffer(bytearray(_INITIAL_BUFFER))
        self._start = self._end = 0
        self._rx.budget.give(self, size - _INITIAL_BUFFER, done=True)

    # parsing -------------------------------------------------------------------------------

    def _parse(self) -> None:
        """Handle every whole frame in the buffer; their ACKs leave in one write at the end.

        One write per read rather than one per frame: a socket write is the receiver's dearest
        per-frame cost (a system call, and on loopback the peer's TCP receive work with it),
        and the ACKs of one read are ready within the same callback, so none waits longer."""
        acks: list[bytes | bytearray | memoryview] = []
        try:
            self._parse_into(acks)
        finally:
            self._write_acks(acks)

    def _write_acks(self, acks: list[bytes | bytearray | memoryview]) -> None:
        t = self.transport
        if acks and t is not None and not t.is_closing():
            t.writelines(acks)
        acks.clear()

    def _parse_into(self, acks: list[bytes | bytearray | memoryview]) -> None:
        rx = self._rx
        view = self._view
        while True:
            header = self._header
            if header is None:
                if self._end - self._start < HEADER_SIZE:
                    break
                header = decode_header(
                    view[self._start : self._start + HEADER_SIZE], max_payload=rx.max_payload
                )
                self._start += HEADER_SIZE
                self._header = header
            need = header.rest_len
            if self._end - self._start < need:
                if self.frame_started is None:
                    self.frame_started = time.monotonic()
                break
            rest = view[self._start : self._start + need]
            self._start += need
            self._header = None
            self.frame_started = None
            try:
                ack = rx.reassembler.on_frame(decode_body(header, rest))
            except ChecksumMismatch as exc:
                ack = rx.reassembler.on_corrupt(exc)
            del rest
            if ack is not None:
                acks.extend(encode_frame(ack))
                if len(acks) >= _ACK_BATCH:  # a flood of tiny frames holds no more than this
                    self._write_acks(acks)

    def abort(self) -> None:
        """Drop the connection at once (RST): for broken or stalled peers."""
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        """Close gracefully (FIN) after flushing ACKs: for idle peers."""
        if self.transport is not None:
            self.transport.close()
