"""The scenario model: deployments, workload, policy, nemesis timeline and checkers, and its loader.

Every error names the file and the field or line, because that is what a person needs to fix it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, ValidationError, model_validator

from testbed.config.base import Bandwidth, Duration, PositiveDuration, StrictModel
from testbed.config.deployment import DeploymentConfig, ScaleConfig
from testbed.config.files import load_yaml
from testbed.config.policy import PlannerConfig, PolicyConfig, SloConfig
from testbed.config.workload import FixedLengths, LognormalLengths, TraceLengths, WorkloadConfig
from testbed.engine.torch.config import TinyConfig
from testbed.errors import ConfigError

__all__ = ["NEMESIS_TARGET_GROUPS", "CheckerConfig", "NemesisEvent", "Scenario", "load_scenario"]


NemesisActionName = Literal[
    "bandwidth",
    "latency",
    "partition",
    "reset_peer",
    "slow_close",
    "kill",
    "pause",
    "restart",
    "burst",
]

# Which optional fields each nemesis action takes, and which of them it requires.
_NEMESIS_FIELDS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "bandwidth": (frozenset({"bandwidth"}), frozenset({"bandwidth"})),
    "latency": (frozenset({"rtt", "jitter"}), frozenset()),
    "partition": (frozenset({"mode", "timeout"}), frozenset()),
    "reset_peer": (frozenset({"timeout", "toxicity"}), frozenset()),
    "slow_close": (frozenset({"delay", "toxicity"}), frozenset({"delay"})),
    "kill": (frozenset({"target", "count"}), frozenset({"target"})),
    "pause": (frozenset({"target", "count"}), frozenset({"target", "for_"})),
    "restart": (frozenset({"target", "count"}), frozenset({"target"})),
    "burst": (frozenset({"multiplier"}), frozenset({"multiplier", "for_"})),
}
_NEMESIS_OPTIONAL = frozenset(
    {"for_", "target", "count", "bandwidth", "rtt", "jitter", "mode", "timeout", "delay"}
    | {"toxicity", "multiplier"}
)
NEMESIS_TARGET_GROUPS = ("prfaas-prefill", "local-prefill", "local-decode")
"""Process-fault targets: a group (`count` of its instances, picked from the seed) or one
instance id such as `local-decode-1`."""


def _nemesis_target(value: str | None) -> str | None:
    if value is None:
        return None
    base, _, index = value.rpartition("-")
    if value in NEMESIS_TARGET_GROUPS or (base in NEMESIS_TARGET_GROUPS and index.isdigit()):
        return value
    raise ValueError(
        f"unknown target {value!r}; use one of {', '.join(NEMESIS_TARGET_GROUPS)} "
        f"or an instance id like 'local-decode-0'"
    )


class NemesisEvent(StrictModel):
    """One fault on the nemesis timeline, in real-world seconds since the load started.

    `at` is when it starts; `for` how long it lasts (then it is undone: the link restored, a
    killed worker restarted, a paused one resumed). Without `for` a link fault or a kill is
    permanent. Which fields an action takes: see docs/scenarios.md.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    action: NemesisActionName
    at: Duration
    for_: PositiveDuration | None = Field(None, alias="for")
    target: Annotated[str | None, AfterValidator(_nemesis_target)] = None
    count: int = Field(1, ge=1, le=1000)
    bandwidth: Bandwidth | None = None
    rtt: Duration | None = Field(None, description="latency: round-trip time added to the link")
    jitter: Duration | None = None
    mode: Literal["disable", "timeout"] = "disable"
    timeout: Duration | None = None
    delay: Duration | None = None
    toxicity: float = Field(1.0, ge=0, le=1)
    multiplier: float | None = Field(None, gt=1, le=100)

    @model_validator(mode="after")
    def _fields_fit_action(self) -> NemesisEvent:
        allowed, required = _NEMESIS_FIELDS[self.action]
        set_fields = self.model_fields_set & _NEMESIS_OPTIONAL
        for name in sorted(set_fields - allowed - {"for_"}):
            raise ValueError(f"field {name!r} does not apply to action {self.action!r}")
        for name in sorted(required - set_fields):
            shown = "for" if name == "for_" else name
            raise ValueError(f"action {self.action!r} needs field {shown!r}")
        if self.action == "latency" and self.rtt is None and self.jitter is None:
            raise ValueError("action 'latency' needs 'rtt' or 'jitter'")
        if self.action == "restart" and self.for_ is not None:
            raise ValueError("action 'restart' is instantaneous; use 'kill' with 'for' instead")
        if self.action == "partition" and self.mode == "disable" and self.timeout is not None:
            raise ValueError("'timeout' applies to partition mode 'timeout' only")
        return self

    @property
    def end(self) -> float | None:
        return None if self.for_ is None else self.at + self.for_


CheckName = Literal[
    "ttft", "tpot", "e2e", "reroute", "recover", "failures", "token_exact", "throughput"
]


