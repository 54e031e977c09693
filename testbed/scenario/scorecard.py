"""`testbed scorecard`: one policy against its baselines over the whole scenario library.

Every library scenario (or the ones asked for) runs for the policy under test and for each
baseline with the same seeds; per scenario the scorecard keeps each one's mean figures over the
seeds (testbed.metrics.scorecard: checker verdicts, goodput at the SLO, SLO attainment, TTFT
percentiles, failures, cross-datacenter bytes, who decided the routes), the policy's deltas
against each baseline with a win / tie / loss verdict and the criterion that decided it, or
`not judged` where the policy's fallback decided more than the bound allows
(testbed.metrics.verdict), and on the sim a reference row: the best fixed threshold in hindsight
(testbed.scenario.hindsight) for the scenario's objective (P90 TTFT over the fault window when
the scenario has faults, else goodput at the SLO).

On the sim every run (policies, baselines and the hindsight grid of all scenarios) is one cell
of a single `testbed sweep` pool (testbed.scenario.sweep.run_grid), longest first, and runs that
cannot have changed come from a cache (`cache_key`). On `local` each scenario runs in its short
version (testbed.scenario.short, the one the chaos suite runs: a tiny deployment at time_scale
20), one run at a time, since live runs share the machine's cores and ports.

The policy spec is passed through as `testbed run --policy` takes it (a built-in name,
`module:Class`, an entry point), resolved once before any run: a spec that cannot load stops
the scorecard with one line. A scenario the substrate refuses for a policy (the real model on
the sim, a policy for another kind of deployment) is skipped and named with the reason.
`testbed scorecard --router` (testbed.scenario.scorecard_router) runs its live rows here too.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.checkers.policy_share import DEFAULT_MIN_SHARE
from testbed.errors import UserError
from testbed.metrics.files import atomic_write
from testbed.metrics.scorecard import compare, mean_rows
from testbed.metrics.verdict import NOT_JUDGED
from testbed.policy import get_policy
from testbed.policy.decider import describe
from testbed.scenario.hindsight import (
    HindsightPlan,
    Objective,
    measure_sim,
    plan_hindsight,
    plan_row,
    run_fixed,
)
from testbed.scenario.library import LIBRARY_DIR, library_scenarios, resolve_scenario
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.schema import Scenario, load_scenario
from testbed.scenario.short import short_variant
from testbed.scenario.sweep import Cell, cell_scenario, run_grid
from testbed.substrates import substrate_facts, substrates_with

__all__ = [
    "DEFAULT_BASELINES",
    "SCORECARD_SUBSTRATES",
    "Entry",
    "ScoreCell",
    "build_card",
    "check_seeds",
    "cpu_seconds",
    "run_local",
    "run_scorecard",
    "scenario_objective",
]

DEFAULT_BASELINES = ("prfaas", "prfaas-static")
SCORECARD_SUBSTRATES = substrates_with(lambda s: s.scorecard)
"""Where a scorecard runs (testbed.substrates): on a virtual-time one every scenario whole, on
a live one each scenario's short version (testbed.scenario.short)."""
HINDSIGHT = "hindsight-best"
"""The reference row's label."""
COSTLY = 6.0
"""How much longer a run with a re-planning policy takes on the sim than a prfaas-static one
(its short-term loop and snapshots; measured on the library), to start the long runs first."""

# ------------------------------------------------------------------------------ the runs


@dataclass(frozen=True)
class ScoreCell(Cell):
    """One run of a scorecard on the sim: a sweep cell (the scenario file and the seed written
    into it) with the policy spec to run it with, and the row it belongs to."""

    policy: str | None = None
    label: str = ""
    cost: float = 1.0
    """A relative estimate of its run time (to start the long runs first)."""


def run_score_cell(cell: Cell) -> dict[str, Any]:
    """The sweep cell function of a scorecard: a policy's run, or a hindsight setting's."""
    assert isinstance(cell, ScoreCell)
    if cell.label == HINDSIGHT:
        row = run_fixed(cell)
    else:
        _, row, _ = measure_sim(cell_scenario(cell), cell.policy, cell.max_requests)
    row["scenario"] = Path(cell.scenario_path).stem
    row["label"] = cell.label
    return row


def scenario_objective(sc: Scenario) -> Objective:
    """The scenario's own objective: P90 TTFT over its faults when it has any, else goodput."""
    return "ttft-p90-fault" if sc.nemesis else "goodput"


@dataclass
class Entry:
    """One scenario of a scorecard: the scenario its rows run (live: its short version), and
    for a row label that runs another scenario (an external router in front: the router
    scorecard, testbed.scenario.scorecard_router) that scenario and the policy it runs with."""

    name: str
    path: Path
    scenario: Scenario
    objective: Objective
    requests: int
    hindsight: HindsightPlan | None = None
    note: str | None = None
    variants: dict[str, tuple[Scenario, str]] = field(default_factory=dict)


