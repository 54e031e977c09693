"""A token bucket written as a virtual clock, precise at 1 Mbit/s and at 1 Gbit/s alike.

Sleeping `len(chunk) / rate` per chunk accumulates timer rounding (event-loop timers fire ~1 ms
late) and so under-delivers at high rates. Instead the pacer keeps `free_at`, the instant the link
finishes sending everything reserved so far. Reserving n bytes moves it forward by exactly
n / rate and returns the new value: the moment those bytes have left the link. A caller sleeps
until then; if it wakes late the next reservation does not start later, so the long-run rate is
exact and timer jitter only shifts individual pieces. Idle time earns at most `burst` seconds of
link time as credit (the bucket depth). A little credit is needed, because a sender that wakes
1 ms late must be allowed to catch up; much more would let a quiet link burst above its rate.

Several connections may share one Pacer: reservations are served in call order, which is
round-robin when each connection holds at most one outstanding piece.
"""

from __future__ import annotations

__all__ = ["Pacer", "piece_size"]

# A piece is at most this much link time, so a slow link delivers smoothly rather than in bursts
# of whole socket reads (a 256 KB read at 1 Mbit/s would otherwise arrive 2 s late in one lump).
PIECE_SECONDS = 0.004
MIN_PIECE = 256
# Credit a link may bank while idle, in seconds of link time (covers event-loop wake-up lateness).
BURST_SECONDS = 0.010


def piece_size(rate: float, *, seconds: float = PIECE_SECONDS, floor: int = MIN_PIECE) -> int:
    """Largest piece worth sending in one go at `rate` bytes/s."""
    return max(floor, int(rate * seconds))


class Pacer:
    """Virtual-clock token bucket: `rate` in bytes/s, `burst` bucket depth in seconds."""

    __slots__ = ("_free_at", "burst", "rate")

    def __init__(self, rate: float, now: float, *, burst: float = BURST_SECONDS) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate}")
        self.rate = float(rate)
        self.burst = float(burst)
        self._free_at = now

    def reserve(self, n: int, now: float) -> float:
        """Reserve n bytes; return when they have been sent (may be in the past: send now)."""
        floor = now - self.burst
        if self._free_at < floor:
            self._free_at = floor
        self._free_at += n / self.rate
        return self._free_at

    def set_rate(self, rate: float, now: float) -> None:
        """Change the rate; the backlog not yet sent is re-timed at the new rate."""
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate}")
        if self._free_at > now:
            backlog = (self._free_at - now) * self.rate
            self._free_at = now + backlog / rate
        self.rate = float(rate)

    def backlog_seconds(self, now: float) -> float:
        """How long the link stays busy with what is already reserved."""
        return max(0.0, self._free_at - now)
