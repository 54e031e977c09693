"""What the prefill and decode services need from an engine (services.prefill, .decode).

The services own the HTTP API, its validation, the queue, the KV transfer and the bookkeeping;
an adapter owns what differs between engines: the fields of a prefill request, the layers a
prefill produces and their bytes, and how a decode batch runs. Two kinds exist: `emulated`
(cost-model timing, scaled bytes: services.engines.emulated) and `torch` (the tiny real model:
services.engines.torch, which imports torch only when an instance is built).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from testbed.transfer.payload import PayloadSource

__all__ = ["DecodeAdapter", "Decoding", "LayerSink", "PrefillAdapter"]

W = TypeVar("W")
D = TypeVar("D", bound="Decoding")

LayerSink = Callable[[int, Any], None]
"""Called with (layer index, the layer's item) as each layer's KV is final; the adapter's
`payload` turns the item into the bytes that go on the wire."""


class PrefillAdapter(Protocol[W]):
    """A prefill engine; `W` is what it needs to know of one request."""

    @property
    def kind(self) -> str | None:
        """Reported as `engine_kind` in /stats when set."""
        ...

    @property
    def max_body(self) -> int:
        """Largest `POST /prefill` body (token ids make the torch engine's large)."""
        ...

    @property
    def prefix_payload(self) -> PayloadSource | None:
        """The bytes of cached prefixes for `POST /prefix/send`; None: this engine sends none."""
        ...

    def parse(self, body: dict[str, Any]) -> W:
        """The engine's fields of `POST /prefill`, checked (a 400 for a bad one)."""
        ...

    def tokens(self, work: W) -> int:
        """Tokens a queued or running request counts for (`queued_tokens`)."""
        ...

    def layer_sizes(self, work: W) -> list[int]:
        """Wire bytes per layer of the request's KV, known before it starts."""
        ...

    async def run(
        self, rid: str, work: W, sizes: Sequence[int], on_layer: LayerSink
    ) -> dict[str, Any]:
        """Prefill one request, handing over each layer as it completes; returns the
        engine's fields of the answer (the torch engine's first token)."""
        ...

    def payload(self, rid: str, layer: int, item: Any) -> Any:
        """The wire bytes of one layer's item (a buffer that stays unchanged)."""
        ...

    def stats(self) -> dict[str, Any]:
        """The `engine` section of /stats."""
        ...

    def close(self) -> None: ...


class Decoding(Protocol):
    """One request an engine decodes (both engines' slots have this shape)."""

    @property
    def done(self) -> asyncio.Event: ...

    @property
    def first_token_at(self) -> float | None: ...

    @property
    def last_token_at(self) -> float | None: ...


class DecodeAdapter(Protocol[D]):
    """A decode engine; `D` is its handle on one admitted request."""

    @property
    def kind(self) -> str | None: ...

    @property
    def keep_payload(self) -> bool:
        """The engine decodes from the received bytes (the KV receiver keeps them)."""
        ...

    @property
    def relays_first_token(self) -> bool:
        """The first output token comes from prefill through the router
        (`POST /decode/{id}/first_token`), and decoding waits for it."""
        ...

    @property
    def serves_prefix(self) -> bool:
        """Accepts cached-prefix pulls (`POST /prefix/receive`)."""
        ...

    @property
    def max_output_tokens(self) -> int: ...

    @property
    def vocab_size(self) -> int:
        """First-token ids must be below this."""
        ...

    def active(self) -> int: ...

    def waiting(self) -> int: ...

    async def run(self) -> None:
        """The batch loop (a task for the service's lifetime)."""
        ...

    async def admit(
        self,
        rid: str,
        output_tokens: int,
        layers: list[bytearray] | None,
        first_token: int | None,
        emit: Callable[[int], None],
    ) -> D | str:
        """A handle for a request whose KV arrived verified (not yet decoding), or the reason
        it cannot be decoded; `emit` is called with the number of new tokens as they come."""
        ...

    def submit(self, handle: D) -> None: ...

    def cancel(self, handle: D) -> None: ...

    def error(self, handle: D) -> str | None:
        """Why a finished request failed, if it did."""
        ...

    def result(self, handle: D) -> dict[str, Any]:
        """The engine's fields of the final line (the torch engine's token ids)."""
        ...

    def counters(self) -> dict[str, Any]:
        """The engine's own counters in /stats."""
        ...

    def stats(self) -> dict[str, Any]:
        """The `engine` section of /stats."""
        ...

    def close(self) -> None: ...
