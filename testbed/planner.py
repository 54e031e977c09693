"""The paper's analytic throughput model (Eqs. 3-6) and its grid search (Eqs. 7-8).

This is the reference every live run is compared against, and the scheduler re-runs it at run
time with measured capacity and bandwidth, so it is a pure function of its inputs:

    Theta_prfaas = min(N_prfaas / T_prefill_prfaas(l_long), B_out / S_kv(l_long))
    Theta_pdp    = N_p / T_prefill_local(l_short)
    Theta_pdd    = N_d x BS_max / (T_decode x L_out)
    Lambda_max   = min(Theta_prfaas / p, Theta_pdp / (1 - p), Theta_pdd)

For `prfaas-pd` the search walks a grid of thresholds t and every PD split N_p + N_d = N_local,
keeping the largest Lambda_max (ties go to the t where the two prefill stages balance, the
paper's optimality condition). `homogeneous` is the same with p = 0 on one cluster; `naive` puts
all prefill on PrfaaS (p = 1) and all decode locally.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Protocol

import numpy as np

from testbed.config import DeploymentConfig, PlannerConfig, SloConfig, WorkloadConfig
from testbed.config.limits import MAX_THRESHOLDS, FieldError
from testbed.planner_grid import first_best, grid_size, pair_grid, split_grid, threshold_grid
from testbed.profiles import HARDWARE, MODELS, ModelProfile
from testbed.workload.build import length_distribution
from testbed.workload.lengths import EmpiricalLengths, LengthDistribution

__all__ = [
    "PlanInputs",
    "SplitSearch",
    "StagePlan",
    "plan_deployment",
    "plan_inputs",
    "stage_throughputs",
]


@dataclass(frozen=True)
class PlanInputs:
    """What the model needs besides the deployment: workload shape, SLO and link capacity."""

    lengths: LengthDistribution
    output_tokens: float
    tpot_slo_s: float
    threshold_step: float = 100.0


class Planned(Protocol):
    """What the model reads of a scenario (testbed.scenario.schema.Scenario has it)."""

    @property
    def workload(self) -> WorkloadConfig: ...

    @property
    def slo(self) -> SloConfig: ...

    @property
    def planner(self) -> PlannerConfig: ...


def plan_inputs(scenario: Planned) -> PlanInputs:
    """A scenario's workload shape and SLO as the model's inputs; a threshold grid larger than
    MAX_THRESHOLDS is refused here, when the scenario is planned (a trace's lengths are known
    only once it is read), naming the field to change."""
    inputs = PlanInputs(
        lengths=length_distribution(scenario.workload.lengths),
        output_tokens=scenario.workload.output_tokens,
        tpot_slo_s=scenario.slo.tpot,
        threshold_step=scenario.planner.threshold_step,
    )
    n = grid_size(inputs.lengths, inputs.threshold_step)
    if n > MAX_THRESHOLDS:
        lo, hi = inputs.lengths.bounds
        least = math.ceil((hi - lo) / (MAX_THRESHOLDS - 2))
        raise FieldError(
            "planner.threshold_step",
            f"{inputs.threshold_step:g} tokens over the prompt lengths {lo:g} to {hi:g} "
            f"(workload.lengths) makes {n:,.0f} thresholds to search, above the planner's "
            f"{MAX_THRESHOLDS:,}: raise it to at least {least:,} tokens",
        )
    return inputs


@dataclass(frozen=True)
class StagePlan:
    """One operating point of a deployment. Rates in requests/s, lengths in tokens."""

    deployment: str
    lambda_max_rps: float
    n_prfaas: int
    n_prefill: int
    n_decode: int
    threshold_tokens: float | None
    offload_fraction: float
    l_long_tokens: float
    l_short_tokens: float
    theta_prfaas_rps: float | None
    """None where the deployment has no such stage (homogeneous has no PrfaaS, naive no PD-P)."""
    theta_pdp_rps: float | None
    theta_pdd_rps: float
    egress_gbps: float
    link_gbps: float
    bs_max: int
    t_decode_s: float
    bottleneck: str
    gpus: int = 0
    """Accelerators of the deployment (every instance, used or not), for per-GPU figures."""
    link_utilisation: float = 0.0
    """Egress at lambda_max over the link's bandwidth (0 without a link)."""
    link_max_rps: float | None = None
    """The highest arrival rate whose offloaded KV the link still carries at this threshold
    (link bandwidth / (offload fraction x S_kv(l_long))); None when nothing crosses it."""

    @property
    def lambda_max_per_gpu(self) -> float:
        return self.lambda_max_rps / self.gpus if self.gpus else 0.0

    def to_json(self) -> dict[str, float | int | str | None]:
        out = asdict(self)
        del out["deployment"]
        return out


