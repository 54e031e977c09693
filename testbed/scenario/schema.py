"""The scenario file: its model (deployments, workload, policy, nemesis timeline, checkers, run
length) and its loader.

The `nemesis:` and `checkers:` entries are tagged unions of what is registered
(testbed.nemesis.ACTIONS, testbed.checkers.CHECKERS), built when this module is imported, so a
new fault or checker is one file and no list here changes. That is why the model sits with the
runner rather than in testbed.config (below the nemesis and the checkers in the import layers).

Every error is one line naming the file and the field (or the line, for YAML syntax), because
that is what a person needs to fix it; `_describe` words the union cases the way a person thinks
of them ("action 'kill' needs field 'target'").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, get_args

from pydantic import AfterValidator, BaseModel, Field, ValidationError, model_validator
from pydantic_core import ErrorDetails

from testbed.checkers import CHECKERS, CheckerConfig, checker_union
from testbed.config import (
    STRICT_UNITS,
    DeploymentConfig,
    FixedLengths,
    LengthsConfig,
    LognormalLengths,
    PlannerConfig,
    PolicyConfig,
    PositiveDuration,
    ScaleConfig,
    SloConfig,
    StrictModel,
    TraceLengths,
    WorkloadConfig,
    literal_values,
    load_yaml,
)
from testbed.config.profiles import ProfileFile, load_profile_file, register_profile
from testbed.config.router import ExternalRouterConfig
from testbed.config.suggest import closest_field, fields_at
from testbed.engine.torch.config import TinyConfig
from testbed.errors import ConfigError
from testbed.nemesis import ACTIONS, NemesisEvent, nemesis_union
from testbed.policy import POLICIES
from testbed.registry import UnknownName

__all__ = ["CheckerAction", "NemesisAction", "Scenario", "load_scenario", "scenario_from_data"]

if TYPE_CHECKING:
    NemesisAction = NemesisEvent
    CheckerAction = CheckerConfig
else:
    NemesisAction = nemesis_union()
    CheckerAction = checker_union()
"""One `nemesis:` / `checkers:` entry: the registered models, tagged by `action` / `check`
(for a type checker, their base class)."""


def _registered(doc: ProfileFile) -> ProfileFile:
    try:
        register_profile(doc)
    except ValueError as exc:  # a name that already means something else
        raise ValueError(str(exc)) from None
    return doc


class Scenario(StrictModel):
    """A deployment (or several, for comparison), a workload, a policy and a run length."""

    name: str = ""
    description: str = ""
    profiles: list[Annotated[ProfileFile, AfterValidator(_registered)]] = Field(
        default_factory=list,
        description="user model/hardware profile files (paths relative to the scenario file)",
    )
    """Before `deployments`: fields are validated in order, and a deployment's `model` and
    `hardware` must already be known by name."""
    seed: int = Field(0, ge=0, lt=2**63)
    duration: PositiveDuration = 60.0
    scale: ScaleConfig = Field(default_factory=ScaleConfig)
    deployments: dict[str, DeploymentConfig] = Field(min_length=1)
    deployment: str | None = Field(None, description="which deployment a live run uses")
    workload: WorkloadConfig = Field(default_factory=WorkloadConfig)
    slo: SloConfig = Field(default_factory=SloConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    planner: PlannerConfig = Field(default_factory=PlannerConfig)
    nemesis: list[NemesisAction] = Field(default_factory=list)
    checkers: list[CheckerAction] = Field(default_factory=list)
    router: ExternalRouterConfig | None = None
    """An external router in front of the fleet instead of ours (docs/real-routers.md); None:
    our router and `policy`."""

    @model_validator(mode="after")
    def _deployment_exists(self) -> Scenario:
        if self.deployment is not None and self.deployment not in self.deployments:
            raise ValueError(
                f"deployment {self.deployment!r} is not one of: {', '.join(self.deployments)}"
            )
        return self

    @model_validator(mode="after")
    def _policy_is_known(self) -> Scenario:
        """Every command that reads the scenario (run, plan, sweep) refuses a policy name that
        nothing implements, rather than planning for it and failing later."""
        try:
            POLICIES[self.policy.name]  # a plugin (module:Class, entry point) loads here
        except UnknownName as exc:
            raise ValueError(f"policy.name: {exc}") from None
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


@dataclass(frozen=True)
class _Union:
    """A tagged union of the scenario model, for wording its errors."""

    tag: str
    """The discriminator field ("kind", "action", "check")."""
    tags: tuple[str, ...]
    fields: frozenset[str]
    """Every member's fields (by alias): one that a member lacks "does not apply" to it."""
    entries: bool
    """A list of entries (nemesis, checkers): a missing field is "<tag> 'x' needs field 'y'"."""


