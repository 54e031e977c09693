"""The prediction both forms share; plain Python, no testbed import.

`choose` reads instances, the link and the cost curves through attributes only, so it takes
the testbed's own snapshot objects (the plugin) as well as the service's decoded JSON rows.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Choice", "KnotCosts", "choose", "interp"]

DEFAULT_BANDWIDTH_BPS = 100e9 / 8
"""Real-world bytes/s assumed while the link's estimate is cold (None)."""
DEFAULT_PREFILL_S_PER_TOKEN = 1e-4
"""Used only when the snapshot carries no cost curves (an older testbed)."""


def interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear through the knots (at least two, xs increasing), extended linearly past
    the ends: the testbed's own curves do the same, so both forms predict alike."""
    i = min(max(bisect.bisect_right(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return float(y0 + (y1 - y0) * (x - x0) / (x1 - x0))


@dataclass(frozen=True)
class KnotCosts:
    """Cost curves from their knots (what the protocol sends): T_prefill per cluster, S_kv
    with its floor (the fixed state bytes)."""

    prefill_knots: dict[str, tuple[Sequence[float], Sequence[float]]]
    kv_knots: tuple[Sequence[float], Sequence[float]]
    kv_state_bytes: float = 0.0

    def prefill_s(self, cluster: str, tokens: float) -> float:
        if tokens <= 0:
            return 0.0
        xs, ys = self.prefill_knots[cluster]
        return max(0.0, interp(xs, ys, tokens))

    def kv_bytes(self, tokens: float) -> float:
        if tokens <= 0:
            return 0.0
        return max(interp(*self.kv_knots, tokens), self.kv_state_bytes)


@dataclass(frozen=True)
class Choice:
    prefill: Any
    decode: Any
    uncached_tokens: int
    predicted_ttft_s: float


def _ok(i: Any, role: str) -> bool:
    return bool(i.role == role and getattr(i, "state", "ok") == "ok")


def _prefill_s(costs: Any, cluster: str, tokens: float) -> float:
    if costs is None:
        return tokens * DEFAULT_PREFILL_S_PER_TOKEN
    try:
        return float(costs.prefill_s(cluster, tokens))
    except (KeyError, LookupError):
        return tokens * DEFAULT_PREFILL_S_PER_TOKEN


def choose(request: Any, instances: Iterable[Any], link: Any, costs: Any) -> Choice | None:
    """The prefill instance with the least predicted TTFT and the least-loaded decode; None
    when no instance of a role is usable ("no route yet")."""
    decodes = [i for i in instances if _ok(i, "decode") and i.cluster == "local"]
    if not decodes:
        return None
    decode = min(decodes, key=lambda i: (i.outstanding_work, i.outstanding, i.id))
    best: Choice | None = None
    for inst in instances:
        if not _ok(inst, "prefill"):
            continue
        cached = request.cached_local if inst.cluster == "local" else request.cached_prfaas
        uncached = max(request.input_tokens - cached, 0)
        wait = float(getattr(inst, "queue_wait_s", 0.0) or 0.0)
        if wait <= 0 and inst.outstanding_work > 0:  # no estimate sent: price the queued tokens
            wait = _prefill_s(costs, inst.cluster, inst.outstanding_work)
        ttft = wait + _prefill_s(costs, inst.cluster, uncached)
        if inst.cluster != decode.cluster:  # the KV crosses the link
            kv = float(getattr(request, "kv_bytes", 0.0) or 0.0)
            if kv <= 0 and costs is not None:
                kv = float(costs.kv_bytes(request.input_tokens))
            bw = getattr(link, "bandwidth_bps", None) or DEFAULT_BANDWIDTH_BPS
            ahead = float(getattr(link, "in_flight_bytes", 0.0) or 0.0)
            rtt = float(getattr(link, "rtt_s", 0.0) or 0.0)
            ttft += (ahead + kv) / bw + rtt
        if best is None or (ttft, inst.id) < (best.predicted_ttft_s, best.prefill.id):
            best = Choice(inst, decode, uncached, ttft)
    return best
