"""What the scheduler aims for (the SLO) and its knobs: the policy, its loops, the planner."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import (
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from testbed.config.base import Duration, PositiveDuration, StrictModel, Tokens
from testbed.config.limits import DECODE_TOKENS_PER_S, within
from testbed.config.suggest import closest_field
from testbed.registry import Registry

__all__ = [
    "POLICY_KNOBS",
    "LongTermConfig",
    "PlannerConfig",
    "PolicyConfig",
    "PolicyKnobs",
    "ShortTermConfig",
    "SloConfig",
]


class SloConfig(StrictModel):
    """Service-level objectives; decode speed sets T_decode and BS_max in the planner."""

    decode_tokens_per_s: Annotated[
        float, within(*DECODE_TOKENS_PER_S, "tokens/s", "the paper's SLO is 40")
    ] = 40.0
    ttft: PositiveDuration = 10.0
    e2e: PositiveDuration | None = None
    """Goodput also needs E2E (arrival to last token) within this bound; None: no E2E bound."""
    tpot_tolerance: float = Field(0.05, ge=0, le=1)
    """Relative slack on the TPOT bound when judging goodput (metrics.summary)."""

    @property
    def tpot(self) -> float:
        return 1.0 / self.decode_tokens_per_s


class ShortTermConfig(StrictModel):
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


class LongTermConfig(StrictModel):
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
    predrain: int = Field(3, ge=0)
    """Checks before a conversion is decided at which its instances start draining (x
    interval = 30 s ahead): the wait for requests queued for prefill elsewhere overlaps the
    confirmation window. 0: drain only once the conversion is decided."""
    role_switch: Duration = 5.0
    """Real-world time a PD instance needs to restart in the other role once drained."""
    drain_timeout: PositiveDuration = 300.0


K = TypeVar("K", bound="PolicyKnobs")


class PolicyKnobs(StrictModel):
    """A policy's own knobs: the section `policy.<section>` of a scenario (`policy.predict` for
    `prfaas-predict`). The model lives beside its policy (testbed/policy/predict.py), which names
    it as its class's `config`, as a fault names its entry's model; the policy registry then
    registers it here under its `section`, so a policy with knobs edits no central model
    (docs/extending.md). Every registered section is part of every scenario's `policy:` (with
    its defaults when the file leaves it out), so `policy.predict.link_headroom` stays a path of
    the file and of `--set`, whatever the policy, as it was when the section was a field here."""

    section: ClassVar[str]
    """The key under `policy:` (a Python identifier)."""


def _check_knobs(model: type[PolicyKnobs]) -> None:
    if not (isinstance(model, type) and issubclass(model, PolicyKnobs)):
        raise TypeError(f"{model!r}: a policy's config must derive from PolicyKnobs")
    section = getattr(model, "section", None)
    if not isinstance(section, str) or not section.isidentifier():
        raise TypeError(f"{model.__qualname__}: class attribute 'section' must be an identifier")
    if section in PolicyConfig.model_fields:
        raise ValueError(f"{model.__qualname__}: section {section!r} is a field of PolicyConfig")


POLICY_KNOBS: Registry[type[PolicyKnobs]] = Registry(
    "policy section", "testbed.policy", names=lambda m: (m.section,), check=_check_knobs
)
"""Every policy's knobs model by its section; filled by the policy registry (testbed.policy.base)
as each policy class with a `config` registers."""


class PolicyConfig(StrictModel):
    """The policy: a name (built-in, `module:Class`, entry point), or `kind: http`, a service
    answering the decision protocol (docs/policy-protocol.md). For `kind: http` the config
    writes `name` itself, as the URL with its settings in the fragment
    (`http://host:port/route#timeout=50ms&fallback=naive`): that one string is what every
    other part of the testbed (and `--policy`) calls the policy.

    Besides these fields, one section per policy with knobs, each validated by that policy's
    own model (`PolicyKnobs`; e.g. `predict:`, the knobs of `prfaas-predict`, ignored by the
    other policies): `knobs(Model)` reads one."""

    model_config = ConfigDict(extra="allow", frozen=True)
    """Sections are the extra keys, each checked by its model (`_sections`): an unknown key is
    still an error naming it."""

    kind: Literal["python", "http"] = "python"
    name: str = "prfaas-static"
    threshold: Tokens | Literal["auto"] = "auto"
    short_term: ShortTermConfig = Field(default_factory=lambda: ShortTermConfig())
    long_term: LongTermConfig = Field(default_factory=lambda: LongTermConfig())
    url: str | None = None
    """kind http: where decisions are posted (POST), e.g. http://127.0.0.1:9000/route."""
    timeout: PositiveDuration = 0.020
    """kind http: wall-clock budget of one decision; past it the fallback decides."""
    fallback: str = "prfaas-static"
    """kind http: the built-in policy that decides when the service fails."""
    command: list[str] | None = None
    """kind http: the scenario owns the service: this command is started before the run (its
    output goes to the results directory) and stopped after it; `url` must be where it serves."""
    debug_validate: bool = False
    """kind http: check every message against the JSON Schemas (slow; needs jsonschema)."""

    @model_validator(mode="wrap")
    @classmethod
    def _sections(
        cls, data: Any, handler: ModelWrapValidatorHandler[PolicyConfig], info: ValidationInfo
    ) -> PolicyConfig:
        """Each policy's section validated by its model, with errors at its path
        (`policy.predict.link_headroom`); every registered section not given gets its defaults;
        any other key is unknown, as on every other model."""
        if not isinstance(data, dict):
            return handler(data)
        data = dict(data)
        errors: list[InitErrorDetails] = []
        for key in [k for k in data if k not in cls.model_fields]:
            model = POLICY_KNOBS.get(key)
            if model is None:
                errors.append(_unknown((key,), data[key], {*cls.model_fields, *POLICY_KNOBS}))
                continue
            try:
                data[key] = model.model_validate(data[key], context=info.context)
            except ValidationError as exc:
                errors += [
                    _unknown((key, *e["loc"]), e["input"], model.model_fields)
                    if e["type"] == "extra_forbidden" and len(e["loc"]) == 1
                    else InitErrorDetails(
                        type=e["type"], loc=(key, *e["loc"]), input=e["input"], ctx=e.get("ctx", {})
                    )
                    for e in exc.errors()
                ]
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        for section, model in POLICY_KNOBS.items():
            data.setdefault(section, model())
        return handler(data)

    def knobs(self, model: type[K]) -> K:
        """This scenario's section of `model` (its defaults if the policy has just registered)."""
        value = (self.__pydantic_extra__ or {}).get(model.section)
        return value if isinstance(value, model) else model()

    @model_validator(mode="after")
    def _http(self) -> PolicyConfig:
        if self.kind == "python":
            # a value other than the default (a dumped config carries the defaults back)
            extra = [
                f
                for f in ("url", "command", "timeout", "fallback", "debug_validate")
                if getattr(self, f) != type(self).model_fields[f].default
            ]
            if extra:
                raise ValueError(f"{', '.join(extra)}: only for kind: http")
            return self
        if self.url is None:
            raise ValueError("kind: http needs url (where the service answers decisions)")
        if not self.url.startswith(("http://", "https://")) or "#" in self.url:
            raise ValueError(f"url {self.url!r}: write it as http://host:port/path")
        if self.command is not None and not self.command:
            raise ValueError("command: give the program and its arguments, or leave it out")
        frag = []
        if self.timeout != 0.020:
            frag.append(f"timeout={self.timeout * 1e3:g}ms")
        if self.fallback != "prfaas-static":
            frag.append(f"fallback={self.fallback}")
        if self.debug_validate:
            frag.append("validate=1")
        spec = self.url + ("#" + "&".join(frag) if frag else "")
        if "name" in self.model_fields_set and self.name != spec:
            raise ValueError("name does not apply to kind: http (the url names the policy)")
        object.__setattr__(self, "name", spec)  # frozen model: set once, while validating
        return self