def _union(members: Sequence[type[BaseModel]], tag: str, *, entries: bool) -> _Union:
    tags = tuple(t for m in members for t in literal_values(m, tag))
    fields = frozenset(f.alias or n for m in members for n, f in m.model_fields.items())
    return _Union(tag, tags, fields, entries)


_UNIONS: dict[str, _Union] = {
    "lengths": _union(get_args(get_args(LengthsConfig)[0]), "kind", entries=False),
    "nemesis": _union([f.config for f in ACTIONS.entries()], "action", entries=True),
    "checkers": _union([c.config for c in CHECKERS.entries()], "check", entries=True),
}
"""The scenario's unions by the field that holds them."""


def _owner(loc: Sequence[int | str], i: int) -> str | None:
    """The field whose union (or list of unions) loc[i] is a member tag of, if any."""
    prev = loc[i - 1] if i >= 1 else None
    if isinstance(prev, int):
        prev = loc[i - 2] if i >= 2 else None
    return prev if isinstance(prev, str) else None


def _describe(err: ErrorDetails) -> tuple[str, str]:
    """(where, what) of one pydantic error: the dotted field path without union tags, and the
    message."""
    loc = list(err["loc"])
    path: list[int | str] = []
    union: _Union | None = None
    tag, tag_at = "", -1
    for i, part in enumerate(loc):
        owner = _owner(loc, i)
        u = _UNIONS.get(owner) if owner is not None else None
        if u is not None and isinstance(part, str) and part in u.tags:
            union, tag, tag_at = u, part, i
            continue
        path.append(part)
    where = ".".join(str(p) for p in path)
    kind = err["type"]
    msg = err["msg"].removeprefix("Value error, ")
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        holder = loc[-2] if len(loc) > 1 and isinstance(loc[-1], int) else loc[-1] if loc else ""
        u = _UNIONS.get(str(holder))
        if u is not None:
            if kind == "union_tag_not_found":
                return f"{where}.{u.tag}", "missing field"
            bad = (err.get("ctx") or {}).get("tag", "?")
            return f"{where}.{u.tag}", f"unknown {u.tag} {bad!r}; known: {', '.join(u.tags)}"
    if union is not None and union.entries and tag_at == len(loc) - 2:  # a field of an entry
        entry = ".".join(str(p) for p in path[:-1])
        name = path[-1]
        if kind == "missing":
            return entry, f"{union.tag} {tag!r} needs field {name!r}"
        if kind == "extra_forbidden" and name in union.fields:
            return entry, f"field {name!r} does not apply to {union.tag} {tag!r}"
    if kind == "extra_forbidden":
        msg = "unknown field"
        if loc and isinstance(loc[-1], str):
            near = closest_field(loc[-1], fields_at(Scenario, loc[:-1]))
            if near is not None:
                msg += f"; did you mean {near!r}?"
    elif kind == "missing":
        msg = "missing field"
    return where, msg


def _format_validation_error(path: Path, exc: ValidationError) -> str:
    errors = exc.errors()
    # A typo shows up twice (the misspelt field is unknown, the real one missing): the unknown
    # one is the cause, and it carries the suggestion.
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    where, msg = _describe(first)
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    if not where:  # a check across fields: its message starts with the field to fix
        return f"{path}: {msg}{more}"
    return f"{path}: {where}: {msg}{more}"


def load_scenario(path: str | Path) -> Scenario:
    """Load and validate a scenario file. Relative trace paths are resolved against it."""
    p = Path(path)
    return scenario_from_data(load_yaml(p), p)


def scenario_from_data(data: Any, p: Path) -> Scenario:
    """Validate a scenario file's parsed contents (possibly changed, as `testbed sweep` does)
    as if they were the file `p`: errors name it, relative paths resolve against it."""
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping of scenario fields at the top level")
    data.setdefault("name", p.stem)
    profiles = data.get("profiles")
    if isinstance(profiles, list):  # paths: each file reports its own errors, by its own name
        data["profiles"] = [
            load_profile_file(p.parent / f) if isinstance(f, str) else f for f in profiles
        ]
    try:
        scenario = Scenario.model_validate(data, context=STRICT_UNITS)
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
