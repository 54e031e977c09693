"""What the scheduler aims for (the SLO) and its knobs: the policy, its loops, the planner."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from testbed.config.base import Duration, PositiveDuration, StrictModel, Tokens
from testbed.config.limits import DECODE_TOKENS_PER_S, within

__all__ = [
    "LongTermConfig",
    "PlannerConfig",
    "PolicyConfig",
    "PredictConfig",
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


class PredictConfig(StrictModel):
    """`prfaas-predict`'s knobs (testbed/policy/predict.py; defaults justified in
    docs/scheduler.md)."""

    link_headroom: float = Field(0.9, gt=0, le=1)
    """Share of the estimated bandwidth a new transfer is predicted to get."""
    backlog_s: PositiveDuration = 0.5
    """A link backlog this long at the delivered rate makes the delivered rate the prediction's
    bandwidth (the estimate lags a drop by seconds)."""
    count_queued_kv: bool = True
    """Count the KV of every request outstanding on PrfaaS as ahead on the link, not only the
    bytes already sent."""
    busy_weight: float = Field(0.0, ge=0)
    """Weight of the time an option keeps its resource busy (T_prefill on PD-P; the larger of
    T_prefill on PrfaaS and the KV's time on the link) added to the predicted first token:
    what a request costs the ones that arrive after it."""
    min_bandwidth_share: float = Field(0.05, ge=0, le=1)
    """Least share of the highest estimate seen that predictions believe in: a black hole's
    estimate falls to zero, yet it heals, and what waits for the link then crosses at once."""
    pull_prefixes: bool = True
    """Weigh pulling a prefix cached in PrfaaS before a PD-P prefill (abundant link only)."""
    ttft_target: PositiveDuration | None = 10.0
    """A request predicted to miss this on both options goes where it keeps a resource busy
    for less; None: always the earliest first token."""
    triage_slack: float | None = Field(None, ge=1)
    """... if its first token there is predicted at most this factor later than on the other
    (None: whatever the factor)."""
    triage_weight: float | None = Field(None, gt=0)
    """... or, with a weight k, where its predicted first token plus k x that share is least
    (while the link is not narrowed below half its nominal rate): a dial from SLO attainment
    and saturation throughput (None: the smaller share outright) towards P90 TTFT (small k);
    bench/reports/scheduler.md measures it."""
    local_reserve: float | None = Field(None, gt=0)
    """While PrfaaS is predicted to miss `ttft_target`, a request whose locally uncached tokens
    exceed this share of the threshold in force does not take PD-P: PD-P's on-time capacity
    goes to short prompts, as the paper's rule keeps them (None: no reserve). With
    `triage_weight` it keeps most of the SLO attainment the dial gives up on cache-skew
    (docs/scheduler.md, "The local reserve")."""
    recount_s: PositiveDuration = 1.0
    """Real-world seconds between sums of the PrfaaS queues' KV (an O(n) scan)."""
    busy_rate: Literal["nominal", "current"] = "nominal"
    """The link rate the PrfaaS option's busy share (triage, `busy_weight`) divides its KV by:
    the link's nominal rate (the highest estimate seen: a narrowed link's backlog clears at it
    once the link heals) or the current estimate (the rate the prediction uses)."""


class PolicyConfig(StrictModel):
    """The policy: a name (built-in, `module:Class`, entry point), or `kind: http`, a service
    answering the decision protocol (docs/policy-protocol.md). For `kind: http` the config
    writes `name` itself, as the URL with its settings in the fragment
    (`http://host:port/route#timeout=50ms&fallback=naive`): that one string is what every
    other part of the testbed (and `--policy`) calls the policy."""

    kind: Literal["python", "http"] = "python"
    name: str = "prfaas-static"
    threshold: Tokens | Literal["auto"] = "auto"
    short_term: ShortTermConfig = Field(default_factory=lambda: ShortTermConfig())
    long_term: LongTermConfig = Field(default_factory=lambda: LongTermConfig())
    predict: PredictConfig = Field(default_factory=lambda: PredictConfig())
    """Knobs of `prfaas-predict` (ignored by the other policies)."""
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


class PlannerConfig(StrictModel):
    """Grid of the planner's threshold search (Eqs. 7-8)."""

    threshold_step: Tokens = 100.0
