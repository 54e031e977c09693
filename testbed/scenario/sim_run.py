"""Run a prepared scenario on the `sim` substrate (testbed.sim) and write its results with the
same pipeline as a live run (testbed.scenario.results): requests.jsonl, history.jsonl,
summary.json (with `substrate: sim` and the wall timings), report.md, timeline.png.
"""

from __future__ import annotations

import time

from testbed.clock import Scale
from testbed.metrics.files import write_jsonl_atomic
from testbed.metrics.stream import RecordStream
from testbed.policy.http import HttpSpec, SchedulerProcess, is_http_spec
from testbed.scenario.plan import RunOptions, RunPlan, RunResult
from testbed.scenario.results import write_results
from testbed.sim import SimInputs, simulate

__all__ = ["run_sim", "sim_inputs"]


def sim_inputs(rp: RunPlan, opts: RunOptions) -> SimInputs:
    """The parts of a run plan the sim reads."""
    sc = rp.scenario
    return SimInputs(
        deployment=rp.deployment,
        policy=rp.policy,
        threshold_tokens=rp.threshold_tokens,
        layout=rp.layout,
        requests=rp.requests,
        faults=rp.faults,
        seed=sc.seed,
        scale=Scale.of(sc.scale),
        tpot_slo_s=sc.slo.tpot,
        policy_config=sc.policy,
        drain_timeout_s=opts.drain_timeout_s,
    )


def run_sim(rp: RunPlan, opts: RunOptions, started: float | None = None) -> RunResult:
    """Simulate one prepared scenario and write its results to `opts.out_dir`.

    `started` is the perf_counter reading when the command began (for `wall.total_s`)."""
    begun = time.perf_counter() if started is None else started
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    owned = rp.scenario.policy.command if rp.policy == rp.scenario.policy.name else None
    process = None
    if owned is not None and is_http_spec(rp.policy):  # the scenario owns the scheduler
        process = SchedulerProcess(owned, HttpSpec.parse(rp.policy).url, opts.out_dir)
        process.start()
    try:
        t0 = time.perf_counter()
        # requests.jsonl written as records finish; the summary reads their table
        out = simulate(sim_inputs(rp, opts), RecordStream(opts.out_dir / "requests.jsonl"))
        simulate_s = time.perf_counter() - t0
    finally:
        if process is not None:
            process.stop()
    history = out.run_history
    assert out.table is not None and history is not None
    write_jsonl_atomic(opts.out_dir / "history.jsonl", history.docs())
    return write_results(
        rp,
        opts,
        out.submitted,
        out.table,
        history,
        out.notes,
        False,
        simulate_s=simulate_s,
        started=begun,
    )
