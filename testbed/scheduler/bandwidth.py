"""Estimating the bandwidth a cross-datacenter link really offers, from the sender side.

A sender cannot see the link's configuration, only its own traffic: bytes the receiver has
acknowledged and bytes sent but not yet acknowledged (in flight). When the link is the
bottleneck a standing queue forms in front of it, so in-flight bytes represent more than
`queue_delay_s` of delivery at the acknowledged rate, and that acknowledged rate *is* the
link's capacity. When there is no standing queue the link offers at least what was delivered,
and the estimate drifts back up towards the nominal bandwidth (probing), so a recovered link
is noticed without having to saturate it first. A link that delivers nothing while bytes are in
flight (a partition) drives the estimate towards zero, which makes the planner keep prefills
local.

Why queueing delay and not blocked writes: the link emulator (like a router) buffers, so a
sender's writes rarely block; and not raw RTT either, which also grows with receiver load.
The thresholds are config values, justified in docs/scheduler.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.frozen import quick_init

__all__ = ["LinkEstimator", "LinkSample"]


@quick_init
@dataclass(frozen=True)
class LinkSample:
    """Counters of the PrfaaS senders at one time (real-world units)."""

    t: float
    """Real-world seconds."""
    bytes_acked: float
    """Real-world bytes the receivers have acknowledged so far (cumulative)."""
    inflight_bytes: float
    """Real-world bytes sent and not yet acknowledged, now."""


@dataclass
class LinkEstimator:
    nominal: float
    """Configured link bandwidth (real bytes/s): the ceiling the estimate recovers to."""
    queue_delay_s: float = 0.5
    """Standing queue (in flight / delivered rate, real seconds) that marks a bottleneck."""
    recover_per_s: float = 0.1
    """How fast the estimate climbs back without one: x (1 + recover_per_s) per real second."""
    smoothing: float = 0.8
    """EWMA weight of a new bottleneck measurement."""

    def __post_init__(self) -> None:
        self.estimate = self.nominal
        self.delivered: float | None = None
        """Real bytes/s acknowledged between the last two samples."""
        self.bottleneck = False
        self._last: LinkSample | None = None

    def update(self, s: LinkSample) -> float:
        """Feed one sample; returns the current estimate (real bytes/s)."""
        last, self._last = self._last, s
        if last is None or s.t <= last.t:
            return self.estimate
        dt = s.t - last.t
        rate = max(s.bytes_acked - last.bytes_acked, 0.0) / dt
        self.delivered = rate
        if s.inflight_bytes <= 0:
            delay = 0.0
        else:
            delay = s.inflight_bytes / rate if rate > 0 else float("inf")
        self.bottleneck = delay >= self.queue_delay_s
        if self.bottleneck:
            self.estimate += self.smoothing * (rate - self.estimate)
        else:
            # Multiplicative probing (as TCP's slow start): a few quiet seconds during a long
            # drop move the estimate little, a link that stays quiet is believed in again
            # within ~30 s from 5% of nominal; a link that delivers more is believed at once.
            self.estimate = max(self.estimate, rate)
            self.estimate *= (1.0 + self.recover_per_s) ** dt
        self.estimate = min(max(self.estimate, 1.0), self.nominal)
        return self.estimate
