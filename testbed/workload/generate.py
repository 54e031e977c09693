"""Turn a workload configuration into the concrete list of requests a run submits.

The list is computed up front, before anything runs, so a run's offered load is a pure function
of (workload, rate, duration, seed) and two runs that differ only in policy see the same requests.

Where the requests come from:

- **Trace timing** (`arrivals.process: trace`, with `workload.trace`, the `trace_path` argument or
  a `lengths: {kind: trace}` file): replay the trace. Arrival = timestamp / 1000 in real-world
  seconds; input, output lengths and hash ids are kept; requests at or after `duration_s` are cut.
  If `rate_rps` is also given the trace's clock is compressed or stretched by one factor,
  natural_rate / rate_rps with natural_rate = (n - 1) / (last - first timestamp), so the mean
  gap becomes 1 / rate_rps while the shape of the traffic (bursts, lulls, turn order) is kept.
- **Trace content with synthetic timing** (a trace is given but `arrivals.process` is poisson,
  uniform, gamma or onoff): arrivals come from the process at `rate_rps`, and the trace's
  requests fill them in trace order (lengths and hash ids kept). This replays a trace's prefix
  structure under a controlled load. When the trace runs out, no more requests are generated.
- **Synthetic** (no trace): arrivals from the process at `rate_rps`; input lengths sampled from
  the length distribution and rounded to whole tokens (at least 1); output = `output_tokens`.

Arrivals and lengths draw from independent streams spawned from one SeedSequence, so changing the
rate or the arrival process does not change the sequence of lengths, and vice versa; comparisons
across loads then differ only in what they are meant to.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from testbed.config import TraceLengths, WorkloadConfig
from testbed.errors import ConfigError
from testbed.workload.arrivals import arrival_times
from testbed.workload.build import length_distribution
from testbed.workload.trace import Trace, read_trace

__all__ = ["RequestSpec", "generate_requests", "request_id"]


@dataclass(frozen=True)
class RequestSpec:
    """One request to submit: arrival in real-world seconds since the start of the run."""

    id: str
    arrival: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()


def request_id(index: int) -> str:
    """The id of the index-th request (0-based): "r000001", "r000002", ..."""
    return f"r{index + 1:06d}"


def _trace_path(workload: WorkloadConfig, trace_path: str | None) -> str | None:
    if trace_path is not None:
        return trace_path
    if workload.trace is not None:
        return workload.trace
    if workload.arrivals.process == "trace" and isinstance(workload.lengths, TraceLengths):
        return workload.lengths.path
    return None


def _replay(trace: Trace, rate_rps: float | None, duration_s: float) -> list[RequestSpec]:
    factor = 1.0
    if rate_rps is not None:
        natural = trace.mean_rate_rps
        if natural is None:
            raise ConfigError(
                f"{trace.path}: every request has the same timestamp, so the trace cannot be "
                f"rescaled to {rate_rps:g} requests/s"
            )
        factor = natural / rate_rps
    out: list[RequestSpec] = []
    for req in trace.requests:
        arrival = req.timestamp_s * factor
        if arrival >= duration_s:
            break  # timestamps never decrease (read_trace checks), so nothing later fits either
        out.append(
            RequestSpec(
                request_id(len(out)), arrival, req.input_length, req.output_length, req.hash_ids
            )
        )
    return out


def generate_requests(
    workload: WorkloadConfig,
    *,
    rate_rps: float | None,
    duration_s: float,
    seed: int,
    trace_path: str | None = None,
    shift_rate_rps: float | None = None,
) -> list[RequestSpec]:
    """The requests of one run, sorted by arrival, capped at `workload.max_requests`.

    `rate_rps` is the resolved mean arrival rate (the caller turns `arrivals.load` into a rate
    with the planner); it is required unless the trace's own timestamps drive arrivals. With
    `workload.shift`, requests from `shift.at` on draw their lengths from `shift.lengths` and
    arrive at `shift_rate_rps` (resolved the same way), from their own seeded streams, so the
    part before the shift is the same as without it.
    """
    if duration_s < 0:
        raise ValueError(f"duration_s must not be negative, got {duration_s!r}")
    arrivals_ss, lengths_ss = np.random.SeedSequence(seed).spawn(2)
    process = workload.arrivals.process
    path = _trace_path(workload, trace_path)
    trace = read_trace(Path(path)) if path is not None else None

    cap = workload.max_requests  # drawn no further than needed: the limits count on it
    if process == "trace":
        if trace is None:
            raise ConfigError(
                "arrivals.process is 'trace' but no trace was given (set workload.trace)"
            )
        specs = _replay(trace, rate_rps, duration_s)
    else:
        if rate_rps is None:
            raise ConfigError(f"arrivals.process {process!r} needs an arrival rate")
        times = arrival_times(
            workload.arrivals,
            rate=rate_rps,
            duration=duration_s,
            rng=np.random.default_rng(arrivals_ss),
            limit=cap,
        )
        if trace is not None:
            specs = [
                RequestSpec(request_id(i), float(t), r.input_length, r.output_length, r.hash_ids)
                for i, (t, r) in enumerate(zip(times, trace.requests, strict=False))
            ]
        else:
            shift = workload.shift
            if shift is not None and shift.at < duration_s:
                times = times[times < shift.at]
            lengths = length_distribution(workload.lengths).sample(
                np.random.default_rng(lengths_ss), len(times)
            )
            if shift is not None and shift.at < duration_s:
                if shift_rate_rps is None:
                    raise ConfigError("workload.shift needs its arrival rate resolved")
                shift_arrivals_ss, shift_lengths_ss = np.random.SeedSequence(seed).spawn(4)[2:]
                later = shift.at + arrival_times(
                    workload.arrivals,
                    rate=shift_rate_rps,
                    duration=duration_s - shift.at,
                    rng=np.random.default_rng(shift_arrivals_ss),
                    limit=None if cap is None else max(cap - len(times), 0),
                )
                later_lengths = length_distribution(shift.lengths).sample(
                    np.random.default_rng(shift_lengths_ss), len(later)
                )
                times = np.concatenate([times, later])
                lengths = np.concatenate([lengths, later_lengths])
            n_out = max(1, round(workload.output_tokens))
            specs = [
                RequestSpec(request_id(i), float(t), max(1, round(float(n))), n_out)
                for i, (t, n) in enumerate(zip(times, lengths, strict=True))
            ]

    if workload.max_requests is not None:
        specs = specs[: workload.max_requests]
    return specs
