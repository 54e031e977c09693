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

from testbed.engine.torch.config import TinyConfig
from testbed.errors import ConfigError
from testbed.profiles import HARDWARE, MODELS
from testbed.units import parse_bandwidth, parse_duration, parse_size, parse_tokens

__all__ = [
    "ArrivalsConfig",
    "CheckerConfig",
    "ClusterConfig",
    "DeploymentConfig",
    "LengthsConfig",
    "LinkConfig",
    "NemesisEvent",
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
    prefix_cache: Size | None = Field(
        None,
        description="bytes of prefix cache the cluster's pool holds (real-world, e.g. '4TiB'); "
        "default: half the host memory of each instance (testbed.kvcache.manager)",
    )

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


class TinyModelConfig(_Model):
    """The tiny real model of `engine: torch` (testbed.engine.torch): the seed fixes every
    weight, so every prefill and decode process of a run builds the same model."""

    seed: int = Field(0, ge=0, lt=2**63)
    dtype: Literal["float32", "float64"] = "float32"


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
    engine: Literal["emulated", "torch"] = "emulated"
    """emulated: cost-model timed, scaled bytes; torch: the tiny real model (docs/model.md),
    whose steps are padded to `model`'s profile and whose real KV tensors cross the link."""
    tiny_model: TinyModelConfig = Field(default_factory=lambda: TinyModelConfig())

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


class ShiftConfig(_Model):
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


class WorkloadConfig(_Model):
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


class SloConfig(_Model):
    """Service-level objectives; decode speed sets T_decode and BS_max in the planner."""

    decode_tokens_per_s: float = Field(40.0, gt=0)
    ttft: PositiveDuration = 10.0

    @property
    def tpot(self) -> float:
        return 1.0 / self.decode_tokens_per_s


class ShortTermConfig(_Model):
    """The short-term loop's knobs (scheduler.shortterm; defaults justified in
    docs/scheduler.md)."""

    interval: PositiveDuration = 1.0
    replan_change: float = Field(0.2, gt=0, description="bandwidth move that triggers a re-plan")
    min_t_change: float = Field(0.05, ge=0, description="smallest t change adopted")
    cooldown: Duration = 2.0
    scarce_utilisation: float = Field(0.7, gt=0, le=1)
    queue_balance: bool = True
    """Correct t from the routes' expected waits (scheduler.balance)."""
    balance_margin: PositiveDuration = 2.0
    balance_step: float = Field(1.1, gt=1)
    max_bias: float = Field(4.0, ge=1)


class LongTermConfig(_Model):
    """The long-term loop's knobs (scheduler.longterm; defaults justified in
    docs/scheduler.md)."""

    interval: PositiveDuration = 10.0
    window: PositiveDuration = 30.0
    """Observed input lengths of the requests that arrived in the last `window` feed the
    planner."""
    min_samples: int = Field(30, ge=1)
    min_gain: float = Field(0.1, ge=0)
    sustain: int = Field(6, ge=1)
    """Consecutive checks (x interval = 60 s) a move must be wanted before it is made."""
    pressure: float = Field(0.8, ge=0)
    role_switch: Duration = 5.0
    """Real-world time a PD instance needs to restart in the other role once drained."""
    drain_timeout: PositiveDuration = 300.0


class PolicyConfig(_Model):
    name: str = "prfaas-static"
    threshold: Tokens | Literal["auto"] = "auto"
    short_term: ShortTermConfig = Field(default_factory=lambda: ShortTermConfig())
    long_term: LongTermConfig = Field(default_factory=lambda: LongTermConfig())


class PlannerConfig(_Model):
    """Grid of the planner's threshold search (Eqs. 7-8)."""

    threshold_step: Tokens = 100.0


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


class NemesisEvent(_Model):
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


class CheckerConfig(_Model):
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


class Scenario(_Model):
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


MAX_YAML_BYTES = 16 << 20
"""Scenario and profile files are small; anything bigger is a mistake (or hostile)."""


def load_yaml(path: Path) -> Any:
    """Read a YAML file; syntax errors become one line naming the file and line."""
    try:
        if path.exists() and not path.is_file():  # a FIFO or a device could block or never end
            raise ConfigError(f"{path}: not a regular file")
        with path.open("rb") as f:
            raw = f.read(MAX_YAML_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    if len(raw) > MAX_YAML_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_YAML_BYTES >> 20} MiB; not a scenario file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start + 1})") from None
    try:
        return yaml.safe_load(text)
    except RecursionError:
        raise ConfigError(f"{path}: YAML nested too deeply") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{where}: YAML syntax error: {exc.problem}") from None
    except yaml.YAMLError as exc:
        one_line = " ".join(part.strip() for part in str(exc).splitlines())
        raise ConfigError(f"{path}: YAML error: {one_line}") from None


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