LINK_TIE = 0.01
"""A link-held PrfaaS stage within 1% of lambda_max is named the bottleneck: the threshold search
ties the stages, so the strict minimum is often another stage a hair below the link's rate."""


def stage_throughputs(
    model: ModelProfile,
    *,
    prfaas_hw: str | None,
    local_hw: str,
    n_prfaas: int,
    n_prefill: int,
    n_decode: int,
    link_bytes_per_s: float,
    p: float,
    l_long: float,
    l_short: float,
    output_tokens: float,
    tpot_slo_s: float,
) -> tuple[float, float, float, float]:
    """(Theta_prfaas, Theta_pdp, Theta_pdd, Lambda_max) of Eqs. 3-6 for one operating point."""
    if n_prfaas > 0 and prfaas_hw is not None and p > 0:
        compute = _per(n_prfaas, model.prefill_time(prfaas_hw, l_long))
        network = _per(link_bytes_per_s, model.kv_bytes(l_long))
        theta_prfaas = min(compute, network)
    else:
        theta_prfaas = 0.0
    theta_pdp = (
        _per(n_prefill, model.prefill_time(local_hw, l_short)) if p < 1 and n_prefill else 0.0
    )
    decode = model.decode[local_hw]
    bs_max = decode.bs_max(tpot_slo_s)
    t_decode = decode.step_time(bs_max)
    theta_pdd = n_decode * bs_max / (t_decode * output_tokens)
    lam = min(
        theta_prfaas / p if p > 0 else math.inf,
        theta_pdp / (1 - p) if p < 1 else math.inf,
        theta_pdd,
    )
    return theta_prfaas, theta_pdp, theta_pdd, lam


def _per(amount: float, cost: float) -> float:
    """amount / cost, a rate: infinite when the cost is none (a profile whose prefill time or
    KV size extrapolates to zero at a short length), never a ZeroDivisionError."""
    return amount / cost if cost > 0 else math.inf


Key = tuple[float, float]
"""(round(Lambda_max, 9), -imbalance): the search keeps the first pair with the largest."""
Stages = tuple[float, float, float, float]
"""(Theta_prfaas, Theta_pdp, Theta_pdd, Lambda_max) of one pair."""


