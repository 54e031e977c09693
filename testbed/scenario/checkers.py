"""Checkers: invariants every run must keep, judged from its request records alone.

They are the testbed's promises, checked after every run (faults or not) rather than trusted:

- nothing_lost: every submitted request ends exactly once, as completed or as failed with a
  reason. A request that vanishes under a fault is the bug this exists to catch.
- kv_accounted: every completed request received exactly the KV bytes its prefill emitted, all
  of them sent, and decode verified them; a short or padded transfer that still "completed"
  means the emulated transfer path is lying.
- no_unverified_decode: no request streamed a token before its KV was verified, including
  requests that later failed.

Scenario checkers (the `checkers:` list of a scenario, `testbed.config.CheckerConfig`) add:

- ttft / tpot / e2e: a percentile of completed requests stays under a bound.
- failures: at most a fraction of submitted requests failed (each with a reason).
- reroute: after a fault starts (a "fault" history event), the first request whose path avoids
  the faulty target starts prefill within `within`. For link faults the target is the link: a
  request avoids it by not crossing datacenters, and only requests the policy would offload
  (uncached length above the lowest threshold any request saw; all requests if none had one)
  count. For process faults a request avoids the target if neither its prefill nor its decode
  instance is one of the faulty instances.
- recover: after a fault ends, TTFT is back under `ttft` within `within`: the first request
  (by arrival, arriving after the end) that starts a run of `streak` consecutive completed
  requests within the bound arrives no later than `within` after the end.

- token_exact (`engine: torch` runs): every completed request's generated token ids equal a
  single-process generation of the same prompt, recomputed after the run.

And, when the runner passes the load generator's planned count, generator_count: every request
the generator planned was submitted (requests never submitted are only allowed on Ctrl-C).

Each result carries a one-line detail with the counts and the first few offending ids, which is
what a person needs to start debugging from the report, and a verdict: ok, failed, or vacuous.
A vacuous check exercised nothing, so it neither passed nor failed: a fault during which no
request needed re-routing, a fault that never applied or never ended, fewer requests after a
fault's end than the recovery streak, a percentile over zero completed requests (or with no
pre-fault value to compare with), nothing submitted, completed or decoded for the built-ins.
It does not fail the run (a run that breaks everything is caught by a `failures` bound, which
every library scenario carries), but it is shown as such, and the chaos suite asserts that its
own scenarios are never vacuous. What can be known before the run (a fault past the duration,
a checker about a fault the timeline lacks) is refused then instead: `checkers_fit` here and
`testbed.scenario.nemesis.check_timeline_fits`, called by the runner's prepare_run.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from testbed.errors import UserError
from testbed.metrics.records import HistoryEvent, RequestRecord
from testbed.metrics.summary import stats
from testbed.scenario.schema import CheckerConfig, Scenario

__all__ = [
    "CheckResult",
    "ModelRun",
    "Verdict",
    "check_failures",
    "check_generator_count",
    "check_kv_accounted",
    "check_latency",
    "check_no_unverified_decode",
    "check_nothing_lost",
    "check_recover",
    "check_reroute",
    "check_token_exact",
    "checkers_fit",
    "run_checker",
    "run_checkers",
]

_SHOW = 5
"""How many offending ids a detail line names."""


Verdict = Literal["ok", "failed", "vacuous"]


@dataclass
class CheckResult:
    """One checker's verdict on a run.

    `ok` means "did not fail", so callers that gate a run on its checks keep working; a check
    that had nothing to judge (no request in scope, a fault that never applied or never ended,
    zero completed requests for a percentile) is `vacuous`: it did not fail, and it did not
    pass either. It is reported as such (summary.json, report.md, the printed check lines) and
    does not fail the run, but a suite that means to test something asserts it never happens.
    """

    name: str
    ok: bool
    detail: str
    vacuous: bool = False

    def __post_init__(self) -> None:
        if self.vacuous and not self.ok:
            raise ValueError(f"check {self.name}: a vacuous check did not fail; ok must be True")

    @property
    def verdict(self) -> Verdict:
        if self.vacuous:
            return "vacuous"
        return "ok" if self.ok else "failed"

    def to_json(self) -> dict[str, Any]:
        """The entry of summary.json `checks`."""
        return {"name": self.name, "ok": self.ok, "verdict": self.verdict, "detail": self.detail}


def _vacuous(name: str, detail: str) -> CheckResult:
    return CheckResult(name, True, detail, vacuous=True)


def _combine(name: str, parts: Sequence[tuple[Verdict, str]]) -> CheckResult:
    """One result from per-fault verdicts: failed if any failed, else vacuous if any part
    exercised nothing (the claim "after each fault" was not shown for that one), else ok."""
    detail = "; ".join(text for _, text in parts)
    verdicts = {v for v, _ in parts}
    if "failed" in verdicts:
        return CheckResult(name, False, detail)
    if "vacuous" in verdicts or not parts:
        return _vacuous(name, detail)
    return CheckResult(name, True, detail)


def _ids(ids: Sequence[str]) -> str:
    more = f" (+{len(ids) - _SHOW} more)" if len(ids) > _SHOW else ""
    return ", ".join(ids[:_SHOW]) + more


def check_nothing_lost(
    records: Sequence[RequestRecord], submitted_ids: Sequence[str]
) -> CheckResult:
    """Every submitted id has exactly one record, completed or failed-with-a-reason."""
    submitted = set(submitted_ids)
    counts = Counter(r.id for r in records)
    problems: list[str] = []

    dup_submitted = sorted(i for i, n in Counter(submitted_ids).items() if n > 1)
    if dup_submitted:
        problems.append(f"ids submitted more than once: {_ids(dup_submitted)}")
    missing = sorted(submitted - counts.keys())
    if missing:
        problems.append(f"{len(missing)} submitted without a record: {_ids(missing)}")
    duplicated = sorted(i for i, n in counts.items() if n > 1)
    if duplicated:
        problems.append(f"{len(duplicated)} with more than one record: {_ids(duplicated)}")
    unknown = sorted(counts.keys() - submitted)
    if unknown:
        problems.append(f"{len(unknown)} records for ids never submitted: {_ids(unknown)}")
    bad_status = [r.id for r in records if r.status not in ("completed", "failed")]
    if bad_status:
        problems.append(f"{len(bad_status)} neither completed nor failed: {_ids(bad_status)}")
    no_reason = [
        r.id for r in records if r.status == "failed" and not (r.failure_reason or "").strip()
    ]
    if no_reason:
        problems.append(f"{len(no_reason)} failed without a reason: {_ids(no_reason)}")

    completed = sum(1 for r in records if r.status == "completed")
    failed = sum(1 for r in records if r.status == "failed")
    tally = f"{len(submitted_ids)} submitted, {completed} completed, {failed} failed"
    if not problems and completed + failed != len(submitted_ids):
        problems.append("completed + failed does not equal submitted")
    if problems:
        return CheckResult("nothing_lost", False, f"{tally}; " + "; ".join(problems))
    if not submitted_ids:
        return _vacuous("nothing_lost", f"{tally}: nothing to account for")
    return CheckResult("nothing_lost", True, tally)


def check_kv_accounted(records: Sequence[RequestRecord]) -> CheckResult:
    """For every completed request: received == sent == expected wire bytes, and verified."""
    completed = [r for r in records if r.status == "completed"]
    expected = sum(r.kv_wire_bytes_expected for r in completed)
    sent = sum(r.kv_wire_bytes_sent for r in completed)
    received = sum(r.kv_wire_bytes_received for r in completed)
    totals = (
        f"{len(completed)} completed; wire bytes expected {expected}, sent {sent}, "
        f"received {received}"
    )
    mismatched = [
        r.id
        for r in completed
        if not (r.kv_wire_bytes_received == r.kv_wire_bytes_sent == r.kv_wire_bytes_expected)
    ]
    unverified = [r.id for r in completed if not r.kv_verified]
    problems: list[str] = []
    if mismatched:
        problems.append(f"{len(mismatched)} with byte mismatch: {_ids(mismatched)}")
    if unverified:
        problems.append(f"{len(unverified)} completed without verified KV: {_ids(unverified)}")
    if problems:
        return CheckResult("kv_accounted", False, f"{totals}; " + "; ".join(problems))
    if not completed:
        return _vacuous("kv_accounted", f"{totals}: no completed request to account")
    return CheckResult("kv_accounted", True, totals)


def check_no_unverified_decode(records: Sequence[RequestRecord]) -> CheckResult:
    """No request (completed or failed) streamed output tokens without verified KV."""
    bad = [r.id for r in records if r.tokens_out > 0 and not r.kv_verified]
    decoded = sum(1 for r in records if r.tokens_out > 0)
    if bad:
        return CheckResult(
            "no_unverified_decode",
            False,
            f"{len(bad)} of {decoded} decoded requests streamed tokens without verified KV: "
            f"{_ids(bad)}",
        )
    if not decoded:
        return _vacuous("no_unverified_decode", "no request streamed a token: nothing to verify")
    return CheckResult("no_unverified_decode", True, f"{decoded} decoded requests, all verified")


def check_generator_count(planned: int, submitted_ids: Sequence[str]) -> CheckResult:
    """The load generator's own count: every planned request was submitted, once."""
    n = len(submitted_ids)
    ok = n == planned and len(set(submitted_ids)) == n
    return CheckResult(
        "generator_count", ok, f"{planned} planned by the load generator, {n} submitted"
    )


