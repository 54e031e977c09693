"""Typed configuration: deployment, link, workload, scale and scenario, read from YAML.

Every quantity a person writes carries its unit ("100Gbps", "25ms", "19.4K"); the models turn them
into SI floats at the boundary so nothing downstream handles strings. Unknown fields are errors
(a typo must not silently fall back to a default), and every error names the file and the field
or line, because that is what a person needs to fix it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from testbed.errors import ConfigError
from testbed.profiles import HARDWARE, MODELS
from testbed.units import parse_bandwidth, parse_duration, parse_size, parse_tokens

__all__ = [
    "ArrivalsConfig",
    "ClusterConfig",
    "DeploymentConfig",
    "LengthsConfig",
    "LinkConfig",
    "PolicyConfig",
    "ScaleConfig",
    "Scenario",
    "SloConfig",
    "WorkloadConfig",
    "load_scenario",
]


def _positive(v: float) -> float:
    if v <= 0:
        raise ValueError("must be greater than zero")
    return v


def _non_negative(v: float) -> float:
    if v < 0:
        raise ValueError("must not be negative")
    return v


Bandwidth = Annotated[float, BeforeValidator(parse_bandwidth), AfterValidator(_positive)]
Size = Annotated[float, BeforeValidator(parse_size), AfterValidator(_non_negative)]
Duration = Annotated[float, BeforeValidator(parse_duration), AfterValidator(_non_negative)]
PositiveDuration = Annotated[float, BeforeValidator(parse_duration), AfterValidator(_positive)]
Tokens = Annotated[float, BeforeValidator(parse_tokens), AfterValidator(_positive)]

DeploymentKind = Literal["prfaas-pd", "homogeneous", "naive"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _known_hardware(name: str) -> str:
    if name not in HARDWARE:
        raise ValueError(f"unknown hardware profile {name!r}; known: {', '.join(sorted(HARDWARE))}")
    return name


def _known_model(name: str) -> str:
    if name not in MODELS:
        raise ValueError(f"unknown model profile {name!r}; known: {', '.join(sorted(MODELS))}")
    return name


class ScaleConfig(_Model):
    """How much faster and smaller than the real system the emulation runs.

    Emulated durations are real durations / time_scale; KV bytes on the wire are real bytes /
    byte_scale, so emulated link bandwidth is real bandwidth x time_scale / byte_scale.
    """

    time_scale: float = Field(1.0, gt=0)
    byte_scale: float = Field(1.0, gt=0)


class LinkConfig(_Model):
    """The cross-datacenter link, in real-world units."""

    bandwidth: Bandwidth = Field(default_factory=lambda: parse_bandwidth("100Gbps"))
    rtt: Duration = 0.0
    jitter: Duration = 0.0
    connections: int = Field(4, ge=1, le=64, description="parallel TCP connections per transfer")
    shaper: Literal["emulator", "tc"] = "emulator"
    toxiproxy: str | None = Field(
        None, description="host:port of an external Toxiproxy-compatible API to use instead"
    )


class ClusterConfig(_Model):
    """One datacenter's instances, all on one hardware profile."""

    hardware: Annotated[str, AfterValidator(_known_hardware)]
    instances: int = Field(ge=1, le=1000)
    prefill: int | None = Field(None, ge=0)
    decode: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _split_fits(self) -> ClusterConfig:
        if (
            self.prefill is not None
            and self.decode is not None
            and self.prefill + self.decode != self.instances
        ):
            raise ValueError(
                f"prefill ({self.prefill}) + decode ({self.decode}) must equal "
                f"instances ({self.instances})"
            )
        for role in ("prefill", "decode"):
            n = getattr(self, role)
            if n is not None and n > self.instances:
                raise ValueError(f"{role} ({n}) exceeds instances ({self.instances})")
        return self


class DeploymentConfig(_Model):
    """Clusters and the link between them.

    - prfaas-pd: a prefill-only `prfaas` cluster plus a `local` PD cluster (split into PD-P and
      PD-D); long uncached prefills go to PrfaaS.
    - homogeneous: one `local` PD cluster, no link.
    - naive: all prefill on `prfaas`, all decode on `local`, no length routing.
    """

    kind: DeploymentKind
    model: Annotated[str, AfterValidator(_known_model)] = "internal-1t-hybrid"
    prfaas: ClusterConfig | None = None
    local: ClusterConfig
    link: LinkConfig = Field(default_factory=LinkConfig)

    @model_validator(mode="after")
    def _clusters_match_kind(self) -> DeploymentConfig:
        if self.kind in ("prfaas-pd", "naive") and self.prfaas is None:
            raise ValueError(f"a {self.kind} deployment needs a 'prfaas' cluster")
        if self.kind == "homogeneous" and self.prfaas is not None:
            raise ValueError("a homogeneous deployment has no 'prfaas' cluster")
        decode_hw = HARDWARE[self.local.hardware]
        if MODELS[self.model].decode.get(decode_hw.name) is None:
            raise ValueError(
                f"model {self.model!r} has no decode profile on {decode_hw.name!r} (local.hardware)"
            )
        for name, cluster in (("prfaas", self.prfaas), ("local", self.local)):
            if cluster is not None and cluster.hardware not in MODELS[self.model].prefill:
                raise ValueError(
                    f"model {self.model!r} has no prefill profile on {cluster.hardware!r} "
                    f"({name}.hardware)"
                )
        return self


