"""What a service process is told at start: its role, identity, profiles and the run's clock.

Passed as one JSON argument so the local and compose substrates start services the same way.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["InstanceInfo", "RunClock", "ServiceSpec"]


class InstanceInfo(BaseModel):
    """Where the router finds an instance."""

    model_config = ConfigDict(frozen=True)

    id: str
    cluster: Literal["prfaas", "local"]
    role: Literal["prefill", "decode"]
    url: str
    kv_host: str | None = None
    kv_port: int | None = None
    kv_link_host: str | None = None
    """Where cross-datacenter senders reach this decode instance's KV port (the link proxy)."""
    kv_link_port: int | None = None


class SchedulerSpec(BaseModel):
    """What the router's short-term loop needs to re-run the planner: the deployment, the
    length distribution and the SLO, as plain JSON (quantities in SI units)."""

    model_config = ConfigDict(extra="forbid")

    deployment: dict[str, Any]
    lengths: dict[str, Any]
    output_tokens: float
    tpot_slo_s: float
    threshold_step: float
    n_prefill: int
    interval_s: float = 1.0
    """Real-world seconds between samples of the PrfaaS senders."""


class ServiceSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["router", "prefill", "decode"]
    id: str
    cluster: Literal["prfaas", "local"] = "local"
    hardware: str = "h20x8"
    model: str = "internal-1t-hybrid"
    time_scale: float = Field(1.0, gt=0)
    byte_scale: float = Field(1.0, gt=0)
    t0: float = Field(default_factory=time.monotonic, description="run start, time.monotonic()")
    host: str = "127.0.0.1"
    port: int = 0
    kv_port: int = 0
    connections: int = 4
    tpot_slo_s: float = 0.025
    flush_interval_s: float = 0.05
    kv_timeout_s: float = 120.0
    """Wall seconds a decode instance waits for a request's KV before failing it."""
    unsafe_skip_kv_verify: bool = False
    """TEST-ONLY, never set by a scenario: decode admits requests without waiting for their KV
    or its checksums, so the chaos tests can show the no_unverified_decode and kv_accounted
    checkers catching a broken receiver (tests/chaos/test_broken_variants.py)."""
    # router only
    policy: str = "prfaas-static"
    threshold_tokens: float | None = None
    instances: list[InstanceInfo] = Field(default_factory=list)
    request_timeout_s: float = 600.0
    scheduler: SchedulerSpec | None = None
    """Inputs of the short-term loop (policies that re-plan at run time)."""


class RunClock:
    """Converts this machine's monotonic clock to real-world seconds since the run started.

    CLOCK_MONOTONIC is system-wide on Linux, so every process of a run (and every container,
    which shares the kernel) agrees on it.
    """

    def __init__(self, t0: float, time_scale: float) -> None:
        self.t0 = t0
        self.k = time_scale

    def real(self, mono: float | None = None) -> float:
        return ((time.monotonic() if mono is None else mono) - self.t0) * self.k
