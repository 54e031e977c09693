"""The sizes a scenario may ask for, each in one place (docs/failures.md lists them).

A typo in a scenario (`rate: 1.0e6` for 1.0, `max: 1e12`, `time_scale: 1.0e-9`) must not take
the host down before the first service starts: every size that grows memory or time is bounded
here, and checked when the scenario is read (a field's range: pydantic names the file and the
field) or when it is planned (the request count, which needs the planner's lambda_max for
`load`; the planner's threshold grid, which needs a trace's lengths), before anything is
allocated. Past a limit is one line naming the file and the field, exit 2.
"""

from __future__ import annotations

from typing import Any

from pydantic import AfterValidator

from testbed.errors import ConfigError

__all__ = [
    "BYTE_SCALE",
    "DECODE_TOKENS_PER_S",
    "DEFAULT_MAX_REQUESTS",
    "MAX_ARRIVAL_RATE",
    "MAX_LOAD",
    "MAX_THRESHOLDS",
    "MAX_TOKENS",
    "TIME_SCALE",
    "FieldError",
    "within",
]

MAX_TOKENS = 10_000_000
"""Largest token count a file may give (a prompt length, an output length, a threshold, a
planner step): the largest context windows models have; the router and the trace reader refuse
longer requests too."""
DEFAULT_MAX_REQUESTS = 1_000_000
"""Most requests a run may plan (arrivals over its duration, bursts included, or a trace's
requests) unless `--max-requests N` raises it: about 300 B each before the run starts (the
request list) and as much again in records, so ~0.6 GB at the cap. 1,000 requests/s for 16
minutes is under it; `rate: 1.0e6` for 40 s (40M requests) is not."""
MAX_THRESHOLDS = 10_000
"""Most thresholds the planner's grid searches ((max - min) / planner.threshold_step): with up
to 999 PD splits each, 10K thresholds are 80 MB of Lambda_max at once. The paper's grid is
1,280 (128 to 128K tokens in steps of 100)."""
MAX_ARRIVAL_RATE = 1_000_000.0
"""Requests/s of `arrivals.rate` (and a shift's): above it a run of a second passes the cap."""
MAX_LOAD = 1000.0
"""`arrivals.load`, a multiple of the planner's lambda_max: 1000x is no saturation experiment."""
TIME_SCALE = (0.01, 1000.0)
"""`scale.time_scale`: at most 100x slower than real time (a 60 s scenario takes 100 min wall)
and 1000x faster (every library scenario runs at 10 or 20; past 1000 the host's timers and the
event loop, not the emulated hardware, set the pace)."""
BYTE_SCALE = (1.0, 1e9)
"""`scale.byte_scale`: KV bytes are divided by it, never multiplied (below 1 a 128K-token
prompt's ~10 GB of KV would grow), and 1e9 leaves a few bytes of a 10 GB transfer."""
DECODE_TOKENS_PER_S = (0.01, 1e6)
"""`slo.decode_tokens_per_s`: the TPOT bound is its inverse; 1e-308 made BS_max infinite."""


class FieldError(ConfigError):
    """A limit past which a field of a scenario goes, found when the scenario is planned: the
    message starts with the field. `at(source)` names the file, which the planner (working on
    the parsed scenario) does not know."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field

    def at(self, source: str) -> ConfigError:
        """The same error as one line naming `source` (the file, or the scenario's name)."""
        return ConfigError(f"{source}: {self}")


def within(lo: float, hi: float, unit: str, why: str) -> Any:
    """A pydantic validator refusing a number outside [lo, hi], in `unit`, saying why."""

    def check(v: float) -> float:
        if not lo <= v <= hi:
            raise ValueError(f"must be from {lo:g} to {hi:g} {unit} ({why}), got {v:g}")
        return v

    return AfterValidator(check)