def _s(v: float) -> str:
    return f"{v:.3g}s"


def check_latency(
    records: Sequence[RequestRecord],
    metric: str,
    p: float,
    bound_s: float,
    *,
    history: Sequence[HistoryEvent] = (),
    during: str | None = None,
    max_ratio: float | None = None,
) -> CheckResult:
    """Percentile `p` of `metric` ("ttft", "tpot" or "e2e") over completed requests <= bound;
    with `during`, only over requests that arrived while such a fault was in force. With
    `max_ratio` the bound is max_ratio x the percentile over the requests that arrived in an
    equally long window just before the first such fault (the "pre-fault value")."""
    name = f"{metric}_p{p:g}" + (f"_during_{during}" if during else "")
    baseline = ""
    if during is not None:
        windows = _fault_windows(history, during)
        if not windows:
            return _vacuous(name, _not_applied(history, during))
        if max_ratio is not None:
            start, end, _ = windows[0]
            length = (end if math.isfinite(end) else start + 60.0) - start
            before = [
                v
                for r in records
                if start - length <= r.arrival < start
                and r.status == "completed"
                and (v := getattr(r, metric)) is not None
            ]
            if not before:
                return _vacuous(
                    name,
                    f"no completed request in the {_s(length)} before the {during}: "
                    "no pre-fault value to compare with",
                )
            pre = float(np.percentile(before, p))
            bound_s = max_ratio * pre
            baseline = f" = {max_ratio:g} x p{p:g} {_s(pre)} before the {during}"
        records = [r for r in records if any(s <= r.arrival < e for s, e, _ in windows)]
    values = [
        v for r in records if r.status == "completed" and (v := getattr(r, metric)) is not None
    ]
    if not values:
        where = f" among requests arriving during the {during}" if during else ""
        failed = sum(1 for r in records if r.status == "failed")
        return _vacuous(
            name,
            f"no completed request has a {metric}{where} ({len(records)} requests, "
            f"{failed} failed): no percentile to bound",
        )
    got = float(np.percentile(values, p))
    mean = stats(values)["mean"]
    detail = (
        f"{metric} p{p:g} {_s(got)} (bound {_s(bound_s)}{baseline}) over {len(values)} "
        "completed; "
        f"mean {_s(mean or 0.0)}"
    )
    return CheckResult(name, got <= bound_s, detail)


