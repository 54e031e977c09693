"""The workload: prompt lengths, arrivals, a lasting shift of traffic."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from testbed.config.base import PositiveDuration, StrictModel, Tokens

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
    mu: float = 9.90
    sigma: float = Field(1.00, gt=0)
    min: Tokens = 128.0
    max: Tokens = 128_000.0

    @model_validator(mode="after")
    def _ordered(self) -> LognormalLengths:
        if self.min >= self.max:
            raise ValueError(f"min ({self.min:g}) must be below max ({self.max:g})")
        return self


class TraceLengths(StrictModel):
    """The empirical input length distribution of a Mooncake-format JSONL trace."""

    kind: Literal["trace"] = "trace"
    path: str


class FixedLengths(StrictModel):
    kind: Literal["fixed"] = "fixed"
    tokens: Tokens


LengthsConfig = Annotated[
    LognormalLengths | TraceLengths | FixedLengths, Field(discriminator="kind")
]


class ArrivalsConfig(StrictModel):
    """When requests arrive, in real-world time.

    Give either `rate` (requests/s) or `load` (a fraction of the planner's lambda_max for the
    deployment being run), which is how saturation experiments are written.
    """

    process: Literal["poisson", "uniform", "gamma", "onoff", "trace"] = "poisson"
    rate: float | None = Field(None, gt=0, description="mean arrival rate, requests/s")
    load: float | None = Field(None, gt=0, description="fraction of the planner's lambda_max")
    burstiness: float = Field(
        1.0, gt=0, description="gamma: squared coefficient of variation of inter-arrival times"
    )
    on_duration: PositiveDuration = 10.0
    off_duration: PositiveDuration = 10.0

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
    rate: float | None = Field(None, gt=0)
    load: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _one_rate(self) -> ShiftConfig:
        if (self.rate is None) == (self.load is None):
            raise ValueError("give exactly one of 'rate' (requests/s) or 'load' (of lambda_max)")
        return self


class WorkloadConfig(StrictModel):
    lengths: LengthsConfig = Field(default_factory=LognormalLengths)
    output_tokens: Tokens = 1024.0
    arrivals: ArrivalsConfig = Field(default_factory=lambda: ArrivalsConfig(load=0.8))
    trace: str | None = Field(None, description="Mooncake JSONL trace to replay (with hash_ids)")
    max_requests: int | None = Field(None, ge=1)
    shift: ShiftConfig | None = None

    @model_validator(mode="after")
    def _shift_needs_generated(self) -> WorkloadConfig:
        if self.shift is not None and (self.trace is not None or self.arrivals.process == "trace"):
            raise ValueError("shift works on generated workloads, not on trace replay")
        return self
