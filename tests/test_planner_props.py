"""Property tests: the planner's vectorised search is the exhaustive search, on any input.

`plan_deployment` finds the best (threshold, PD split) pair with numpy (testbed.planner_grid)
and builds the plan of that pair alone with the scalar code; `exhaustive=True` runs the scalar
code on every pair. Ties are the hard part: with the split free, every threshold whose pairs are
bound by PD-D has the same Lambda_max, and only the stage imbalance (then the order) decides.
These draw deployments (models, sizes, links from a trickle to plenty), empirical lengths like
the long-term loop's observed window (with repeated lengths, single lengths, huge spreads),
pinned splits and fixed thresholds, and require the two plans to be equal field for field; and
the array helpers the search uses (`split_many`, `Curve.many`, `kv_bytes_many`,
`prefill_time_many`, and testbed.planner_grid's table-driven ones the search now uses) to equal
their scalar counterparts bit for bit.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testbed.config import DeploymentConfig
from testbed.planner import PlanInputs, SplitSearch, plan_deployment
from testbed.planner_grid import curve_many, kv_bytes_many, prefill_time_many
from testbed.profiles import MODELS
from testbed.workload.lengths import (
    EmpiricalLengths,
    FixedLength,
    TruncatedLognormal,
    split_many,
)

SETTINGS = settings(
    max_examples=100,
    deadline=None,
    # generating a deployment validates it (pydantic): slow on a loaded machine, not wrong
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

BUILT_IN = ("internal-1t-hybrid", "kimi-linear-48b", "minimax-m2.5")
"""The shipped models, named: other tests register theirs in the same registry (MODELS), with
other hardware, and a draw must not depend on which tests ran first."""

lengths_lists = st.one_of(
    st.lists(st.integers(1, 200_000), min_size=1, max_size=200),
    # few distinct lengths, many repeats: the observed window of a trace with shared prompts
    st.lists(st.sampled_from([512, 2048, 8192, 32_768, 131_072]), min_size=1, max_size=60),
)


@st.composite
def deployments(draw: st.DrawFn) -> DeploymentConfig:
    kind = draw(st.sampled_from(["prfaas-pd", "prfaas-pd", "prfaas-pd", "homogeneous", "naive"]))
    local = {"hardware": "h20x8", "instances": draw(st.integers(2, 40))}
    spec: dict[str, object] = {
        "kind": kind,
        "model": draw(st.sampled_from(BUILT_IN)),
        "local": local,
    }
    if kind != "homogeneous":
        spec["prfaas"] = {"hardware": "h200x8", "instances": draw(st.integers(1, 16))}
        spec["link"] = {"bandwidth": f"{draw(st.sampled_from([0.5, 5, 25, 100, 400, 3200]))}Gbps"}
    return DeploymentConfig.model_validate(spec)


@SETTINGS
@given(
    dep=deployments(),
    lengths=lengths_lists,
    step=st.sampled_from([250.0, 1000.0, 7777.0]),
    output_tokens=st.sampled_from([64.0, 149.0, 1024.0]),
    tpot=st.sampled_from([0.025, 0.05, 0.2]),
    link_scale=st.sampled_from([None, 0.01, 0.3, 1.0, 7.0]),
    pin=st.one_of(st.none(), st.integers(1, 39)),
    fixed_t=st.one_of(st.none(), st.floats(0, 250_000)),
)
def test_fast_search_is_the_exhaustive_search(
    dep: DeploymentConfig,
    lengths: list[int],
    step: float,
    output_tokens: float,
    tpot: float,
    link_scale: float | None,
    pin: int | None,
    fixed_t: float | None,
) -> None:
    inputs = PlanInputs(EmpiricalLengths.of(lengths), output_tokens, tpot, step)
    kw: dict[str, object] = {}
    if link_scale is not None:
        kw["link_bytes_per_s"] = dep.link.bandwidth * link_scale
    if pin is not None and dep.kind != "naive":
        kw["n_prefill"] = min(pin, dep.local.instances - 1)
    if fixed_t is not None and dep.kind == "prfaas-pd":
        kw["threshold_tokens"] = fixed_t
    fast = plan_deployment("d", dep, inputs, **kw)  # type: ignore[arg-type]
    ref = plan_deployment("d", dep, inputs, exhaustive=True, **kw)  # type: ignore[arg-type]
    assert fast == ref


@SETTINGS
@given(dep=deployments(), tokens=st.sampled_from([100.0, 4096.0, 50_000.0]))
def test_fixed_and_lognormal_lengths(dep: DeploymentConfig, tokens: float) -> None:
    """The distributions without their own split_many go threshold by threshold."""
    for lengths in (FixedLength(tokens), TruncatedLognormal(9.9, 1.0, 128.0, 131_072.0)):
        inputs = PlanInputs(lengths, 1024.0, 0.025, 1000.0)
        fast = plan_deployment("d", dep, inputs)
        assert fast == plan_deployment("d", dep, inputs, exhaustive=True)


@SETTINGS
@given(
    lengths=lengths_lists,
    ts=st.lists(st.floats(-10.0, 300_000.0), min_size=1, max_size=50),
)
def test_split_many_is_split(lengths: list[int], ts: list[float]) -> None:
    dist = EmpiricalLengths.of(lengths)
    p, l_long, l_short = split_many(dist, np.array(ts))
    ranks = dist.ranks(np.array(ts))
    for i, t in enumerate(ts):
        assert (float(p[i]), float(l_long[i]), float(l_short[i])) == dist.split(t)
        # the planner keeps one threshold per rank: the rank is how many lengths are <= t
        assert int(ranks[i]) == sum(1 for x in lengths if x <= t)


@SETTINGS
@given(xs=st.lists(st.floats(-1e6, 1e7, allow_nan=False), min_size=1, max_size=50))
def test_array_profiles_are_the_scalar_profiles(xs: list[float]) -> None:
    arr = np.array(xs)
    for model in (MODELS[name] for name in BUILT_IN):
        kv = model.kv_bytes_many(arr)
        assert [float(v) for v in kv] == [model.kv_bytes(x) for x in xs]
        for hw in model.prefill:
            pf = model.prefill_time_many(hw, arr)
            assert [float(v) for v in pf] == [model.prefill_time(hw, x) for x in xs]


@SETTINGS
@given(
    dep=deployments(),
    lengths=lengths_lists,
    step=st.sampled_from([250.0, 1000.0]),
    link_scale=st.sampled_from([None, 0.01, 1.0]),
    asks=st.lists(st.one_of(st.none(), st.integers(0, 41)), min_size=1, max_size=4),
)
def test_one_search_answers_every_split(
    dep: DeploymentConfig,
    lengths: list[int],
    step: float,
    link_scale: float | None,
    asks: list[int | None],
) -> None:
    """What the long-term loop asks at a check (the free split, then pinned ones) from one
    SplitSearch is what separate searches answer, whatever the order of the questions."""
    inputs = PlanInputs(EmpiricalLengths.of(lengths), 149.0, 0.025, step)
    link = None if link_scale is None else dep.link.bandwidth * link_scale
    search = SplitSearch("d", dep, inputs, link_bytes_per_s=link)
    for n in asks:
        assert search.plan(n) == plan_deployment(
            "d", dep, inputs, link_bytes_per_s=link, n_prefill=n
        )


@SETTINGS
@given(xs=st.lists(st.floats(-1e6, 1e7, allow_nan=False), min_size=1, max_size=50))
def test_table_curves_are_the_scalar_curves(xs: list[float]) -> None:
    """The search's curves (lookup tables built once per curve) are `Curve.__call__` and the
    model's scalar profiles, element for element."""
    arr = np.array(xs)
    for model in (MODELS[name] for name in BUILT_IN):
        assert [float(v) for v in curve_many(model.kv_bytes_curve, arr)] == [
            model.kv_bytes_curve(x) for x in xs
        ]
        assert [float(v) for v in kv_bytes_many(model, arr)] == [model.kv_bytes(x) for x in xs]
        for hw in model.prefill:
            pf = prefill_time_many(model, hw, arr)
            assert [float(v) for v in pf] == [model.prefill_time(hw, x) for x in xs]


def test_a_remembered_lognormal_grid_plans_as_a_fresh_one() -> None:
    """The scalar-only log-normal's splits are remembered per grid: the second search over the
    same distribution (the short-term loop's first re-plan after the run's plan) reads them
    and plans what the exhaustive search plans, pinned or free."""
    dep = DeploymentConfig.model_validate({
        "kind": "prfaas-pd", "model": "internal-1t-hybrid",
        "prfaas": {"hardware": "h200x8", "instances": 4},
        "local": {"hardware": "h20x8", "instances": 8}, "link": {"bandwidth": "100Gbps"},
    })  # fmt: skip
    inputs = PlanInputs(TruncatedLognormal(9.9, 1.0, 128.0, 128_000.0), 1024.0, 0.025, 100.0)
    first = plan_deployment("d", dep, inputs)
    for kw in ({}, {"n_prefill": 3}, {"link_bytes_per_s": 1e9}):
        again = plan_deployment("d", dep, inputs, **kw)
        assert again == plan_deployment("d", dep, inputs, exhaustive=True, **kw)
    assert first == plan_deployment("d", dep, inputs)