def check_failures(
    records: Sequence[RequestRecord], submitted: int, max_fraction: float
) -> CheckResult:
    failed = sum(1 for r in records if r.status == "failed")
    if not submitted:
        return _vacuous("failures", "no request was submitted")
    frac = failed / submitted
    detail = f"{failed} of {submitted} failed ({frac:.1%}, at most {max_fraction:.1%})"
    return CheckResult("failures", frac <= max_fraction, detail)


def _fault_windows(history: Sequence[HistoryEvent], action: str) -> list[tuple[float, float, str]]:
    """(start, end, target) of every applied fault of this action; end is inf if never ended."""
    starts: dict[object, HistoryEvent] = {}
    ends: dict[object, float] = {}
    for e in sorted(history, key=lambda e: e.t):
        if e.kind != "fault" or e.data.get("action") != action or "error" in e.data:
            continue
        key = e.data.get("index")
        if e.data.get("phase") == "start":
            starts.setdefault(key, e)
        elif e.data.get("phase") == "end":
            ends.setdefault(key, e.t)
    return [
        (e.t, ends.get(k, math.inf), str(e.data.get("target") or ""))
        for k, e in sorted(starts.items(), key=lambda kv: kv[1].t)
    ]


def _not_applied(history: Sequence[HistoryEvent], action: str) -> str:
    """Why no `action` fault has a window: it was never started (the run ended or was
    interrupted first) or every attempt to apply it failed (its error)."""
    errors = [
        str(e.data["error"])
        for e in history
        if e.kind == "fault"
        and e.data.get("action") == action
        and e.data.get("phase") == "start"
        and "error" in e.data
    ]
    if errors:
        return f"the {action!r} fault failed to apply ({errors[0]}): it exercised nothing"
    return f"no {action!r} fault was applied in this run: it exercised nothing"