def _scenario_paths(names: Sequence[str] | None) -> list[Path]:
    if not names:
        return library_scenarios()
    return [resolve_scenario(n) for n in names]


def run_scorecard(
    policy: str,
    *,
    baselines: Sequence[str] = DEFAULT_BASELINES,
    substrate: str = "sim",
    scenarios: Sequence[str] | None = None,
    seeds: Sequence[int] = (1, 2, 3),
    hindsight: bool | None = None,
    jobs: int | None = None,
    out: Path | None = None,
    log: Callable[[str], None] | None = None,
    cache: Path | None = None,
    min_policy_share: float = DEFAULT_MIN_SHARE,
    max_requests: int | None = None,
) -> dict[str, Any]:
    """Run the scorecard and return it as a JSON-ready dict (testbed.metrics.scorecard writes
    it). `log` gets one line per finished run (the CLI prints them on stderr). With `cache` (a
    directory), sim runs that cannot have changed are read from it (see `cache_key`). A
    scenario where the policy decided less than `min_policy_share` of the routes itself (over
    every seed) is not judged (testbed.metrics.verdict). `max_requests` caps the requests each
    run plans (None: the default cap; a scenario over it is skipped with the reason)."""
    started = time.perf_counter()
    cpu0 = cpu_seconds()
    say = log or (lambda _line: None)
    if substrate not in SCORECARD_SUBSTRATES:
        raise UserError(
            f"scorecard substrate {substrate!r}: use one of {', '.join(SCORECARD_SUBSTRATES)}"
        )
    check_seeds(seeds, min_policy_share)
    for spec in (policy, *baselines):
        get_policy(spec)  # a spec that cannot load: one line, before any run
    bases = [b for b in dict.fromkeys(baselines) if b != policy]
    specs = [policy, *bases]
    facts = substrate_facts(substrate)
    use_hindsight = facts.hindsight if hindsight is None else hindsight
    if use_hindsight and not facts.hindsight:
        raise UserError("--hindsight runs on the sim substrate only (it sweeps a whole grid)")
    skipped: dict[str, str] = {}
    entries: list[Entry] = []
    for path in _scenario_paths(scenarios):
        sc = load_scenario(path)
        if not facts.virtual_time:  # live: at time_scale 1, the short version
            sc = short_variant(sc)
        n_requests = 0
        try:
            for spec in specs:
                opts = RunOptions(
                    substrate=substrate, policy=spec, progress=False, max_requests=max_requests
                )
                rp = prepare_run(sc, opts)
                n_requests = max(n_requests, len(rp.requests))
        except UserError as exc:
            skipped[path.stem] = f"{spec}: {exc}"
            say(f"scorecard: skip {path.stem}: {spec}: {exc}")
            continue
        entry = Entry(path.stem, path, sc, scenario_objective(sc), n_requests)
        if use_hindsight:
            try:
                entry.hindsight = plan_hindsight(
                    path, seeds, entry.objective, sweep_split=False, max_requests=max_requests
                )
            except UserError as exc:
                entry.note = f"no hindsight row: {exc}"
        entries.append(entry)
    if not entries:
        raise UserError("no scenario to run: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()))
    if facts.virtual_time:
        rows, cached = _run_sim(entries, specs, seeds, jobs, say, cache, max_requests)
    else:
        rows, cached = run_local(entries, specs, seeds, out, say, max_requests), 0
    card = build_card(policy, bases, substrate, seeds, entries, rows, skipped, min_policy_share)
    card["cached_runs"] = cached
    card["wall_s"] = time.perf_counter() - started
    card["cpu_s"] = cpu_seconds() - cpu0
    return card


def check_seeds(seeds: Sequence[int], min_policy_share: float) -> None:
    """The seeds and the share bound every scorecard takes, or one line (UserError)."""
    if not seeds:
        raise UserError("a scorecard needs at least one seed")
    if not 0 <= min_policy_share <= 1:
        raise UserError(f"--min-policy-share: a fraction from 0 to 1, got {min_policy_share:g}")
    if len(set(seeds)) != len(seeds):
        raise UserError("--seeds: a seed given twice")


def cpu_seconds() -> float:
    """CPU seconds of this process and its finished children (the pool's workers): what the
    runs cost whatever else shares the cores, next to the wall time they took."""
    import resource

    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


@functools.cache
def _code_digest() -> bytes:
    """A digest of every file of the package (code, library, profiles, traces): a cached run is
    only reused by the same testbed."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.digest()


def _builtin(spec: str) -> bool:
    """A policy of this package, by its name (module:Class and entry points are outside code,
    whatever they load; the registry marks a built-in loaded by module:Class as a plugin)."""
    return ":" not in spec and get_policy(spec).__module__.startswith("testbed.policy.")


def cache_key(cell: ScoreCell) -> str | None:
    """Where a run's row is kept between scorecards: the testbed's own files, the library
    scenario and the cell's settings, policy and row label decide it, so a cached row is the
    row the run would give again (the sim is deterministic). None (never cached): a scenario
    outside the library (its files, a trace or a profile, are not in the digest) and an outside
    policy (its code is not either)."""
    path = Path(cell.scenario_path).resolve()
    if not path.is_relative_to(LIBRARY_DIR):
        return None
    if cell.policy is not None and not _builtin(cell.policy):
        return None
    what = [str(path.relative_to(LIBRARY_DIR)), list(cell.settings), cell.policy, cell.label]
    h = hashlib.sha256(_code_digest())
    h.update(json.dumps(what).encode())
    return h.hexdigest()[:32]


def _run_sim(
    entries: Sequence[Entry],
    specs: Sequence[str],
    seeds: Sequence[int],
    jobs: int | None,
    say: Callable[[str], None],
    cache: Path | None,
    max_requests: int | None = None,
) -> tuple[list[dict[str, Any]], int]:
    todo: list[ScoreCell] = []
    for e in entries:
        for spec in specs:
            cost = e.requests * (1.0 if spec == "prfaas-static" else COSTLY)
            for seed in seeds:
                todo.append(
                    ScoreCell(
                        str(e.path),
                        (("seed", str(seed)),),
                        False,
                        spec,
                        spec,
                        cost,
                        max_requests=max_requests,
                    )
                )
        if e.hindsight is not None:
            todo += [
                ScoreCell(
                    c.scenario_path,
                    c.settings,
                    False,
                    None,
                    HINDSIGHT,
                    float(e.requests),
                    max_requests=max_requests,
                )
                for c in e.hindsight.cells
            ]
    rows: list[dict[str, Any]] = []
    keys: dict[int, str] = {}
    if cache is not None:
        left = []
        for cell in todo:
            key = cache_key(cell)
            hit = cache / f"{key}.json" if key is not None else None
            if hit is not None and hit.is_file():
                rows.append(json.loads(hit.read_text()))
                continue
            if key is not None:
                keys[id(cell)] = key
            left.append(cell)
        if rows:
            say(f"scorecard: {len(rows)} runs read from the cache {cache}/")
        todo = left
    if not todo:
        return rows, len(rows)
    todo.sort(key=lambda c: -c.cost)  # the long runs first, so no core idles at the end
    n_jobs = jobs or min(len(todo), os.cpu_count() or 1)
    say(f"scorecard: {len(todo)} runs on the sim, {n_jobs} local process(es)")

    def show(i: int, row: dict[str, Any]) -> None:
        t = f" t={row['threshold_tokens']:.0f}" if row["label"] == HINDSIGHT else ""
        p90 = row["ttft_p90_s"]
        who = describe(row["label"])
        say(
            f"[{i + 1}/{len(todo)}] {row['scenario']} {who}{t} seed {row['seed']}: "
            f"SLO {row['slo_attainment'] or 0:.1%}, goodput {row['goodput_rps']:.2f} req/s, "
            f"TTFT p90 {p90 if p90 is not None else float('nan'):.2f}s, failed {row['failed']}"
        )

    done = [0]

    def progress(i: int, row: dict[str, Any]) -> None:
        show(done[0], row)
        done[0] += 1
        key = keys.get(id(todo[i]))
        if cache is not None and key is not None:
            cache.mkdir(parents=True, exist_ok=True)
            atomic_write(cache / f"{key}.json", json.dumps(row))

    ran = run_grid(todo, jobs=n_jobs, on_row=progress, fn=run_score_cell)
    return rows + ran, len(rows)


def run_local(
    entries: Sequence[Entry],
    specs: Sequence[str],
    seeds: Sequence[int],
    out: Path | None,
    say: Callable[[str], None],
    max_requests: int | None = None,
    drain_timeout_s: float = 60.0,
) -> list[dict[str, Any]]:
    """Live short runs, one at a time (each writes its own results under out/runs/). A label
    with a variant (`Entry.variants`) runs that scenario with its policy, with the external
    router in front when the scenario has one (testbed.scenario.external_run)."""
    from testbed.checkers.result import CheckResult
    from testbed.scenario.runner import run_scenario

    base = (out or Path("results/scorecard")) / "runs"
    rows: list[dict[str, Any]] = []
    total = len(entries) * len(specs) * len(seeds)
    for e in entries:
        for spec in specs:
            sc, policy = e.variants.get(spec, (e.scenario, spec))
            for seed in seeds:
                run_dir = base / f"{e.name}-{spec.replace(':', '_').replace('/', '_')}-{seed}"
                opts = RunOptions(
                    out_dir=run_dir,
                    progress=False,
                    policy=policy,
                    seed=seed,
                    drain_timeout_s=drain_timeout_s,
                    max_requests=max_requests,
                )
                rp = prepare_run(sc, opts)
                if sc.router is not None:
                    from testbed.scenario.external_run import run_external

                    result = asyncio.run(run_external(rp, opts))
                else:
                    result = asyncio.run(run_scenario(rp, opts))
                checks: list[CheckResult] = list(result.checks)
                row = plan_row(rp, result.records, result.history, checks)
                row.update(
                    {
                        "scenario": e.name,
                        "label": spec,
                        "policy": rp.policy,
                        "seed": seed,
                        "threshold_tokens": rp.threshold_tokens,
                        "n_prefill": rp.n_prefill,
                        "n_decode": rp.n_decode,
                        "offered_rps": rp.rate_rps,
                        "results": str(run_dir),
                    }
                )
                rows.append(row)
                say(
                    f"[{len(rows)}/{total}] {e.name} {describe(spec)} seed {seed}: SLO "
                    f"{row['slo_attainment'] or 0:.1%}, failed {row['failed']}, "
                    f"checks {'ok' if result.ok else 'FAILED'}"
                )
    return rows


def build_card(
    policy: str,
    bases: Sequence[str],
    substrate: str,
    seeds: Sequence[int],
    entries: Sequence[Entry],
    rows: Sequence[dict[str, Any]],
    skipped: dict[str, str],
    min_share: float = DEFAULT_MIN_SHARE,
) -> dict[str, Any]:
    scenarios: list[dict[str, Any]] = []
    tallies: dict[str, dict[str, Any]] = {
        b: {"win": 0, "tie": 0, "loss": 0, "not_judged": 0, "scenarios": 0, "deltas": []}
        for b in [*bases, HINDSIGHT]
    }
    for e in entries:
        mine = [r for r in rows if r["scenario"] == e.name]
        table: dict[str, dict[str, Any]] = {}
        for spec in (policy, *bases):
            runs = sorted((r for r in mine if r["label"] == spec), key=lambda r: r["seed"])
            table[spec] = mean_rows(runs)
        hindsight: dict[str, Any] | None = None
        note = e.note
        if e.hindsight is not None:
            hr = e.hindsight.result([r for r in mine if r["label"] == HINDSIGHT])
            best = hr.best
            table[HINDSIGHT] = best
            hindsight = {
                "objective": hr.objective,
                "threshold_tokens": best["threshold_tokens"],
                "n_prefill": best["n_prefill"],
                "n_decode": best["n_decode"],
                "thresholds": [s["threshold_tokens"] for s in hr.settings],
            }
            note = (
                f"{HINDSIGHT}: prfaas-static at a fixed threshold of "
                f"{best['threshold_tokens']:.0f} tokens ({best['n_prefill']} PD-P / "
                f"{best['n_decode']} PD-D), the best of {len(hr.settings)} thresholds by "
                f"{hr.objective} (fault window {hr.window_s[0]:.0f}-{hr.window_s[1]:.0f} s)"
            )
        mine_row = table[policy]
        against = {b: compare(mine_row, table[b], min_share=min_share) for b in bases}
        if HINDSIGHT in table:  # judged by the objective its setting was chosen by
            against[HINDSIGHT] = compare(mine_row, table[HINDSIGHT], e.objective,
                                         min_share=min_share)  # fmt: skip
        for b, cmp in against.items():
            t = tallies[b]
            t[cmp["verdict"].replace(" ", "_")] += 1
            t["scenarios"] += 1
            if cmp["verdict"] != NOT_JUDGED:  # the mean is over what the policy decided
                t["deltas"].append(cmp["deltas"]["slo_attainment"])
        share = mine_row.get("policy_share")
        scenarios.append(
            {
                "name": e.name,
                "objective": e.objective,
                "rows": table,
                "against": against,
                "policy_share": None if share is None else {**share, "min": min_share},
                "judged": not any(c["verdict"] == NOT_JUDGED for c in against.values()),
                "hindsight": hindsight,
                "note": note,
            }
        )
    overall: dict[str, dict[str, Any]] = {}
    for b, t in tallies.items():
        if not t["scenarios"]:
            continue
        ds = [d for d in t.pop("deltas") if d is not None]
        t["mean_slo_attainment_delta"] = sum(ds) / len(ds) if ds else None
        overall[b] = t
    return {
        "policy": policy,
        "baselines": list(bases),
        "substrate": substrate,
        "seeds": list(seeds),
        "min_policy_share": min_share,
        "runs": len(rows),
        "scenarios": scenarios,
        "skipped": skipped,
        "overall": overall,
        "rows": list(rows),
    }
