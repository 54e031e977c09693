"""The grid bench/predict.py, bench/predict_live.py and bench/predict_variants.py share: the
library scenarios `prfaas-predict` is measured on, as `--set` settings through
`testbed.experiment` (one validated path, issue #37), each run's measure, and the
mean (min-max) formatting of their tables. A helper, not a bench: it runs nothing by itself."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from provenance import provenance  # bench/provenance.py: the script's directory is on sys.path

from testbed.experiment import (
    Grid,
    Row,
    Run,
    Setting,
    Substrate,
    completion_rate,
    headline,
    run_experiment,
    settings_of,
    steady_window,
    ttft_p90,
)
from testbed.experiment.grid import Value
from testbed.scenario.hindsight import default_thresholds
from testbed.scenario.library import LIBRARY_DIR
from testbed.scenario.plan import prepare_run
from testbed.scenario.schema import Scenario, load_scenario
from testbed.scenario.sweep import sim_options

POLICIES: dict[str, tuple[str, dict[str, Any]]] = {
    "prfaas-predict": ("prfaas-predict", {}),
    "predict, no triage": ("prfaas-predict", {"ttft_target": None}),
    "prfaas": ("prfaas", {}),
    "prfaas-static": ("prfaas-static", {}),
}
"""Row label -> (policy, `policy.predict` overrides)."""
DYNAMIC = (
    "burst",
    "diurnal",
    "link-flap",
    "jitter",
    "bandwidth-drop",
    "traffic-shift",
    "cache-skew",
    "mooncake-trace",
)
SPLITS = (3, 4, 5)
"""PD-P counts (of the 8 local instances) the drop is run on by split: 3 is the planner's."""


def settings_for(
    name: str, *, policy: str, seed_offset: int, load: float | None = None,
    threshold: float | None = None, duration: float | None = None,
    arrivals: dict[str, Any] | None = None, prefill: int | None = None,
    knobs: dict[str, Any] | None = None, checkers: bool = False,
) -> tuple[Setting, ...]:  # fmt: skip
    """The `--set` settings of library scenario `name` with `policy` (a row label of POLICIES,
    or a policy name with `knobs`, its `policy.predict` settings); `prefill` pins the PD-P
    count of its deployments (None: the planner's split). The checkers are dropped unless
    `checkers`: these runs are measured, not judged."""
    base = load_scenario(LIBRARY_DIR / f"{name}.yaml")
    if knobs is None:
        policy, knobs = POLICIES.get(policy, (policy, {}))
    values: dict[str, Value] = {"seed": base.seed + seed_offset, "policy.name": policy}
    values.update({f"policy.predict.{k}": v for k, v in knobs.items()})
    if threshold is not None:
        values["policy.threshold"] = f"{threshold:.0f}"
    if load is not None:
        values["workload.arrivals.load"] = load
    values.update({f"workload.arrivals.{k}": v for k, v in (arrivals or {}).items()})
    if duration is not None:
        values["duration"] = f"{duration:g}s"
    if prefill is not None:
        values.update({f"deployments.{d}.local.prefill": prefill for d in base.deployments})
    if not checkers:
        values["checkers"] = []
    return settings_of(values)


def scenario_for(name: str, **kw: Any) -> Scenario:
    """Library scenario `name` with `settings_for(name, **kw)` written in, validated as `--set`."""
    return Grid(name).scenario_of(settings_for(name, **kw))


def planner_point(name: str, load: float) -> tuple[float, float]:
    """The arrival rate `load` means with the planner's own t (a fixed-t run keeps it: with
    `load`, a worse t would lower lambda_max and with it the offered rate), and that t."""
    sc = scenario_for(name, policy="prfaas-static", seed_offset=0, load=load)
    rp = prepare_run(sc, sim_options())
    assert rp.rate_rps is not None and rp.threshold_tokens is not None
    return float(rp.rate_rps), float(rp.threshold_tokens)


def planned(name: str, load: float) -> tuple[float, list[float]]:
    """`planner_point`'s rate, and the fixed thresholds `testbed hindsight` tries around the
    planner's t (its grid: one grid, issue #37)."""
    rate, t = planner_point(name, load)
    return rate, default_thresholds(t)


def rate_for(name: str, load: float) -> float:
    return planned(name, load)[0]


Job = tuple[dict[str, Any], tuple[Setting, ...]]
Measure = Callable[[Run], dict[str, Any]]
"""What a row says about its run (policy label, seed, ...) and the run's `--set` settings."""


def run_jobs(
    name: str, jobs: Sequence[Job], measure: Measure, n_jobs: int, substrate: Substrate = "sim"
) -> list[dict[str, Any]]:
    """Every job on library scenario `name` (testbed.experiment; on the sim `n_jobs` processes,
    live one run at a time): each row the job's labels and the measure's figures, in job
    order. A live run's labels and time go to stderr as it ends: they take minutes each."""
    if not jobs:
        return []
    grid = Grid(name, cases=tuple(settings for _, settings in jobs), substrate=substrate)
    t0 = time.monotonic()

    def progress(i: int, _row: Row[dict[str, Any]]) -> None:
        if substrate != "sim":
            done = f"{time.monotonic() - t0:.0f} s"
            print(f"{name} {i + 1}/{len(jobs)} {jobs[i][0]} ({done})", file=sys.stderr)

    rows = run_experiment(grid, measure, jobs=n_jobs, checkers=False, on_row=progress)
    return [{**labels, **row.value} for (labels, _), row in zip(jobs, rows, strict=True)]