def _in_scope(r: RequestRecord, instances: set[str], t_min: float | None) -> bool:
    """Whether a request would have used the faulty target (see the module docstring)."""
    if instances:
        return True
    return t_min is None or r.input_tokens - r.cached_tokens > t_min


def _avoids(r: RequestRecord, instances: set[str]) -> bool:
    if instances:
        return r.prefill_instance not in instances and r.decode_instance not in instances
    return not r.cross_dc


def check_reroute(
    records: Sequence[RequestRecord],
    history: Sequence[HistoryEvent],
    fault: str,
    within_s: float,
) -> CheckResult:
    """After each `fault` starts, a request avoiding its target starts prefill within bound.

    A fault during which no request in scope arrived exercised nothing: vacuous, not ok."""
    name = f"reroute_{fault}"
    windows = _fault_windows(history, fault)
    if not windows:
        return _vacuous(name, _not_applied(history, fault))
    thresholds = [r.threshold_tokens for r in records if r.threshold_tokens is not None]
    t_min = min(thresholds) if thresholds else None
    parts: list[tuple[Verdict, str]] = []
    for start, end, target in windows:
        instances = set(target.split(",")) if target and target != "link" else set()

        scoped = [r for r in records if _in_scope(r, instances, t_min) and start <= r.arrival < end]
        served = [
            r.prefill_start
            for r in records
            if r.status == "completed"
            and _in_scope(r, instances, t_min)
            and _avoids(r, instances)
            and r.prefill_start is not None
            and start <= r.prefill_start < end
        ]
        what = f"{fault}{' of ' + target if target else ''} at {start:.4g}s"
        if served:
            took = min(served) - start
            verdict: Verdict = "ok" if took <= within_s else "failed"
            parts.append((verdict, f"{what}: re-routed after {_s(took)} (bound {_s(within_s)})"))
        elif not scoped:
            parts.append(("vacuous", f"{what}: no request needing re-routing arrived during it"))
        else:
            parts.append(
                ("failed", f"{what}: none of {len(scoped)} requests arriving during it avoided it")
            )
    return _combine(name, parts)


