"""`testbed scorecard --router PRESET[:POLICY]`: an external router against our policies.

The router (vllm-router, SGLang's gateway: testbed.scenario.external_router) is the row under
test, labelled `PRESET:POLICY` (`sglang-router:cache_aware`); the baselines are our built-in
policies. Every row runs live on the same fleet, with the same seeds, at the same time_scale and
for the same duration, through the local scorecard's runs and card
(testbed.scenario.scorecard: `run_local`, `build_card`), so the files and verdicts are the
scorecard's.

What a run is: the library scenario's short version (testbed.scenario.short: 2 PrfaaS + 1
PD-P + 3 PD-D) at **time_scale 1**, since a router's timers (health checks, retries) are
wall-clock, and for a bounded real-world `duration` (default DEFAULT_DURATION_S) instead of the
scenario's 180-240 s, so the default scorecard (ROUTER_SCENARIOS, one seed, two baselines: 12
runs) stays within about a quarter of an hour. The nemesis timeline is **scaled into that
duration** (`fit_timeline`: every fault's start and length times duration / the scenario's
duration), so each fault keeps its place in the run; the checkers' own bounds (`within`, a
TTFT) are not scaled. The router's row runs the planner's static PD split (policy
prfaas-static, whose router stays idle: the external router decides every route); the
baselines run their own policy on that fleet.

Who decided: our policy decides nothing behind an external router, and the router has no
fallback, so its row counts every request as decided by the policy under test (`policy_share`
1.0, marked `by: router`): its scenarios are always judged, on the router's own figures.

Before any run the command prints the expected wall time (`estimate_text`): the runs times
(duration / time_scale + RUN_OVERHEAD_S), and the bound if every drain ran to its limit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from testbed.checkers.policy_share import DEFAULT_MIN_SHARE
from testbed.config import ScaleConfig
from testbed.errors import UserError
from testbed.policy import get_policy
from testbed.scenario.library import resolve_scenario
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.schema import Scenario, load_scenario
from testbed.scenario.scorecard import (
    DEFAULT_BASELINES,
    Entry,
    build_card,
    check_seeds,
    cpu_seconds,
    run_local,
    scenario_objective,
)
from testbed.scenario.short import short_variant
from testbed.substrates import substrate_facts

__all__ = [
    "DEFAULT_DURATION_S",
    "DRAIN_S",
    "LEFT_OUT",
    "ROUTER_BASELINES",
    "ROUTER_SCENARIOS",
    "RUN_OVERHEAD_S",
    "estimate_text",
    "expected_wall_s",
    "fit_timeline",
    "router_decisions",
    "run_router_scorecard",
    "short_for_router",
]

ROUTER_SCENARIOS = ("burst", "prefill-crash", "partition", "bandwidth-drop")
"""The default scenarios, what a static-split router in front of the fleet meets: bursty
arrivals, prefill instances killed and paused, the link cut, the link narrowed."""
LEFT_OUT: dict[str, str] = {
    "real-model": "the torch engine: its first token travels through our router",
    "thesis": "three deployments compared side by side, a sweep rather than one fleet",
    "paper": "compares three kinds of deployment; its prfaas-pd fleet is burst's",
    "traffic-shift": "600 s, judged by the long-term loop's role switching (static split here)",
    "mooncake-trace": "judged on our prefix cache, which is off behind an external router",
    "cache-skew": "judged on our prefix cache, which is off behind an external router",
    "decode-crash": "a decode kill: not in the default four (prefill-crash covers a kill)",
    "link-flap": "not in the default four (partition covers a cut link)",
    "jitter": "not in the default four",
    "diurnal": "not in the default four (burst covers bursty arrivals)",
    "custom-profile": "a user profile's example, not a router's situation",
}
"""Library scenarios not in ROUTER_SCENARIOS and why (docs/scorecard.md); `--scenarios`
still runs any of them that an external router accepts."""
ROUTER_BASELINES = DEFAULT_BASELINES
"""Our policies the router is compared with by default: prfaas (adaptive) and prfaas-static
(the same static split and threshold rule the router's fleet runs)."""
DEFAULT_DURATION_S = 45.0
"""Real-world (= wall, at time_scale 1) seconds of arrivals per run."""
DRAIN_S = 120.0
"""Wall seconds a run waits for its requests in flight after the last arrival (as
bench/router_faults.py): a slow router's TTFT p90 reached 38 s there."""
RUN_OVERHEAD_S = 27.0
"""Wall seconds a run takes beyond its arrivals: the fleet's and the router's start-up, the drain
of the last requests, the checkers and the results. Measured: the mean over the default
scorecard's 12 runs with vllm-router (64-90 s each for 45 s of arrivals; docs/scorecard.md)."""
SCALE = ScaleConfig(time_scale=1, byte_scale=2000)
"""Every row's scale: time_scale 1 for the router's wall-clock timers, the short version's
byte_scale."""


def fit_timeline(sc: Scenario, duration_s: float) -> Scenario:
    """The scenario with its nemesis timeline scaled into `duration_s` when that is shorter
    than its own: each fault's `at` and `for` times duration_s / sc.duration, so a fault keeps
    its place in the run (partition's 60-100 s of 180 s becomes 15-25 s of 45 s)."""
    if duration_s >= sc.duration or not sc.nemesis:
        return sc
    f = duration_s / sc.duration
    nemesis = [
        ev.model_copy(update={"at": ev.at * f, "for_": None if ev.for_ is None else ev.for_ * f})
        for ev in sc.nemesis
    ]
    return sc.model_copy(update={"nemesis": nemesis})


def short_for_router(sc: Scenario, duration_s: float) -> Scenario:
    """What every row of the router scorecard runs: the short version at SCALE, `duration_s`
    of arrivals, the timeline scaled into it."""
    fitted = fit_timeline(sc, duration_s)
    return short_variant(fitted, scale=SCALE, duration=duration_s)


def expected_wall_s(runs: int, duration_s: float) -> tuple[float, float]:
    """(expected, bound) wall seconds of `runs` live runs of `duration_s` real-world seconds at
    time_scale 1 (SCALE: real-world seconds are wall seconds): each its arrivals plus
    RUN_OVERHEAD_S, or at most its arrivals, the overhead and DRAIN_S."""
    one = duration_s + RUN_OVERHEAD_S
    return runs * one, runs * (one + DRAIN_S)


def estimate_text(runs: int, duration_s: float) -> str:
    """The line printed before the first run."""
    expected, bound = expected_wall_s(runs, duration_s)
    return (
        f"scorecard: {runs} live runs of {duration_s:g} s at time_scale 1: expected wall time "
        f"~{expected / 60:.0f} min ({runs} x ({duration_s:g} s of arrivals + ~"
        f"{RUN_OVERHEAD_S:g} s of start-up, drain and results)); at most {bound / 60:.0f} min "
        f"if every drain runs to its {DRAIN_S:g} s bound"
    )


def _router(sc: Scenario, option: str) -> Scenario:
    """The scenario with `--router PRESET[:POLICY]` in front (testbed run --router's parsing:
    a bad preset or policy is one line)."""
    from testbed.scenario.external_run import with_router

    return with_router(sc, option, time_scale_set=True)


def _preflight(router_sc: Scenario, base_sc: Scenario, bases: Sequence[str]) -> int:
    """Every refusal before any run: the external run's own (an engine, a shaper it does not
    run with), then each baseline's plan. Returns the most requests a row plans."""
    from testbed.scenario.external_run import ExternalRun

    opts = RunOptions(policy="prfaas-static", progress=False)
    rp = prepare_run(router_sc, opts)
    ExternalRun(rp, opts)  # its constructor refuses what it cannot run: one line, no process
    n = len(rp.requests)
    for spec in bases:
        n = max(n, len(prepare_run(base_sc, RunOptions(policy=spec, progress=False)).requests))
    return n


def run_router_scorecard(
    router: str,
    *,
    baselines: Sequence[str] = ROUTER_BASELINES,
    substrate: str = "local",
    scenarios: Sequence[str] | None = None,
    seeds: Sequence[int] = (1,),
    duration_s: float = DEFAULT_DURATION_S,
    out: Path | None = None,
    log: Callable[[str], None] | None = None,
    min_policy_share: float = DEFAULT_MIN_SHARE,
    max_requests: int | None = None,
) -> dict[str, Any]:
    """The router scorecard (see the module's doc) as a JSON-ready dict, in the shape of
    testbed.scenario.scorecard.run_scorecard's. `log` gets the expected wall time before the
    first run, then a line per finished run."""
    started = time.perf_counter()
    cpu0 = cpu_seconds()
    say = log or (lambda _line: None)
    if not substrate_facts(substrate).external_router:
        raise UserError(
            f"--router: an external router runs on the local substrate only (not {substrate}); "
            "drop --substrate"
        )
    check_seeds(seeds, min_policy_share)
    if duration_s <= 0:
        raise UserError(f"--duration: must be greater than zero, got {duration_s:g}")
    for spec in baselines:
        get_policy(spec)  # a spec that cannot load: one line, before any run
    bases = list(dict.fromkeys(baselines))
    names = list(scenarios) if scenarios else list(ROUTER_SCENARIOS)
    label = ""
    skipped: dict[str, str] = {}
    entries: list[Entry] = []
    for name in names:
        path = resolve_scenario(name)
        sc = load_scenario(path)
        base_sc = short_for_router(sc, duration_s)
        router_sc = _router(base_sc, router)  # a bad --router stops here, before any run
        assert router_sc.router is not None
        label = f"{router_sc.router.preset}:{router_sc.router.policy}"
        try:
            n = _preflight(router_sc, base_sc, bases)
        except UserError as exc:
            skipped[path.stem] = str(exc)
            say(f"scorecard: skip {path.stem}: {exc}")
            continue
        note = _timeline_note(sc, base_sc, duration_s)
        entry = Entry(path.stem, path, base_sc, scenario_objective(base_sc), n, note=note)
        entry.variants[label] = (router_sc, "prfaas-static")
        entries.append(entry)
    if not entries:
        raise UserError("no scenario to run: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()))
    runs = len(entries) * (1 + len(bases)) * len(seeds)
    say(estimate_text(runs, duration_s))
    rows = run_local(entries, [label, *bases], seeds, out, say, max_requests, DRAIN_S)
    for row in rows:
        if row["label"] == label:
            row["policy"] = label
            row["decisions"] = router_decisions(row["requests"])
    card = build_card(label, bases, "local", seeds, entries, rows, skipped, min_policy_share)
    for sc_card in card["scenarios"]:
        if sc_card["policy_share"] is not None:
            sc_card["policy_share"]["by"] = "router"
    expected, _ = expected_wall_s(runs, duration_s)
    card["router"] = {
        "label": label,
        "duration_s": duration_s,
        "time_scale": SCALE.time_scale,
        "byte_scale": SCALE.byte_scale,
        "expected_wall_s": expected,
        "setup": (
            f"{label} in front of the short deployment (2 PrfaaS + 1 PD-P + 3 PD-D) against "
            f"{', '.join(bases)} on the same fleet, seeds and time_scale 1, {duration_s:g} s of "
            "arrivals a run, each scenario's faults scaled into it; the router decided every "
            "route of its row (our policy none, and a router has no fallback)"
        ),
    }
    card["cached_runs"] = 0
    card["wall_s"] = time.perf_counter() - started
    card["cpu_s"] = cpu_seconds() - cpu0
    return card


def router_decisions(requests: int) -> dict[str, Any]:
    """A router row's `decisions` (testbed.checkers.policy_share.Share.to_json's shape): the
    router decided every request it was sent, and has no fallback."""
    share = 1.0 if requests else None
    return {"policy": requests, "fallback": 0, "reasons": {}, "left_out": 0, "share": share}


def _timeline_note(sc: Scenario, short: Scenario, duration_s: float) -> str:
    """The scenario's note in scorecard.md: how its run differs from the library file."""
    what = f"{duration_s:g} s of arrivals at time_scale 1 on the short deployment"
    if duration_s >= sc.duration:
        return what
    if not sc.nemesis:
        return f"{what} (the scenario's first {duration_s:g} s of {sc.duration:g} s)"
    faults = ", ".join(
        f"{ev.action} {ev.at:.1f}" + (f"-{ev.end:.1f} s" if ev.end is not None else " s")
        for ev in short.nemesis
    )
    return f"{what}; the {sc.duration:g} s timeline scaled into it: {faults}"
