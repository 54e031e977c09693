"""The request count a run plans, checked against its cap before a request is drawn.

`prepare_run` (every substrate) and `testbed plan` call these once the arrival rate is known
(`arrivals.load` needs the planner's lambda_max); the ranges of single fields are pydantic's
(testbed.config.limits). A count past the cap, or under one request, is a FieldError naming the
field that makes it; the caller names the file.
"""

from __future__ import annotations

from collections.abc import Sequence

from testbed.config.limits import DEFAULT_MAX_REQUESTS, FieldError
from testbed.nemesis.actions.burst import BurstAction
from testbed.scenario.schema import Scenario
from testbed.workload.generate import RequestSpec

__all__ = ["check_request_count", "check_requests_made", "planned_requests"]


def _burst_extra(scenario: Scenario, base_rps: float, duration_s: float) -> float:
    """Expected requests the scenario's bursts add: (multiplier - 1) x the base rate over the
    part of each burst inside the run (testbed.nemesis.actions.burst draws them)."""
    n = 0.0
    for ev in scenario.nemesis:
        if isinstance(ev, BurstAction):
            inside = max(0.0, min(ev.at + ev.for_, duration_s) - ev.at)
            n += (ev.multiplier - 1.0) * base_rps * inside
    return n


def planned_requests(
    scenario: Scenario, rate_rps: float, shift_rate_rps: float | None, duration_s: float
) -> float:
    """Expected requests of a generated workload at `rate_rps` over `duration_s` (the shift's
    rate after `shift.at`), cut at `workload.max_requests` (drawn no further), plus bursts."""
    wl = scenario.workload
    shift = wl.shift
    if shift is not None and shift.at < duration_s and shift_rate_rps is not None:
        n = rate_rps * shift.at + shift_rate_rps * (duration_s - shift.at)
    else:
        n = rate_rps * duration_s
    if wl.max_requests is not None:
        n = min(n, wl.max_requests)
    return n + _burst_extra(scenario, rate_rps, duration_s)


def _rate_field(scenario: Scenario, rate_rps: float) -> tuple[str, str]:
    """The field that sets the rate, and the rate as the file gives it."""
    arrivals = scenario.workload.arrivals
    if arrivals.load is not None:
        lam = rate_rps / arrivals.load
        return "workload.arrivals.load", (
            f"{arrivals.load:g} x lambda_max {lam:.3g} = {rate_rps:.3g} requests/s"
        )
    return "workload.arrivals.rate", f"{rate_rps:.3g} requests/s"


def check_request_count(
    scenario: Scenario,
    rate_rps: float | None,
    shift_rate_rps: float | None,
    duration_s: float,
    max_requests: int | None = None,
) -> None:
    """Refuse a generated workload that plans more than the cap (`max_requests`, default
    DEFAULT_MAX_REQUESTS) or fewer than one request, and an on/off process with more windows
    than the cap, before anything is drawn. Trace timing (`rate_rps` None) is counted once the
    trace is read (`check_requests_made`)."""
    cap = DEFAULT_MAX_REQUESTS if max_requests is None else max_requests
    arrivals = scenario.workload.arrivals
    if arrivals.process == "onoff":
        windows = duration_s / (arrivals.on_duration + arrivals.off_duration)
        if not windows <= cap:
            raise FieldError(
                "workload.arrivals.on_duration",
                f"on {arrivals.on_duration:g} s + off {arrivals.off_duration:g} s over "
                f"{duration_s:g} s makes {windows:,.0f} on/off windows, above the cap of {cap:,}",
            )
    if rate_rps is None:
        return
    n = planned_requests(scenario, rate_rps, shift_rate_rps, duration_s)
    field, rate = _rate_field(scenario, rate_rps)
    if not n <= cap:  # inf and NaN too (a profile that plans an infinite lambda_max)
        bursts = " (bursts included)" if _burst_extra(scenario, 1.0, duration_s) else ""
        raise FieldError(
            field,
            f"{rate} over {duration_s:g} s plans {n:,.0f} requests{bursts}, above the cap of "
            f"{cap:,}: lower it, the duration or workload.max_requests "
            "(or raise the cap: --max-requests N)",
        )
    if n < 1:
        raise FieldError(
            "duration",
            f"{duration_s:g} s at {rate} plans {n:.2g} requests, fewer than one: lengthen it "
            f"or raise {field}",
        )


def check_requests_made(
    scenario: Scenario,
    requests: Sequence[RequestSpec],
    rate_rps: float | None,
    duration_s: float,
    max_requests: int | None = None,
) -> None:
    """After the workload is drawn, before bursts are: none at all is an error naming the
    duration; a replayed trace (its count known only now) and its bursts are held to the cap."""
    if not requests:
        raise FieldError(
            "duration",
            f"the workload produced no requests in {duration_s:g} s; lengthen it or raise the "
            "rate (or, for a trace, check its timestamps)",
        )
    if rate_rps is not None:
        return
    cap = DEFAULT_MAX_REQUESTS if max_requests is None else max_requests
    n = len(requests) + _burst_extra(scenario, len(requests) / duration_s, duration_s)
    if not n <= cap:
        raise FieldError(
            "workload.trace",
            f"the trace plans {n:,.0f} requests in {duration_s:g} s (bursts included), above "
            f"the cap of {cap:,}: shorten the duration or set workload.max_requests "
            "(or raise the cap: --max-requests N)",
        )