def check_recover(
    records: Sequence[RequestRecord],
    history: Sequence[HistoryEvent],
    fault: str,
    within_s: float,
    ttft_s: float,
    streak: int = 3,
) -> CheckResult:
    """After each `fault` ends, TTFT is back under `ttft_s` within `within_s` (see module).

    A fault that never ended, or after whose end fewer than `streak` requests arrived and no
    good streak was seen, leaves nothing to judge: vacuous, not ok."""
    name = f"recover_{fault}"
    windows = _fault_windows(history, fault)
    if not windows:
        return _vacuous(name, _not_applied(history, fault))
    parts: list[tuple[Verdict, str]] = []
    ordered = sorted(records, key=lambda r: (r.arrival, r.id))
    for _start, end, target in windows:
        what = f"{fault}{' of ' + target if target else ''}"
        if math.isinf(end):
            parts.append(
                ("vacuous", f"{what}: never ended in this run, so nothing to recover from")
            )
            continue
        after = [r for r in ordered if r.arrival >= end]
        good_at: float | None = None
        for i in range(len(after) - streak + 1):
            window = after[i : i + streak]
            if all(r.status == "completed" and (r.ttft or math.inf) <= ttft_s for r in window):
                good_at = after[i].arrival
                break
        if good_at is None and len(after) < streak:
            parts.append(
                (
                    "vacuous",
                    f"{what} ended at {end:.4g}s: {len(after)} requests arrived after it, fewer "
                    f"than the streak of {streak} that recovery needs",
                )
            )
            continue
        if good_at is None:
            parts.append(
                (
                    "failed",
                    f"{what} ended at {end:.4g}s: TTFT never back under {_s(ttft_s)} for "
                    f"{streak} requests in a row ({len(after)} arrived after it)",
                )
            )
            continue
        took = good_at - end
        parts.append(
            (
                "ok" if took <= within_s else "failed",
                f"{what} ended at {end:.4g}s: TTFT under {_s(ttft_s)} again after {_s(took)} "
                f"(bound {_s(within_s)})",
            )
        )
    return _combine(name, parts)


@dataclass(frozen=True)
class ModelRun:
    """What token_exact needs to redo an `engine: torch` run's generations in one process."""

    prompt_seed: int
    """The scenario seed: prompts are live.prompt_ids(prompt_seed, request id, length)."""
    model_seed: int = 0
    dtype: str = "float32"


def check_token_exact(records: Sequence[RequestRecord], run: ModelRun | None) -> CheckResult:
    """Every completed request's token ids equal a single-process greedy generation of the same
    prompt: remote prefill, the KV bytes over the link and decode from them lost nothing.

    Recomputes each reference here (torch, imported only when this check runs), rebuilding the
    prompt from the record's id and length and confirming it with the recorded digest.
    """
    name = "token_exact"
    if run is None:
        return CheckResult(name, False, "not an engine: torch run; nothing to compare")
    try:
        import torch

        from testbed.engine.torch import live
        from testbed.engine.torch.model import TinyHybridLM, generate
    except ImportError:
        from testbed.engine.torch.live import MODEL_EXTRA_HINT

        return CheckResult(name, False, f"cannot recompute: {MODEL_EXTRA_HINT}")
    torch.set_num_threads(1)
    model = TinyHybridLM(live.tiny_config(run.model_seed, run.dtype))
    completed = [r for r in records if r.status == "completed"]
    bad: list[str] = []
    missing: list[str] = []
    remote = 0
    for r in completed:
        if not r.output_ids:
            missing.append(r.id)
            continue
        ids = live.prompt_ids(run.prompt_seed, r.id, r.input_tokens, model.config.vocab_size)
        if r.prompt_digest is not None and live.ids_digest(ids) != r.prompt_digest:
            bad.append(f"{r.id} (prompt digest differs)")
            continue
        if generate(model, ids, r.output_tokens) != r.output_ids:
            bad.append(r.id)
        remote += r.cross_dc
    exact = len(completed) - len(bad) - len(missing)
    detail = (
        f"{exact} of {len(completed)} completed requests token-exact "
        f"({remote} with KV across the link)"
    )
    if missing:
        detail += f"; {len(missing)} without token ids: {_ids(missing)}"
    if bad:
        detail += f"; {len(bad)} differ from single-process generation: {_ids(bad)}"
    if not completed:
        return _vacuous(name, f"{detail}: nothing to compare")
    return CheckResult(name, not bad and not missing, detail)


