"""Write a run's results: records, summary, checks, report and timeline, in one place."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from testbed import __version__
from testbed.checkers import run_checkers
from testbed.clock import Scale
from testbed.engine.torch.reference import TorchReference
from testbed.metrics.bench import run_metadata
from testbed.metrics.files import atomic_write
from testbed.metrics.records import HistoryEvent, RequestRecord, write_jsonl
from testbed.metrics.report import write_report
from testbed.metrics.stream import RecordFile
from testbed.metrics.summary import summarize
from testbed.metrics.table import RecordTable
from testbed.metrics.timeline import draw_run
from testbed.scenario.plan import RunOptions, RunPlan, RunResult

__all__ = ["write_results"]


def write_results(
    rp: RunPlan,
    opts: RunOptions,
    submitted: list[str],
    records: list[RequestRecord] | RecordTable,
    history: Sequence[HistoryEvent],
    notes: list[str],
    interrupted: bool,
    *,
    simulate_s: float | None = None,
    started: float | None = None,
) -> RunResult:
    """Write every result file; `summary.wall` says where the wall time went: running the
    deployment (`simulate_s`, live or simulated), these results (`results_s`) and the whole
    command from `started` (a time.perf_counter reading) to the last file.

    `records` may be a `RecordTable` of records already written to requests.jsonl as they
    finished (the sim, testbed.metrics.stream): the summary and the timeline read the table, the
    checkers the file."""
    began = time.perf_counter()
    out: Path = opts.out_dir
    sc = rp.scenario
    checked: Sequence[RequestRecord]
    if isinstance(records, RecordTable):
        checked = records.records or RecordFile(out / "requests.jsonl", len(records))
    else:
        write_jsonl(out / "requests.jsonl", (r.to_json() for r in records))
        checked = records
    extra: dict[str, Any] = {
        "scenario": sc.name,
        "deployment": rp.deployment_name,
        "deployment_kind": rp.deployment.kind,
        "policy": rp.policy,
        "substrate": opts.substrate,
        "engine_kind": rp.deployment.engine,
        "seed": sc.seed,
        "offered_rps": rp.rate_rps,
        "interrupted": interrupted,
        "instances": {
            "prfaas": rp.deployment.prfaas.instances if rp.deployment.prfaas else 0,
            "prefill": rp.n_prefill,
            "decode": rp.n_decode,
        },
        "planner": {
            "lambda_max_rps": rp.plan.lambda_max_rps,
            "threshold_tokens": rp.plan.threshold_tokens,
            "n_prefill": rp.plan.n_prefill,
            "n_decode": rp.plan.n_decode,
        },
        "threshold_tokens": rp.threshold_tokens,
        "metadata": run_metadata(
            version=__version__,
            seed=sc.seed,
            scenario_json=sc.model_dump_json(),
            started_at=opts.started_at,
            argv=None,
        ),
    }
    if rp.calibration is not None:  # engine: torch: what this host computes, what k it allows
        extra["calibration"] = rp.calibration
    summary = summarize(
        records,
        history,
        duration_s=rp.duration_s,
        slo=sc.slo,
        scale=Scale.of(sc.scale),
        extra=extra,
        percentiles=opts.percentiles,
    )
    checks = run_checkers(
        checked,
        submitted,
        history=history,
        configs=sc.checkers,
        planned=None if interrupted else len(rp.requests),
        reference=(
            TorchReference(sc.seed, rp.deployment.tiny_model.seed, rp.deployment.tiny_model.dtype)
            if rp.deployment.engine == "torch"
            else None
        ),
        byte_scale=sc.scale.byte_scale,
    )
    summary["link"]["shaper"] = rp.deployment.link.shaper if rp.deployment.prfaas else None
    summary["checks"] = [c.to_json() for c in checks]
    if opts.timeline:
        draw_run(out, records, history, summary)
    else:  # `--no-timeline`: not an earlier run's picture beside this run's files
        (out / "timeline.png").unlink(missing_ok=True)
    end = time.perf_counter()
    summary["wall"] = {
        "simulate_s": simulate_s,
        "results_s": end - began,
        "total_s": end - started if started is not None else None,
    }
    atomic_write(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    write_report(out, sc.name, summary, checks, notes)
    # RunResult's records: any sequence of them (a RecordFile reads requests.jsonl back)
    return RunResult(
        out, cast(list[RequestRecord], checked), cast(list[HistoryEvent], history), summary,
        checks, interrupted, notes,
    )  # fmt: skip