def drop_job(
    policy: str, seed: int, threshold: float | None, rate: float, prefill: int | None = None,
    knobs: dict[str, Any] | None = None,
) -> Job:  # fmt: skip
    """The drop at the offered `rate` under `policy` (a fixed `threshold`, a pinned split)."""
    labels = {"policy": policy, "seed": seed, "threshold": threshold, "prefill": prefill}
    return labels, settings_for(
        "bandwidth-drop", policy="prfaas-predict" if knobs is not None else policy,
        seed_offset=seed, threshold=threshold, arrivals={"load": None, "rate": rate},
        prefill=prefill, knobs=knobs,
    )  # fmt: skip


def drop_measure(run: Run) -> dict[str, Any]:
    """P90 TTFT of the requests arriving during the bandwidth fault and as long before it."""
    fault = next(e for e in run.scenario.nemesis if e.action == "bandwidth")
    assert fault.for_ is not None
    return {
        "p90_during_s": ttft_p90(run.records, fault.at, fault.at + fault.for_),
        "p90_before_s": ttft_p90(run.records, fault.at - fault.for_, fault.at),
        "failed": headline(run.summary)["failed"],
        "requests": len(run.records),
    }


def dynamic_job(name: str, policy: str, seed: int, knobs: dict[str, Any] | None = None) -> Job:
    labels = {"scenario": name, "policy": policy, "seed": seed}
    pol = "prfaas-predict" if knobs is not None else policy
    return labels, settings_for(name, policy=pol, seed_offset=seed, load=1.0, knobs=knobs)


def dynamic_measure(run: Run) -> dict[str, Any]:
    h = headline(run.summary)
    return {
        "slo_attainment": h["slo_attainment"],
        "p90_ttft_s": h["ttft_p90_s"],
        "failed": h["failed"],
        "requests": len(run.records),
    }


def dynamic_rows(jobs: Sequence[Job], n_jobs: int) -> list[dict[str, Any]]:
    """`jobs` over the dynamic scenarios, one experiment per scenario, rows in job order."""
    rows: dict[int, dict[str, Any]] = {}
    for name in DYNAMIC:
        idx = [i for i, (labels, _) in enumerate(jobs) if labels["scenario"] == name]
        done = run_jobs(name, [jobs[i] for i in idx], dynamic_measure, n_jobs)
        rows.update(zip(idx, done, strict=True))
    return [rows[i] for i in range(len(jobs))]


def saturation_job(
    policy: str, seed: int, duration: float, knobs: dict[str, Any] | None = None
) -> Job:
    """The steady paper workload, uniform arrivals at 120% of lambda_max, for `duration`."""
    pol = "prfaas-predict" if knobs is not None else policy
    return {"policy": policy, "seed": seed}, settings_for(
        "paper", policy=pol, seed_offset=seed, load=1.2, duration=duration,
        arrivals={"process": "uniform"}, knobs=knobs,
    )  # fmt: skip


def saturation_measure(run: Run) -> dict[str, Any]:
    return {
        "rate_rps": completion_rate(run.records, *steady_window(run.duration_s)),
        "p90_ttft_s": headline(run.summary)["ttft_p90_s"],
        "planner_rps": run.plan.plan.lambda_max_rps,
    }


def shift_measure(run: Run) -> dict[str, Any]:
    """traffic-shift: when the new split is in force, the longest drain, and the completion
    rate over its throughput checker's window."""
    check = next(c for c in run.scenario.checkers if c.check == "throughput")
    after, until = getattr(check, "after", None), getattr(check, "until", None)
    assert after is not None and until is not None
    splits = [e.t for e in run.history if e.kind == "split"]
    drains = [e.data.get("drain_s", 0.0) for e in run.history if e.kind == "switched"]
    return {
        "split_at": splits[0] if splits else None,
        "max_drain_s": max(drains) if drains else None,
        "rate_rps": completion_rate(run.records, after, until),
    }


def shift_job(predrain: int, seed: int) -> Job:
    """traffic-shift with prfaas-predict, draining ahead (predrain) or not; its checkers kept
    (the throughput window)."""
    settings = settings_for(
        "traffic-shift", policy="prfaas-predict", seed_offset=seed, checkers=True
    )
    return {"predrain": predrain, "seed": seed}, (
        *settings,
        ("policy.long_term.predrain", str(predrain)),
    )


def spread(rows: list[dict[str, Any]], key: str) -> tuple[float, float, float] | None:
    vals = [r[key] for r in rows if r[key] is not None]
    if not vals:
        return None
    return statistics.fmean(vals), min(vals), max(vals)


def fmt_spread(m: tuple[float, float, float] | None, spec: str, unit: str = "") -> str:
    if m is None:
        return "-"
    return f"{m[0]:{spec}}{unit} ({m[1]:{spec}}-{m[2]:{spec}})"


def baselines(rows: list[dict[str, Any]], name: str) -> tuple[float, float]:
    """The better SLO attainment and the lower P90 TTFT of prfaas and prfaas-static on
    scenario `name` (means over the seeds of the dynamic table's `rows`)."""
    means = {
        p: [statistics.fmean(r[key] for r in rows if r["scenario"] == name and r["policy"] == p)
            for key in ("slo_attainment", "p90_ttft_s")]
        for p in ("prfaas", "prfaas-static")
    }  # fmt: skip
    return max(m[0] for m in means.values()), min(m[1] for m in means.values())


def write_report(
    report: Path, script: str, load_before: tuple[float, ...], seeds: int, jobs: int,
    out: list[str],
) -> None:  # fmt: skip
    """`out` (a title line, then the tables) into `report` with the provenance header of
    `script` under the title: the sim predict benches' reports read alike."""
    setup = f"sim; seeds: each scenario's seed + 0..{seeds - 1}; {jobs} jobs"
    head = provenance(script, sys.argv[1:], load_before, setup)
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(out[0] + "\n" + head + "\n" + "\n".join(out[1:]))