def _unknown(loc: tuple[int | str, ...], value: Any, known: Iterable[str]) -> InitErrorDetails:
    """An unknown key of `policy:` or of a section, worded as every other model's (the
    scenario's error formatter cannot see the sections' fields to suggest one)."""
    near = closest_field(str(loc[-1]), known)
    hint = f"; did you mean {near!r}?" if near is not None else ""
    return InitErrorDetails(
        type=PydanticCustomError("unknown_field", f"unknown field{hint}"), loc=loc, input=value
    )


class PlannerConfig(StrictModel):
    """Grid of the planner's threshold search (Eqs. 7-8)."""

    threshold_step: Tokens = 100.0


EVIDENCE: dict[str, str | tuple[str, ...]] = {
    "SloConfig.decode_tokens_per_s": (
        "tests/scenario/test_prepare_fields.py::test_decode_speed_slo_sets_the_decode_batch",
        "tests/metrics/test_slo_fields.py::test_ttft_and_decode_speed_set_what_counts_as_good",
    ),
    "SloConfig.ttft": (
        "tests/metrics/test_slo_fields.py::test_ttft_and_decode_speed_set_what_counts_as_good"
    ),
    "SloConfig.e2e": ("tests/metrics/test_bench.py::test_goodput_e2e_bound_and_tpot_tolerance"),
    "SloConfig.tpot_tolerance": (
        "tests/metrics/test_bench.py::test_goodput_e2e_bound_and_tpot_tolerance"
    ),
    "PolicyConfig.name": ("tests/scenario/test_prepare_fields.py::test_policy_name_and_threshold"),
    "PolicyConfig.threshold": (
        "tests/scenario/test_prepare_fields.py::test_policy_name_and_threshold"
    ),
    "PolicyConfig.short_term": (
        "tests/scenario/test_runner_specs.py::"
        "test_the_router_gets_policy_threshold_cache_and_scheduler"
    ),
    "PolicyConfig.long_term": (
        "tests/scenario/test_runner_specs.py::"
        "test_the_long_term_loop_makes_pd_instances_with_its_switch_time"
    ),
    "PolicyConfig.kind": (
        "tests/policy/test_policy_http.py::test_scenario_kind_http_names_the_policy_by_its_url"
    ),
    "PolicyConfig.url": (
        "tests/policy/test_policy_http.py::test_scenario_kind_http_names_the_policy_by_its_url",
        "tests/policy/test_policy_faults.py::test_a_scenario_owns_its_scheduler_on_the_sim",
    ),
    "PolicyConfig.timeout": (
        "tests/policy/test_policy_http.py::test_scenario_kind_http_names_the_policy_by_its_url",
        "tests/policy/test_policy_http.py::test_a_slow_service_falls_back_within_the_timeout",
    ),
    "PolicyConfig.fallback": (
        "tests/policy/test_policy_http.py::test_scenario_kind_http_names_the_policy_by_its_url",
        "tests/policy/test_policy_http.py::test_a_policy_url_is_a_policy_with_its_fallbacks_facts",
    ),
    "PolicyConfig.command": (
        "tests/policy/test_policy_faults.py::test_a_scenario_owns_its_scheduler_on_the_sim",
        "tests/chaos/test_byos.py::test_killing_the_scheduler_loses_nothing",
    ),
    "PolicyConfig.debug_validate": (
        "tests/policy/test_policy_faults.py::test_debug_validate_checks_answers_against_the_schemas"
    ),
    "PlannerConfig.threshold_step": (
        "tests/scenario/test_prepare_fields.py::test_threshold_step_is_the_planners_grid"
    ),
    "ShortTermConfig.interval": (
        "tests/scheduler/test_knobs.py::test_the_short_term_loop_hands_its_knobs_to_the_controllers"
    ),
    "ShortTermConfig.replan_change": (
        "tests/scheduler/test_knobs.py::"
        "test_the_short_term_loop_hands_its_knobs_to_the_controllers",
        "tests/scheduler/test_knobs.py::"
        "test_replan_change_is_how_far_the_bandwidth_moves_before_a_replan",
    ),
    "ShortTermConfig.min_t_change": (
        "tests/scheduler/test_knobs.py::"
        "test_the_short_term_loop_hands_its_knobs_to_the_controllers",
        "tests/scheduler/test_knobs.py::test_min_t_change_is_the_smallest_new_threshold_adopted",
    ),
    "ShortTermConfig.cooldown": (
        "tests/scheduler/test_knobs.py::"
        "test_the_short_term_loop_hands_its_knobs_to_the_controllers",
        "tests/scheduler/test_knobs.py::test_cooldown_holds_the_threshold_after_a_change",
    ),
    "ShortTermConfig.scarce_utilisation": (
        "tests/scheduler/test_knobs.py::"
        "test_the_short_term_loop_hands_its_knobs_to_the_controllers",
        "tests/scheduler/test_knobs.py::"
        "test_scarce_utilisation_is_the_egress_share_that_counts_as_scarce",
    ),
    "ShortTermConfig.queue_balance": (
        "tests/scheduler/test_knobs.py::"
        "test_the_short_term_loop_hands_its_knobs_to_the_controllers",
        "tests/scheduler/test_longterm.py::"
        "test_queue_balance_leans_away_from_the_backlogged_route_and_decays",
    ),
    "ShortTermConfig.balance_margin": (
        "tests/scheduler/test_knobs.py::"
        "test_the_short_term_loop_hands_its_knobs_to_the_controllers",
        "tests/scheduler/test_knobs.py::test_balance_margin_step_and_max_bias",
    ),
    "ShortTermConfig.balance_step": (
        "tests/scheduler/test_knobs.py::"
        "test_the_short_term_loop_hands_its_knobs_to_the_controllers",
        "tests/scheduler/test_knobs.py::test_balance_margin_step_and_max_bias",
    ),
    "ShortTermConfig.max_bias": (
        "tests/scheduler/test_knobs.py::"
        "test_the_short_term_loop_hands_its_knobs_to_the_controllers",
        "tests/scheduler/test_knobs.py::test_balance_margin_step_and_max_bias",
    ),
    "LongTermConfig.interval": (
        "tests/scheduler/test_knobs.py::test_the_long_term_loop_hands_its_knobs_to_the_controller"
    ),
    "LongTermConfig.window": (
        "tests/scheduler/test_knobs.py::"
        "test_window_and_min_samples_pick_the_lengths_the_planner_sees"
    ),
    "LongTermConfig.min_samples": (
        "tests/scheduler/test_knobs.py::"
        "test_window_and_min_samples_pick_the_lengths_the_planner_sees"
    ),
    "LongTermConfig.min_gain": (
        "tests/scheduler/test_knobs.py::test_the_long_term_loop_hands_its_knobs_to_the_controller",
        "tests/scheduler/test_knobs.py::test_min_gain_sustain_and_pressure_gate_a_conversion",
    ),
    "LongTermConfig.sustain": (
        "tests/scheduler/test_knobs.py::test_the_long_term_loop_hands_its_knobs_to_the_controller",
        "tests/scheduler/test_knobs.py::test_min_gain_sustain_and_pressure_gate_a_conversion",
    ),
    "LongTermConfig.pressure": (
        "tests/scheduler/test_knobs.py::test_the_long_term_loop_hands_its_knobs_to_the_controller",
        "tests/scheduler/test_knobs.py::test_min_gain_sustain_and_pressure_gate_a_conversion",
    ),
    "LongTermConfig.role_switch": (
        "tests/scheduler/test_knobs.py::test_role_switch_is_the_time_each_conversion_is_given",
        "tests/scenario/test_runner_specs.py::"
        "test_the_long_term_loop_makes_pd_instances_with_its_switch_time",
    ),
    "LongTermConfig.predrain": (
        "tests/scheduler/test_knobs.py::test_the_long_term_loop_hands_its_knobs_to_the_controller",
        "tests/scheduler/test_longterm_predrain.py::"
        "test_draining_starts_predrain_checks_before_the_conversion",
    ),
    "LongTermConfig.drain_timeout": (
        "tests/scheduler/test_loops.py::test_a_drain_that_never_empties_times_out_without_switching"
    ),
}
"""Evidence that each field of this module's models changes what the testbed does: the tests
(`path::function`) that show it, read by tests/test_no_silent_fields.py (a field without a
row here or there fails it)."""