def check_throughput(
    records: Sequence[RequestRecord],
    history: Sequence[HistoryEvent],
    after: float,
    until: float,
    min_fraction: float,
) -> CheckResult:
    """Completions per second in [after, until] against the planner's lambda_max for the
    workload in force at `after` (the runner records both optima as a "plan" event)."""
    name = f"throughput[{_s(after)}..{_s(until)}]"
    plan = next((e.data for e in history if e.kind == "plan"), None)
    if plan is None or until <= after:
        return CheckResult(name, False, "no planner optimum recorded for this run")
    shift_at = plan.get("shift_at")
    key = "shift_lambda_max_rps" if shift_at is not None and after >= shift_at else "lambda_max_rps"
    target = float(plan[key])
    done = sum(
        1
        for r in records
        if r.status == "completed" and r.last_token is not None and after <= r.last_token < until
    )
    rate = done / (until - after)
    ok = rate >= min_fraction * target
    return CheckResult(
        name,
        ok,
        f"{rate:.2f} req/s completed ({done} requests) vs planner {target:.2f} req/s "
        f"({rate / target - 1:+.1%}; at least {min_fraction:.0%})",
    )


def checkers_fit(scenario: Scenario, duration_s: float) -> None:
    """Refuse, before anything starts, a checker that this run could only judge vacuously or
    fail for a reason that has nothing to do with the service: one about a fault the timeline
    does not have, `recover` from a fault that never ends, or a throughput window that ends
    after the arrivals do. (Faults past the duration: nemesis.check_timeline_fits.)"""
    problems: list[str] = []
    for i, c in enumerate(scenario.checkers):
        action = c.fault or c.during
        if action is not None:
            events = [ev for ev in scenario.nemesis if ev.action == action]
            if not events:
                problems.append(
                    f"checkers.{i} ({c.check}) is about a {action!r} fault, and the "
                    "nemesis timeline has none"
                )
            elif c.check == "recover" and all(ev.end is None for ev in events):
                problems.append(
                    f"checkers.{i} (recover) needs a {action!r} fault that ends "
                    "(one with 'for'); none does"
                )
        if c.check == "throughput" and c.until is not None and c.until > duration_s:
            problems.append(
                f"checkers.{i} (throughput) measures until {c.until:g}s, past the "
                f"run's duration of {duration_s:g}s"
            )
    if problems:
        raise UserError(f"scenario {scenario.name!r}: " + "; ".join(problems))


def run_checker(
    cfg: CheckerConfig,
    records: Sequence[RequestRecord],
    history: Sequence[HistoryEvent],
    submitted: int,
    model_run: ModelRun | None = None,
) -> CheckResult:
    """One scenario checker (`checkers:` in a scenario file)."""
    if cfg.check == "token_exact":
        return check_token_exact(records, model_run)
    if cfg.check in ("ttft", "tpot", "e2e"):
        return check_latency(
            records, cfg.check, cfg.p, cfg.max if cfg.max is not None else math.inf,
            history=history, during=cfg.during, max_ratio=cfg.max_ratio,
        )  # fmt: skip
    if cfg.check == "throughput":
        assert cfg.after is not None and cfg.until is not None and cfg.min_fraction is not None
        return check_throughput(records, history, cfg.after, cfg.until, cfg.min_fraction)
    if cfg.check == "failures":
        assert cfg.max_fraction is not None
        return check_failures(records, submitted, cfg.max_fraction)
    assert cfg.fault is not None and cfg.within is not None
    if cfg.check == "reroute":
        return check_reroute(records, history, cfg.fault, cfg.within)
    assert cfg.ttft is not None
    return check_recover(records, history, cfg.fault, cfg.within, cfg.ttft, cfg.streak)


def run_checkers(
    records: Sequence[RequestRecord],
    submitted_ids: Sequence[str],
    *,
    history: Sequence[HistoryEvent] = (),
    configs: Sequence[CheckerConfig] = (),
    planned: int | None = None,
    model_run: ModelRun | None = None,
) -> list[CheckResult]:
    """The built-in checkers, in a fixed order, then the scenario's own in its order."""
    out = [
        check_nothing_lost(records, submitted_ids),
        check_kv_accounted(records),
        check_no_unverified_decode(records),
    ]
    if planned is not None:
        out.append(check_generator_count(planned, submitted_ids))
    out += [run_checker(c, records, history, len(submitted_ids), model_run) for c in configs]
    return out