class CheckerConfig(StrictModel):
    """A checker beyond the three built-in invariants (which always run).

    - ttft / tpot / e2e: percentile `p` of completed requests is at most `max` (only requests
      arriving while a `during` fault is in force, if given), or at most `max_ratio` x the same
      percentile before the fault.
    - failures: at most `max_fraction` of submitted requests failed (with a reason).
    - reroute: after each `fault` (a nemesis action) starts, a request that avoids the faulty
      target starts prefill within `within` (vacuous if no request needed re-routing).
    - recover: after each `fault` ends, TTFT is back under `ttft` (for `streak` consecutive
      requests by arrival) within `within` (vacuous if the fault never ended in the run or
      fewer than `streak` requests arrived after it).
    - throughput: requests completed per second (by last token) in [`after`, `until`] is at
      least `min_fraction` of the planner's lambda_max for the workload in force at `after`
      (after a `workload.shift`: the new optimum, PD split free).
    - token_exact (`engine: torch` only): every completed request's token ids equal a
      single-process generation of the same prompt (recomputed after the run).

    A check with nothing to judge is vacuous (testbed.scenario.checkers), not passed.
    """

    check: CheckName
    p: float = Field(90.0, gt=0, le=100)
    max: PositiveDuration | None = None
    max_fraction: float | None = Field(None, ge=0, le=1)
    fault: NemesisActionName | None = None
    within: PositiveDuration | None = None
    ttft: PositiveDuration | None = None
    streak: int = Field(3, ge=1, le=1000)
    during: NemesisActionName | None = None
    after: Duration | None = None
    until: PositiveDuration | None = None
    min_fraction: float | None = Field(None, gt=0)
    max_ratio: float | None = Field(None, gt=0)
    """ttft/tpot/e2e with `during`: the bound is max_ratio x the same percentile over the
    requests that arrived in an equally long window just before the first such fault."""

    @model_validator(mode="after")
    def _fields_fit_check(self) -> CheckerConfig:
        if self.during is not None and self.check not in ("ttft", "tpot", "e2e"):
            raise ValueError("'during' applies to the ttft, tpot and e2e checks only")
        if self.check in ("ttft", "tpot", "e2e"):
            if (self.max is None) == (self.max_ratio is None):
                raise ValueError(f"check {self.check!r} needs exactly one of 'max', 'max_ratio'")
            if self.max_ratio is not None and self.during is None:
                raise ValueError("'max_ratio' compares with the time before a fault: set 'during'")
        elif self.max_ratio is not None:
            raise ValueError("'max_ratio' applies to the ttft, tpot and e2e checks only")
        need = {
            "ttft": (),
            "tpot": (),
            "e2e": (),
            "failures": ("max_fraction",),
            "reroute": ("fault", "within"),
            "recover": ("fault", "within", "ttft"),
            "token_exact": (),
            "throughput": ("after", "until", "min_fraction"),
        }[self.check]
        for name in need:
            if getattr(self, name) is None:
                raise ValueError(f"check {self.check!r} needs field {name!r}")
        return self


class Scenario(StrictModel):
    """A deployment (or several, for comparison), a workload, a policy and a run length."""

    name: str = ""
    description: str = ""
    seed: int = Field(0, ge=0, lt=2**63)
    duration: PositiveDuration = 60.0
    scale: ScaleConfig = Field(default_factory=ScaleConfig)
    deployments: dict[str, DeploymentConfig] = Field(min_length=1)
    deployment: str | None = Field(None, description="which deployment a live run uses")
    workload: WorkloadConfig = Field(default_factory=WorkloadConfig)
    slo: SloConfig = Field(default_factory=SloConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    planner: PlannerConfig = Field(default_factory=PlannerConfig)
    nemesis: list[NemesisEvent] = Field(default_factory=list)
    checkers: list[CheckerConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _deployment_exists(self) -> Scenario:
        if self.deployment is not None and self.deployment not in self.deployments:
            raise ValueError(
                f"deployment {self.deployment!r} is not one of: {', '.join(self.deployments)}"
            )
        return self

    @model_validator(mode="after")
    def _torch_engine_fits(self) -> Scenario:
        """engine: torch moves the tiny model's real tensors: there is nothing to scale, and
        every prompt plus its output must fit the model's context. The message starts with the
        field to fix (this check spans fields, so pydantic has no single location for it)."""
        torch_deps = [n for n, d in self.deployments.items() if d.engine == "torch"]
        for i, c in enumerate(self.checkers):
            if c.check == "token_exact" and not torch_deps:
                raise ValueError(
                    f"checkers.{i}.check: token_exact needs a deployment with engine: torch"
                )
        if not torch_deps:
            return self
        why = f"deployments.{torch_deps[0]}.engine is torch"
        if self.scale.byte_scale != 1:
            raise ValueError(
                f"scale.byte_scale: must be 1 when {why} (the bytes on the wire are the model's "
                f"real tensors, never scaled), got {self.scale.byte_scale:g}"
            )
        lengths = self.workload.lengths
        if isinstance(lengths, LognormalLengths):
            name, longest = "workload.lengths.max", lengths.max
        elif isinstance(lengths, FixedLengths):
            name, longest = "workload.lengths.tokens", lengths.tokens
        else:  # a trace's lengths are checked when its requests are read (prepare_run)
            return self
        ctx = TinyConfig().max_positions
        out = self.workload.output_tokens
        if longest + out > ctx:
            raise ValueError(
                f"{name}: {longest:g} prompt tokens + workload.output_tokens {out:g} exceed the "
                f"tiny model's context of {ctx} positions ({why})"
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
    if not loc:  # a check across fields: its message starts with the field to fix
        return f"{path}: {msg}{more}"
    return f"{path}: {loc}: {msg}{more}"


def _is_union_tag(part: object) -> bool:
    return isinstance(part, str) and part in ("lognormal", "trace", "fixed")


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