class LognormalLengths(_Model):
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


class TraceLengths(_Model):
    """The empirical input length distribution of a Mooncake-format JSONL trace."""

    kind: Literal["trace"] = "trace"
    path: str


class FixedLengths(_Model):
    kind: Literal["fixed"] = "fixed"
    tokens: Tokens


LengthsConfig = Annotated[
    LognormalLengths | TraceLengths | FixedLengths, Field(discriminator="kind")
]


class ArrivalsConfig(_Model):
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


class WorkloadConfig(_Model):
    lengths: LengthsConfig = Field(default_factory=LognormalLengths)
    output_tokens: Tokens = 1024.0
    arrivals: ArrivalsConfig = Field(default_factory=lambda: ArrivalsConfig(load=0.8))
    trace: str | None = Field(None, description="Mooncake JSONL trace to replay (with hash_ids)")
    max_requests: int | None = Field(None, ge=1)


class SloConfig(_Model):
    """Service-level objectives; decode speed sets T_decode and BS_max in the planner."""

    decode_tokens_per_s: float = Field(40.0, gt=0)
    ttft: PositiveDuration = 10.0

    @property
    def tpot(self) -> float:
        return 1.0 / self.decode_tokens_per_s


class PolicyConfig(_Model):
    name: str = "prfaas-static"
    threshold: Tokens | Literal["auto"] = "auto"


class PlannerConfig(_Model):
    """Grid of the planner's threshold search (Eqs. 7-8)."""

    threshold_step: Tokens = 100.0


class Scenario(_Model):
    """A deployment (or several, for comparison), a workload, a policy and a run length."""

    name: str = ""
    description: str = ""
    seed: int = 0
    duration: PositiveDuration = 60.0
    scale: ScaleConfig = Field(default_factory=ScaleConfig)
    deployments: dict[str, DeploymentConfig] = Field(min_length=1)
    deployment: str | None = Field(None, description="which deployment a live run uses")
    workload: WorkloadConfig = Field(default_factory=WorkloadConfig)
    slo: SloConfig = Field(default_factory=SloConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    planner: PlannerConfig = Field(default_factory=PlannerConfig)
    nemesis: list[dict[str, Any]] = Field(default_factory=list)
    checkers: list[dict[str, Any]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _deployment_exists(self) -> Scenario:
        if self.deployment is not None and self.deployment not in self.deployments:
            raise ValueError(
                f"deployment {self.deployment!r} is not one of: {', '.join(self.deployments)}"
            )
        return self


def _format_validation_error(path: Path, exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"] if not _is_union_tag(p))
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
    elif err["type"] == "missing":
        msg = "missing field"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{path}: {loc or '<top>'}: {msg}{more}"


def _is_union_tag(part: object) -> bool:
    return isinstance(part, str) and part in ("lognormal", "trace", "fixed")


def load_yaml(path: Path) -> Any:
    """Read a YAML file; syntax errors become one line naming the file and line."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{where}: YAML syntax error: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: YAML error: {exc}") from None


def load_scenario(path: str | Path) -> Scenario:
    """Load and validate a scenario file. Relative trace paths are resolved against it."""
    p = Path(path)
    data = load_yaml(p)
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping of scenario fields at the top level")
    data.setdefault("name", p.stem)
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(p, exc)) from None
    return _resolve_paths(scenario, p.parent)


def _resolve_paths(scenario: Scenario, base: Path) -> Scenario:
    wl = scenario.workload
    updates: dict[str, Any] = {}
    if isinstance(wl.lengths, TraceLengths) and not Path(wl.lengths.path).is_absolute():
        updates["lengths"] = wl.lengths.model_copy(update={"path": str(base / wl.lengths.path)})
    if wl.trace is not None and not Path(wl.trace).is_absolute():
        updates["trace"] = str(base / wl.trace)
    if not updates:
        return scenario
    return scenario.model_copy(update={"workload": wl.model_copy(update=updates)})