@dataclass(frozen=True)
class _Search:
    """What every (threshold, split) pair of one search shares, and the two ways to evaluate
    pairs: `point` runs the scalar code on one pair (the reference, and how the winner's plan is
    built); `grid` evaluates every pair at once with numpy (testbed.planner_grid)."""

    model: ModelProfile
    prfaas_hw: str | None
    local_hw: str
    n_prfaas: int
    link: float
    output_tokens: float
    tpot_slo_s: float
    bs_max: int
    t_decode: float

    def point(
        self, p: float, l_long: float, l_short: float, n_p: int, n_d: int
    ) -> tuple[Key, tuple[float, float, float, float]]:
        """The pair's key and its stage throughputs (`stage_throughputs`)."""
        stages = stage_throughputs(
            self.model,
            prfaas_hw=self.prfaas_hw,
            local_hw=self.local_hw,
            n_prfaas=self.n_prfaas,
            n_prefill=n_p,
            n_decode=n_d,
            link_bytes_per_s=self.link,
            p=p,
            l_long=l_long,
            l_short=l_short,
            output_tokens=self.output_tokens,
            tpot_slo_s=self.tpot_slo_s,
        )
        th_pf, th_pdp, _, lam = stages
        rates = (th_pf / p if p > 0 else math.inf, th_pdp / (1 - p) if p < 1 else math.inf)
        finite = [v for v in rates if math.isfinite(v)]
        imbalance = abs(finite[0] - finite[1]) if len(finite) == 2 else 0.0
        return (round(lam, 9), -imbalance), stages

    def plan(
        self,
        name: str,
        deployment: DeploymentConfig,
        stages: tuple[float, float, float, float],
        t: float,
        p: float,
        l_long: float,
        l_short: float,
        n_p: int,
        n_d: int,
        gpus: int = 0,
    ) -> StagePlan:
        """The operating point of one pair, from its stage throughputs."""
        model, link, prfaas_hw, n_prfaas = self.model, self.link, self.prfaas_hw, self.n_prfaas
        th_pf, th_pdp, th_pdd, lam = stages
        stage_rates = {
            "prfaas": th_pf / p if p > 0 else math.inf,
            "pd-p": th_pdp / (1 - p) if p < 1 else math.inf,
            "pd-d": th_pdd,
        }
        egress = lam * p * model.kv_bytes(l_long) * 8 / 1e9 if p > 0 else 0.0
        link_bound = (
            p > 0
            and n_prfaas > 0
            and prfaas_hw is not None
            and _per(link, model.kv_bytes(l_long))
            < _per(n_prfaas, model.prefill_time(prfaas_hw, l_long))
        )
        bottleneck = min(stage_rates, key=lambda k: stage_rates[k])
        if link_bound and stage_rates["prfaas"] <= lam * (1 + LINK_TIE):
            bottleneck = "link"  # the link holds the PrfaaS stage at (or within a hair of) lam
        link_gbps = link * 8 / 1e9 if deployment.prfaas else 0.0
        return StagePlan(
            deployment=name,
            lambda_max_rps=lam,
            n_prfaas=n_prfaas if p > 0 else 0,
            n_prefill=n_p,
            n_decode=n_d,
            threshold_tokens=float(t) if deployment.kind == "prfaas-pd" else None,
            offload_fraction=p,
            l_long_tokens=l_long,
            l_short_tokens=l_short,
            theta_prfaas_rps=th_pf if deployment.kind != "homogeneous" else None,
            theta_pdp_rps=th_pdp if deployment.kind != "naive" else None,
            theta_pdd_rps=th_pdd,
            egress_gbps=egress,
            link_gbps=link_gbps,
            bs_max=self.bs_max,
            t_decode_s=self.t_decode,
            bottleneck=bottleneck,
            link_utilisation=egress / link_gbps if link_gbps else 0.0,
            link_max_rps=_per(link, p * model.kv_bytes(l_long)) if p > 0 and link_gbps else None,
            gpus=gpus,
        )

    def grid(
        self, p: np.ndarray, l_long: np.ndarray, l_short: np.ndarray, splits: list[tuple[int, int]]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Lambda_max and the stage imbalance of every pair (thresholds x splits), computed at
        once with the same IEEE operations as `point`, so the same floats (planner_grid)."""
        n_p = np.array([sp[0] for sp in splits], dtype=np.int64)
        n_d = np.array([sp[1] for sp in splits], dtype=np.int64)
        pdd = n_d * self.bs_max / (self.t_decode * self.output_tokens)
        return pair_grid(
            self.model, self.prfaas_hw, self.local_hw, self.n_prfaas, self.link, pdd,
            p, l_long, l_short, n_p,
        )  # fmt: skip


def plan_deployment(
    name: str,
    deployment: DeploymentConfig,
    inputs: PlanInputs,
    *,
    link_bytes_per_s: float | None = None,
    n_prefill: int | None = None,
    threshold_tokens: float | None = None,
    exhaustive: bool = False,
) -> StagePlan:
    """Best operating point of one deployment.

    `link_bytes_per_s` overrides the configured link bandwidth (the scheduler passes what it
    measures); `n_prefill` pins the PD split instead of searching it (the long-term loop owns it);
    `threshold_tokens` fixes t instead of searching it (what a fixed-threshold policy runs).
    The bottleneck is `link` when the PrfaaS stage is held back by the link rather than by its
    prefill compute and it is within LINK_TIE of lambda_max: the search then balanced the other
    stages against the link (a dense model's t is pushed up until its KV fits).
    `exhaustive` evaluates every pair with the scalar code (the reference the fast search is
    tested against: tests/test_planner_search.py); the result is the same.
    """
    return SplitSearch(
        name, deployment, inputs, link_bytes_per_s=link_bytes_per_s, n_prefill=n_prefill,
        threshold_tokens=threshold_tokens, exhaustive=exhaustive,
    ).plan()  # fmt: skip


class SplitSearch:
    """One search (`plan_deployment`'s arguments), asked for its best plan over all of its
    splits or with the split pinned to one of them: the long-term loop asks for both with the
    same inputs at every check (the free target, then the running split), and here they share
    one grid. `plan(n)` is `plan_deployment(..., n_prefill=n)` exactly (the same pairs in the
    same order, the column of the same arrays)."""

    def __init__(
        self,
        name: str,
        deployment: DeploymentConfig,
        inputs: PlanInputs,
        *,
        link_bytes_per_s: float | None = None,
        n_prefill: int | None = None,
        threshold_tokens: float | None = None,
        exhaustive: bool = False,
    ) -> None:
        self.args = (name, deployment, inputs, link_bytes_per_s, threshold_tokens, exhaustive)
        model = MODELS[deployment.model]
        link = deployment.link.bandwidth if link_bytes_per_s is None else link_bytes_per_s
        n_local = deployment.local.instances
        if deployment.kind == "naive":
            self.splits = [(0, n_local)]
            thresholds = np.array([-math.inf])
        else:
            fixed = n_prefill if n_prefill is not None else deployment.local.pinned_prefill
            lo = 1 if fixed is None else fixed
            hi = n_local - 1 if fixed is None else fixed
            self.splits = [(n_p, n_local - n_p) for n_p in range(lo, hi + 1)]
            if deployment.kind == "homogeneous":
                thresholds = np.array([math.inf])
            elif threshold_tokens is not None:
                thresholds = np.array([float(threshold_tokens)])
            else:
                thresholds = threshold_grid(inputs.lengths, inputs.threshold_step)
        self.thresholds = thresholds
        decode = model.decode[deployment.local.hardware]
        bs_max = decode.bs_max(inputs.tpot_slo_s)
        prfaas = deployment.prfaas
        self.ctx = _Search(
            model, prfaas.hardware if prfaas else None, deployment.local.hardware,
            prfaas.instances if prfaas else 0, link, inputs.output_tokens, inputs.tpot_slo_s,
            bs_max, decode.step_time(bs_max),
        )  # fmt: skip
        self._grid: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        gpus = deployment.local.instances * HARDWARE[deployment.local.hardware].gpus
        if prfaas is not None:
            gpus += prfaas.instances * HARDWARE[prfaas.hardware].gpus
        self.gpus = gpus

    def _point(self, t: float) -> tuple[float, float, float]:
        """(p, l_long, l_short) at threshold t; +-inf: homogeneous (none offloaded) or naive."""
        lengths = self.args[2].lengths
        if math.isinf(t):
            mean = lengths.mean()
            return (1.0, mean, 0.0) if t < 0 else (0.0, 0.0, mean)
        return lengths.split(t)

    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(thresholds, Lambda_max, imbalance) of the grid, computed once."""
        if self._grid is None:
            thresholds = self.thresholds
            lengths = self.args[2].lengths
            if math.isinf(thresholds[0]):
                ps, l_longs, l_shorts = (np.array([x]) for x in self._point(thresholds[0]))
            elif isinstance(lengths, EmpiricalLengths) and len(thresholds) > 1:
                # Thresholds of equal rank (no length between them) split the workload alike,
                # so their pairs are equal and only the first can be the first best one: one
                # threshold per rank is kept before any pair is computed (what the value
                # comparison of the other branch keeps, found before splitting: a 30 s
                # window's grid is a tenth the size).
                k = lengths.ranks(thresholds)
                first = np.empty(len(k), dtype=bool)
                first[0] = True
                np.not_equal(k[1:], k[:-1], out=first[1:])
                if not first.all():
                    thresholds, k = thresholds[first], k[first]
                ps, l_longs, l_shorts = lengths.split_ranks(k)
            else:
                ps, l_longs, l_shorts = split_grid(lengths, thresholds)
                if len(self.splits) > 1 and len(ps) > 1:
                    # Neighbouring thresholds with no length between them split the workload
                    # alike: their pairs are equal, and only the first of them can be the
                    # first best one (with one split, dropping them costs more than it saves).
                    first = np.ones(len(ps), dtype=bool)
                    first[1:] = (ps[1:] != ps[:-1]) | (l_longs[1:] != l_longs[:-1])
                    first[1:] |= l_shorts[1:] != l_shorts[:-1]
                    if not first.all():
                        thresholds = thresholds[first]
                        ps, l_longs, l_shorts = ps[first], l_longs[first], l_shorts[first]
            self._grid = (thresholds, *self.ctx.grid(ps, l_longs, l_shorts, self.splits))
        return self._grid

    def plan(self, n_prefill: int | None = None) -> StagePlan:
        """The best plan over every split of this search (None), or over its split of
        `n_prefill` PD-P instances (one it does not have is planned afresh)."""
        name, deployment, inputs, link, threshold_tokens, exhaustive = self.args
        columns = range(len(self.splits))
        if n_prefill is not None:
            columns = range(0)
            for j, (n_p, _) in enumerate(self.splits):
                if n_p == n_prefill:
                    columns = range(j, j + 1)
            if not columns:
                return SplitSearch(
                    name, deployment, inputs, link_bytes_per_s=link, n_prefill=n_prefill,
                    threshold_tokens=threshold_tokens, exhaustive=exhaustive,
                ).plan()  # fmt: skip
        if exhaustive:
            pairs = [(float(t), self.splits[j]) for t in self.thresholds for j in columns]
        else:
            thresholds, lam, imbalance = self._arrays()
            if len(columns) == len(self.splits):
                k, j = divmod(first_best(lam.ravel(), imbalance.ravel()), len(self.splits))
            else:
                j = columns[0]
                k = first_best(lam[:, j], imbalance[:, j])
            pairs = [(float(thresholds[k]), self.splits[j])]
        ctx = self.ctx
        best: tuple[Key, float, tuple[float, float, float], tuple[int, int], Stages] | None = None
        for t, split in pairs:
            point = self._point(t)
            key, stages = ctx.point(*point, *split)
            if best is not None and key <= best[0]:
                continue
            best = (key, t, point, split, stages)
        assert best is not None
        _, t, point, split, stages = best
        return ctx.plan(name, deployment, stages, t, *point, *split, self.gpus)
