"""The workload: prompt lengths, arrivals, a lasting shift of traffic."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field, model_validator

from testbed.config.base import PositiveDuration, StrictModel, Tokens
from testbed.config.limits import MAX_ARRIVAL_RATE, MAX_LOAD, MAX_TOKENS, within

__all__ = [
    "ArrivalsConfig",
    "FixedLengths",
    "LengthsConfig",
    "LognormalLengths",
    "ShiftConfig",
    "TraceLengths",
    "WorkloadConfig",
]


class LognormalLengths(StrictModel):
    """The paper's truncated log-normal input length distribution."""

    kind: Literal["lognormal"] = "lognormal"
    mu: Annotated[float, within(-100, 100, "(ln tokens)", "the paper's is 9.90, ln 20K")] = 9.90
    sigma: Annotated[float, within(1e-3, 10, "(ln tokens)", "the paper's is 1.00")] = 1.00
    """Bounded where the closed forms break: exp(mu + sigma^2 / 2) overflows past sigma ~37."""
    min: Tokens = 128.0
    max: Tokens = 128_000.0

    @model_validator(mode="after")
    def _ordered(self) -> LognormalLengths:
        if self.min >= self.max:
            raise ValueError(f"min ({self.min:g}) must be below max ({self.max:g})")
        return self

    @model_validator(mode="after")
    def _window_has_mass(self) -> LognormalLengths:
        """[min, max] must hold a real share of the log-normal: when mu sits far outside it
        (`mu: -300`), the truncated distribution's mass rounds to zero and every statistic the
        planner takes of it divides by that zero (testbed.workload.lengths)."""
        mass = _normal_mass((math.log(self.min) - self.mu) / self.sigma) - _normal_mass(
            (math.log(self.max) - self.mu) / self.sigma
        )
        if not mass >= MIN_WINDOW_MASS:
            raise ValueError(
                f"[min, max] = [{self.min:g}, {self.max:g}] tokens holds {mass:.1e} of the "
                f"log-normal (mu {self.mu:g}, sigma {self.sigma:g}), below {MIN_WINDOW_MASS:g}: "
                f"put mu between ln(min) = {math.log(self.min):.2f} and ln(max) = "
                f"{math.log(self.max):.2f}, or widen sigma"
            )
        return self


MIN_WINDOW_MASS = 1e-6
"""Least probability the truncation window of a log-normal must hold."""


def _normal_mass(z: float) -> float:
    """P(Z > z) for a standard normal Z; erfc keeps the upper tail's precision."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


class TraceLengths(StrictModel):
    """The empirical input length distribution of a Mooncake-format JSONL trace."""

    kind: Literal["trace"] = "trace"
    path: str


class FixedLengths(StrictModel):
    kind: Literal["fixed"] = "fixed"
    tokens: Tokens


_RATE = within(0, MAX_ARRIVAL_RATE, "requests/s", "the request count is capped")
_LOAD = within(0, MAX_LOAD, "x lambda_max", "1.0 is the planner's saturation rate")
_BURSTINESS = within(1e-3, 1e3, "(squared coefficient of variation)", "1 is Poisson")

LengthsConfig = Annotated[
    LognormalLengths | TraceLengths | FixedLengths, Field(discriminator="kind")
]


class ArrivalsConfig(StrictModel):
    """When requests arrive, in real-world time.

    Give either `rate` (requests/s) or `load` (a fraction of the planner's lambda_max for the
    deployment being run), which is how saturation experiments are written.
    """

    process: Literal["poisson", "uniform", "gamma", "onoff", "trace"] = "poisson"
    rate: Annotated[float, _RATE] | None = Field(
        None, gt=0, description="mean arrival rate, requests/s"
    )
    load: Annotated[float, _LOAD] | None = Field(
        None, gt=0, description="fraction of the planner's lambda_max"
    )
    burstiness: Annotated[float, _BURSTINESS] = Field(
        1.0, gt=0, description="gamma: squared coefficient of variation of inter-arrival times"
    )
    on_duration: PositiveDuration = 10.0
    off_duration: PositiveDuration = 10.0

    def rate_for(self, lambda_max_rps: float) -> float | None:
        """The offered rate (requests/s) on a deployment whose optimum is `lambda_max_rps`:
        `rate`, else `load` x lambda_max; None for a trace that sets its own times."""
        if self.rate is not None:
            return self.rate
        return None if self.load is None else self.load * lambda_max_rps

    @model_validator(mode="after")
    def _one_rate(self) -> ArrivalsConfig:
        if self.process != "trace" and (self.rate is None) == (self.load is None):
            raise ValueError("give exactly one of 'rate' (requests/s) or 'load' (of lambda_max)")
        return self

    @model_validator(mode="after")
    def _shape_fits_process(self) -> ArrivalsConfig:
        """A process's shape given to another process would be read by nothing. (Compared with
        the default, not `model_fields_set`, so a dumped config validates again.)"""
        for name, process in (
            ("burstiness", "gamma"),
            ("on_duration", "onoff"),
            ("off_duration", "onoff"),
        ):
            default = type(self).model_fields[name].default
            if getattr(self, name) != default and self.process != process:
                raise ValueError(f"'{name}' applies to process '{process}' only")
        return self


class ShiftConfig(StrictModel):
    """A lasting change of traffic at `at`: from then on prompt lengths follow `lengths` and
    arrivals come at `rate`, or at `load` x the planner's lambda_max for the new lengths (the
    deployment's new optimum, PD split free)."""

    at: PositiveDuration
    lengths: LengthsConfig
    rate: Annotated[float, _RATE] | None = Field(None, gt=0)
    load: Annotated[float, _LOAD] | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _one_rate(self) -> ShiftConfig:
        if (self.rate is None) == (self.load is None):
            raise ValueError("give exactly one of 'rate' (requests/s) or 'load' (of lambda_max)")
        return self


class WorkloadConfig(StrictModel):
    lengths: LengthsConfig = Field(default_factory=LognormalLengths)
    output_tokens: Annotated[
        Tokens, within(1, MAX_TOKENS, "tokens", "the planner divides by it")
    ] = 1024.0
    arrivals: ArrivalsConfig = Field(default_factory=lambda: ArrivalsConfig(load=0.8))
    trace: str | None = Field(None, description="Mooncake JSONL trace to replay (with hash_ids)")
    max_requests: int | None = Field(None, ge=1)
    shift: ShiftConfig | None = None

    @model_validator(mode="after")
    def _shift_needs_generated(self) -> WorkloadConfig:
        if self.shift is not None and (self.trace is not None or self.arrivals.process == "trace"):
            raise ValueError("shift works on generated workloads, not on trace replay")
        return self
