"""Link verbs: what a fault may ask of the cross-datacenter link (`LinkControl`), and which of
them a substrate's link can play (`LinkVerbs`).

A fault speaks verbs, never an emulator's API: the live link (testbed.link.deployment.LinkSetup)
turns each verb into the link emulator's toxics (and, with `shaper: tc`, the kernel's packet
drop), the sim (testbed.sim.nemesis.SimLinkControl) into its link model's state. A verb one of
them cannot play is refused before the run (testbed.nemesis.link.refuse_unplayable), so a fault
is played or refused, never recorded as a failed start that leaves its checkers VACUOUS.

| verb         | method                                   | what the link does                   |
|--------------|------------------------------------------|--------------------------------------|
| `bandwidth`  | `set_bandwidth(bytes_per_s)`             | the shared cap, real-world bytes/s   |
| `partition`  | `partition()`, `heal()`                  | connections reset, new ones refused  |
| `delay`      | `add_delay(key, rtt_s=, jitter_s=)`      | RTT/2 more each way, +-jitter        |
| `timeout`    | `add_timeout(key, timeout_s=)`           | data black-holed; closed after quiet |
| `reset`      | `add_reset(key, after_s=, probability=)` | RST `after_s` after data starts      |
| `slow_close` | `add_slow_close(key, delay_s=, ...)`     | a close is held `delay_s`            |
| `slice`      | `add_slicer(key, average_bytes=, ...)`   | data cut in small pieces, spaced     |
| `data_limit` | `add_data_limit(key, limit_bytes=)`      | a connection closed after N bytes    |

Every `add_*` is undone by `remove(key)` (everything added under that key; idempotent), so a
fault adds under its own key at the start and removes it at the end. Durations are real-world
seconds (the link converts them to its own clock); `slice` and `data_limit` sizes are bytes of
the link's sockets as they are (wire bytes, not scaled by `byte_scale`: those verbs act on the
byte stream itself, not on the modelled KV volume).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, get_args

__all__ = ["LINK_VERBS", "LinkControl", "LinkVerbs", "Verb"]

Verb = Literal[
    "bandwidth", "partition", "delay", "timeout", "reset", "slow_close", "slice", "data_limit"
]
LINK_VERBS: frozenset[str] = frozenset(get_args(Verb))
"""Every verb a fault may declare (`Fault.verbs`)."""


@dataclass(frozen=True)
class LinkVerbs:
    """The verbs one kind of link plays: a fact of its substrate, read before the run."""

    substrate: str
    """As the refusal names it: "the {substrate} cannot play link verb ..." (e.g. "sim")."""
    supported: frozenset[str]
    doc: str
    """Where the substrate says what it plays and why not the rest (e.g. "docs/sim.md")."""

    def __post_init__(self) -> None:
        unknown = sorted(self.supported - LINK_VERBS)
        if unknown:
            raise ValueError(f"unknown link verbs {unknown}; known: {sorted(LINK_VERBS)}")


class LinkControl(Protocol):
    """The run's cross-datacenter link as faults see it (the live LinkSetup, the sim's
    SimLinkControl): the verbs of the module's table."""

    @property
    def verbs(self) -> LinkVerbs:
        """What this link can play."""
        ...

    @property
    def configured_bytes_per_s(self) -> float:
        """The shared cap in force, real-world bytes/s."""
        ...

    @property
    def proxies(self) -> Sequence[str]:
        """Every cross-datacenter connection path of the run (one per decode instance, plus an
        external router's control path): what a verb acts on."""
        ...

    async def set_bandwidth(self, real_bytes_per_s: float, /) -> None: ...

    async def partition(self) -> None:
        """Cut every path: open connections reset, new ones refused (with the kernel shaper,
        every packet on the link dropped too)."""
        ...

    async def heal(self) -> None:
        """Undo `partition`; idempotent."""
        ...

    async def add_delay(self, key: str, /, *, rtt_s: float, jitter_s: float) -> None:
        """`rtt_s` more round trip (half each way) and +-`jitter_s` on each crossing."""
        ...

    async def add_timeout(self, key: str, /, *, timeout_s: float) -> None:
        """Black-hole the data both ways (the kernel shaper drops every packet too); a
        connection is closed after `timeout_s` of quiet (never, if 0)."""
        ...

    async def add_reset(self, key: str, /, *, after_s: float, probability: float) -> None:
        """A connection, picked with `probability`, is reset `after_s` after its data starts."""
        ...

    async def add_slow_close(self, key: str, /, *, delay_s: float, probability: float) -> None:
        """A connection's close, picked with `probability`, is held `delay_s`."""
        ...

    async def add_slicer(
        self, key: str, /, *, average_bytes: int, variation_bytes: int, delay_s: float
    ) -> None:
        """Data towards the receiver cut in pieces of `average_bytes` +- `variation_bytes`,
        `delay_s` apart."""
        ...

    async def add_data_limit(self, key: str, /, *, limit_bytes: int) -> None:
        """A connection is closed once `limit_bytes` have gone towards the receiver."""
        ...

    async def remove(self, key: str, /) -> None:
        """Undo every `add_*` made under `key`; nothing if there is none."""
        ...
