"""The reassembler: every request of one receiver, and the rules that apply each frame to one.

The rules themselves (what is complete, failed, refused, a duplicate) are in the package
docstring; this is the one place that enforces them.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable

from testbed.transfer.checksum import ChecksumAlgo
from testbed.transfer.errors import TransferError
from testbed.transfer.reassembly.inbound import Inbound, KVManifest, Layer, State, refusal
from testbed.transfer.wire import (
    MAX_LAYERS,
    AbortFrame,
    AckFrame,
    ChecksumMismatch,
    DataFrame,
    EndFrame,
    Frame,
    FrameType,
    MalformedFrame,
)

__all__ = ["Reassembler", "ReceiverFull"]

log = logging.getLogger(__name__)


class ReceiverFull(Exception):
    """`expect` refused: the receiver already tracks its maximum number of requests."""


class Reassembler:
    """All requests of one receiver. Every method is synchronous except `wait`.

    Args:
        keep_payload: keep each layer's bytes for `take_payload`.
        retired_capacity: finished-and-discarded requests remembered for late duplicates.
        max_requests: requests tracked at once (expected, not yet discarded); `expect` raises
            ReceiverFull beyond it.
        default_ttl: deadline of an expected request when `expect` gives none (None: no
            deadline).
    """

    def __init__(
        self,
        *,
        keep_payload: bool = False,
        retired_capacity: int = 4096,
        max_requests: int = 16_384,
        default_ttl: float | None = None,
        on_complete: Callable[[KVManifest], None] | None = None,
        on_failure: Callable[[str, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.keep_payload = keep_payload
        self._retired_capacity = retired_capacity
        self._max_requests = max_requests
        self._default_ttl = default_ttl
        self._on_complete = on_complete
        self._on_failure = on_failure
        self._clock = clock
        self._requests: dict[str, Inbound] = {}
        self._retired: OrderedDict[str, Inbound] = OrderedDict()
        self.bytes_received = 0
        self.bytes_duplicate = 0
        self.frames = 0
        self.frames_refused = 0
        self.checksum_failures = 0
        self.completed = 0
        self.failed = 0
        self.expired = 0
        self.payload_bytes = 0
        """Payload bytes kept for all requests together (keep_payload)."""

    # ---------------------------------------------------------------------------- queries

    @property
    def active(self) -> int:
        return sum(1 for r in self._requests.values() if r.state is State.ACTIVE)

    @property
    def tracked(self) -> int:
        """Requests expected and not yet discarded (of any state)."""
        return len(self._requests)

    @property
    def retired(self) -> int:
        return len(self._retired)

    def status(self, request_id: str) -> str | None:
        """'active', 'complete', 'failed', or None if unknown."""
        req = self._lookup(request_id)
        return None if req is None else req.state.value

    # ---------------------------------------------------------------------------- owner API

    def expect(
        self,
        request_id: str,
        *,
        total_bytes: int | None = None,
        ttl: float | None = None,
        label: str | None = None,
    ) -> None:
        """Announce a request: from now on its frames are accepted.

        `total_bytes` (if known) bounds what its frames may announce; `ttl` seconds (default:
        the reassembler's default_ttl) after which `expire` fails and frees it if it was not
        discarded; `label` names it in logs (the client-visible id, the wire id being a
        capability). Raises ValueError for an id already known, ReceiverFull when full.
        """
        if not 1 <= len(request_id.encode("utf-8")) <= 64:
            raise ValueError("request id must be 1..64 UTF-8 bytes")
        if self._lookup(request_id) is not None:
            raise ValueError(f"request {request_id!r} is already known to this receiver")
        if len(self._requests) >= self._max_requests:
            raise ReceiverFull(f"receiver already tracks {self._max_requests} requests")
        ttl = self._default_ttl if ttl is None else ttl
        deadline = math.inf if ttl is None else self._clock() + ttl
        self._requests[request_id] = Inbound(request_id, label or "", total_bytes, deadline)

    async def wait(self, request_id: str, timeout: float | None) -> KVManifest:
        """Wait for completion; TransferError on failure, TimeoutError after `timeout` s.

        KeyError if the request was never expected (or was forgotten long ago)."""
        req = self._lookup(request_id)
        if req is None:
            raise KeyError(f"request {request_id!r} was not expected")
        async with asyncio.timeout(timeout):
            await req.done.wait()
        if req.manifest is not None:
            return req.manifest
        raise TransferError(request_id, req.reason)

    def discard(self, request_id: str) -> None:
        """Free a request's state and payload. Late duplicates still get its final status."""
        req = self._requests.pop(request_id, None)
        if req is None:
            return
        if req.state is State.ACTIVE:
            self._fail(req, "discarded by the receiver's owner before completion")
        self._free(req)
        self._retired[request_id] = req
        while len(self._retired) > self._retired_capacity:
            self._retired.popitem(last=False)

    def expire(self, now: float | None = None) -> int:
        """Fail and free every request past its deadline; returns how many."""
        now = self._clock() if now is None else now
        late = [r for r in self._requests.values() if r.deadline <= now]
        for req in late:
            if req.state is State.ACTIVE:
                self._fail(req, "expected KV did not arrive before the receiver's deadline")
            self.discard(req.request_id)
        self.expired += len(late)
        return len(late)

    def take_payload(self, request_id: str) -> list[bytearray]:
        """Hand over a complete request's bytes, one bytearray per layer (needs keep_payload).

        Ownership moves to the caller: a second call raises KeyError.
        """
        if not self.keep_payload:
            raise RuntimeError("receiver was created with keep_payload=False")
        req = self._requests.get(request_id)
        if req is None or req.state is not State.COMPLETE or req.sizes is None:
            raise KeyError(f"no complete request {request_id!r} with payload")
        if req.payload_taken:
            raise KeyError(f"payload of {request_id!r} was already taken")
        req.payload_taken = True
        out: list[bytearray] = []
        for i, size in enumerate(req.sizes):
            layer = req.layers.get(i)
            buf = layer.buf if layer is not None else bytearray()  # an empty layer has no frames
            if buf is None or len(buf) != size:  # pragma: no cover - complete: every byte is in
                raise KeyError(f"payload of {request_id!r} layer {i} is incomplete")
            out.append(buf)
        self._free(req)
        return out

    # ---------------------------------------------------------------------------- frames

    def on_frame(self, frame: Frame) -> AckFrame | None:
        """Apply one verified frame; returns the ACK to send back (None for ABORT)."""
        self.frames += 1
        if isinstance(frame, DataFrame):
            return self._on_data(frame)
        if isinstance(frame, EndFrame):
            return self._on_end(frame)
        if isinstance(frame, AbortFrame):
            req = self._lookup(frame.request_id)
            if req is None:
                self.frames_refused += 1
            elif req.state is State.ACTIVE:
                self._fail(req, f"aborted by sender: {frame.reason}")
            return None
        # An ACK has no business arriving at a receiver: the peer is confused.
        raise MalformedFrame(f"unexpected {type(frame).__name__} from a sender")

    def on_corrupt(self, exc: ChecksumMismatch) -> AckFrame | None:
        """A frame whose checksum failed: fail its request and tell the sender why."""
        self.frames += 1
        self.checksum_failures += 1
        if exc.request_id is None:
            return None
        h = exc.header
        if h.type not in (FrameType.DATA, FrameType.END):
            length = 0
        else:
            length = h.body_len if h.type is FrameType.DATA else h.total
        req = self._lookup(exc.request_id)
        if req is None:
            self.frames_refused += 1
            if h.type not in (FrameType.DATA, FrameType.END):
                return None
            return refusal(exc.request_id, h.type, h.layer, h.offset, length, h.stamp_ns)
        if req.state is State.ACTIVE:
            self._fail(req, str(exc))
        if h.type not in (FrameType.DATA, FrameType.END):
            return None
        return req.ack(h.type, h.layer, h.offset, length, h.stamp_ns)

    def _lookup(self, request_id: str) -> Inbound | None:
        return self._requests.get(request_id) or self._retired.get(request_id)

    def _touch(self, req: Inbound) -> None:
        now = self._clock()
        if req.frames == 0:
            req.first_at = now
        req.last_at = now
        req.frames += 1

    def _on_data(self, f: DataFrame) -> AckFrame:
        n = len(f.payload)
        ack = (FrameType.DATA, f.layer, f.offset, n, f.stamp_ns)
        req = self._lookup(f.request_id)
        if req is None:
            self.frames_refused += 1
            return refusal(f.request_id, *ack)
        if req.state is not State.ACTIVE:
            self.bytes_duplicate += n
            req.dup_bytes += n
            return req.ack(*ack)
        self._touch(req)
        if f.checksum == ChecksumAlgo.NONE:
            req.verified = False
        if req.sizes is not None and (
            f.layer >= len(req.sizes) or req.sizes[f.layer] != f.layer_total
        ):
            self._fail(
                req,
                f"inconsistent frame: layer {f.layer} of size {f.layer_total} does not match "
                f"the END layout of {len(req.sizes)} layers",
            )
            return req.ack(*ack)
        layer = req.layers.get(f.layer)
        if layer is None:
            if req.limit is not None and req.announced + f.layer_total > req.limit:
                self._fail(
                    req,
                    f"inconsistent frame: layer {f.layer} of size {f.layer_total} takes the "
                    f"request past the {req.limit} bytes expected",
                )
                return req.ack(*ack)
            if len(req.layers) >= MAX_LAYERS:
                self._fail(req, f"inconsistent frame: more than {MAX_LAYERS} layers")
                return req.ack(*ack)
            layer = req.layers[f.layer] = Layer(f.layer_total, self.keep_payload)
            req.announced += f.layer_total
        elif layer.total != f.layer_total:
            self._fail(
                req,
                f"inconsistent frame: layer {f.layer} size {f.layer_total}, "
                f"earlier frames said {layer.total}",
            )
            return req.ack(*ack)
        new = layer.ranges.add(f.offset, f.offset + n)
        if new:
            grown = layer.store(f.offset, f.payload)
            req.held += grown
            self.payload_bytes += grown
        req.unique_bytes += new
        req.dup_bytes += n - new
        self.bytes_received += new
        self.bytes_duplicate += n - new
        self._check_complete(req)
        return req.ack(*ack)

    def _on_end(self, f: EndFrame) -> AckFrame:
        ack = (FrameType.END, len(f.layer_sizes), 0, f.total_bytes, f.stamp_ns)
        req = self._lookup(f.request_id)
        if req is None:
            self.frames_refused += 1
            return refusal(f.request_id, *ack)
        if req.state is not State.ACTIVE:
            return req.ack(*ack)
        if f.checksum == ChecksumAlgo.NONE:
            req.verified = False
        if req.sizes is not None:
            if req.sizes != f.layer_sizes:
                self._fail(req, "inconsistent END: layer layout differs from an earlier END")
            return req.ack(*ack)  # a resent END: nothing new
        if req.limit is not None and f.total_bytes != req.limit:
            self._fail(
                req, f"inconsistent END: {f.total_bytes} bytes, {req.limit} bytes were expected"
            )
            return req.ack(*ack)
        for index, layer in req.layers.items():
            if index >= len(f.layer_sizes) or f.layer_sizes[index] != layer.total:
                self._fail(
                    req,
                    f"inconsistent END: {len(f.layer_sizes)} layers, but frames of layer "
                    f"{index} said its size is {layer.total}",
                )
                return req.ack(*ack)
        req.sizes = f.layer_sizes
        req.expected = f.total_bytes
        if req.frames == 0:
            req.first_at = req.last_at = self._clock()
        self._check_complete(req)
        return req.ack(*ack)

    def _check_complete(self, req: Inbound) -> None:
        if req.sizes is None or req.unique_bytes != req.expected:
            return
        req.state = State.COMPLETE
        manifest = req.manifest = KVManifest(
            request_id=req.request_id,
            layer_sizes=req.sizes,
            total_bytes=req.expected,
            verified=req.verified,
            first_frame_at=req.first_at,
            last_frame_at=req.last_at,
            frames=req.frames,
            duplicate_bytes=req.dup_bytes,
        )
        self.completed += 1
        req.done.set()
        if self._on_complete is not None:
            try:
                self._on_complete(manifest)
            except Exception:
                log.exception("on_complete callback failed for %s", req.name)

    def _free(self, req: Inbound) -> None:
        """Drop a request's layers (and the payload they hold)."""
        req.layers.clear()
        self.payload_bytes -= req.held
        req.held = 0

    def _fail(self, req: Inbound, reason: str) -> None:
        req.state = State.FAILED
        req.reason = reason
        self._free(req)  # free payload buffers now: the request can never complete
        self.failed += 1
        req.done.set()
        log.info("KV request %s failed: %s", req.name, reason)
        if self._on_failure is not None:
            try:
                self._on_failure(req.request_id, reason)
            except Exception:
                log.exception("on_failure callback failed for %s", req.name)
