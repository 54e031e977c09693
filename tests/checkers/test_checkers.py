from dataclasses import replace
from pathlib import Path

import pytest

from testbed.checkers import (
    CheckResult,
    check_kv_accounted,
    check_no_unverified_decode,
    check_nothing_lost,
    run_checkers,
)
from testbed.metrics.records import RequestRecord

ROOT = Path(__file__).resolve().parents[2]


def done(i: int, kv: int = 1000) -> RequestRecord:
    return RequestRecord(
        id=f"r{i:06d}",
        input_tokens=100,
        output_tokens=4,
        arrival=float(i),
        status="completed",
        tokens_out=4,
        kv_wire_bytes_expected=kv,
        kv_wire_bytes_sent=kv,
        kv_wire_bytes_received=kv,
        kv_verified=True,
    )


def failed(i: int, reason: str | None = "prefill instance died") -> RequestRecord:
    return RequestRecord(
        id=f"r{i:06d}",
        input_tokens=100,
        output_tokens=4,
        arrival=float(i),
        status="failed",
        failure_reason=reason,
    )


def good() -> list[RequestRecord]:
    return [done(1), done(2, kv=0), failed(3), done(4)]


IDS = ["r000001", "r000002", "r000003", "r000004"]


def test_all_pass_on_good_records() -> None:
    results = run_checkers(good(), IDS)
    assert [r.name for r in results] == ["nothing_lost", "kv_accounted", "no_unverified_decode"]
    assert all(isinstance(r, CheckResult) and r.ok for r in results), results
    assert results[0].detail == "4 submitted, 3 completed, 1 failed"
    assert "KV 1.953KiB real-world expected = sent = received (wire bytes 2000 / 2000 / 2000)" in (
        results[1].detail
    )


@pytest.mark.parametrize(
    ("records", "ids", "needle"),
    [
        (good()[:3], IDS, "1 submitted without a record: r000004"),
        ([*good(), done(4)], IDS, "1 with more than one record: r000004"),
        ([*good(), done(9)], IDS, "1 records for ids never submitted: r000009"),
        ([done(1), done(2), failed(3, None), done(4)], IDS, "1 failed without a reason: r000003"),
        ([done(1), done(2), failed(3, "  "), done(4)], IDS, "failed without a reason: r000003"),
        (good(), [*IDS, "r000001"], "ids submitted more than once: r000001"),
    ],
)
def test_nothing_lost_fails_on(records: list[RequestRecord], ids: list[str], needle: str) -> None:
    r = check_nothing_lost(records, ids)
    assert not r.ok
    assert needle in r.detail


def test_nothing_lost_rejects_an_unknown_status() -> None:
    rec = done(1)
    rec.status = "running"  # type: ignore[assignment]
    r = check_nothing_lost([rec], ["r000001"])
    assert not r.ok and "neither completed nor failed: r000001" in r.detail


def test_nothing_lost_names_at_most_five_ids() -> None:
    r = check_nothing_lost([], [f"r{i:06d}" for i in range(1, 9)])
    assert not r.ok
    assert (
        "8 submitted without a record: r000001, r000002, r000003, r000004, r000005 (+3 more)"
        in r.detail
    )


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("kv_wire_bytes_received", 999, "1 with byte mismatch: r000002"),
        ("kv_wire_bytes_sent", 1001, "1 with byte mismatch: r000002"),
        ("kv_wire_bytes_expected", 5, "1 with byte mismatch: r000002"),
        ("kv_verified", False, "1 completed without verified KV: r000002"),
    ],
)
def test_kv_accounted_fails_on(field: str, value: object, needle: str) -> None:
    broken = done(2)
    setattr(broken, field, value)
    records = [done(1), broken, failed(3)]
    r = check_kv_accounted(records)
    assert not r.ok
    assert needle in r.detail
    assert "2 completed" in r.detail


def test_kv_accounted_ignores_failed_requests_partial_transfers() -> None:
    partial = replace(failed(3), kv_wire_bytes_expected=1000, kv_wire_bytes_sent=400)
    assert check_kv_accounted([done(1), partial]).ok


def test_no_unverified_decode_fails_even_for_failed_requests() -> None:
    streamed = replace(failed(3), tokens_out=2, kv_verified=False)
    r = check_no_unverified_decode([done(1), streamed])
    assert not r.ok
    assert "1 of 2 decoded requests streamed tokens without verified KV: r000003" in r.detail
    assert check_no_unverified_decode([done(1), failed(3)]).ok


def test_run_checkers_reports_each_failure() -> None:
    bad = [done(1), replace(done(2), kv_verified=False), failed(3, None)]
    results = {r.name: r.ok for r in run_checkers(bad, IDS)}
    assert results == {"nothing_lost": False, "kv_accounted": False, "no_unverified_decode": False}


def _timed(i: int, arrival: float, ttft: float, last: float | None = None) -> RequestRecord:
    return replace(done(i), arrival=arrival, first_token=arrival + ttft, last_token=last)


def test_ttft_ratio_compares_with_the_window_before_the_fault() -> None:
    from testbed.checkers import run_checker
    from testbed.checkers.latency import LatencyCheck
    from testbed.metrics.records import HistoryEvent

    history = [
        HistoryEvent(60.0, "fault", {"action": "bandwidth", "phase": "start", "index": 0}),
        HistoryEvent(120.0, "fault", {"action": "bandwidth", "phase": "end", "index": 0}),
    ]
    before = [_timed(i, float(i), 2.0) for i in range(0, 60)]  # p90 2 s before the drop
    cfg = LatencyCheck(check="ttft", p=90, during="bandwidth", max_ratio=2)
    ok = [_timed(100 + i, 60.0 + i, 3.9) for i in range(60)]
    bad = [_timed(100 + i, 60.0 + i, 4.1) for i in range(60)]
    assert run_checker(cfg, before + ok, history, 120).ok
    res = run_checker(cfg, before + bad, history, 120)
    assert not res.ok and "2 x p90 2s before the bandwidth" in res.detail


def test_throughput_uses_the_optimum_after_the_shift() -> None:
    from testbed.checkers import run_checker
    from testbed.checkers.throughput import ThroughputCheck
    from testbed.metrics.records import HistoryEvent

    plan = HistoryEvent(
        0.0, "plan", {"lambda_max_rps": 4.0, "shift_at": 100.0, "shift_lambda_max_rps": 2.0}
    )
    cfg = ThroughputCheck(after=200, until=300, min_fraction=0.9)
    recs = [_timed(i, 150.0, 1.0, last=200.0 + i * 100 / n) for n in [185] for i in range(n)]
    assert run_checker(cfg, recs, [plan], len(recs)).ok  # 1.85 req/s >= 0.9 x 2.0
    res = run_checker(cfg, recs[:170], [plan], 170)  # 1.70 req/s
    assert not res.ok and "vs planner 2.00 req/s" in res.detail
    assert not run_checker(cfg, recs, [], len(recs)).ok  # no optimum recorded: cannot pass


# ------------------------------------------------------------------- vacuous (issue #12, 14)


def test_a_vacuous_result_did_not_fail_and_did_not_pass() -> None:
    ok = CheckResult("x", True, "d")
    vac = CheckResult("x", False, "d", vacuous=True)
    bad = CheckResult("x", False, "d")
    assert [c.verdict for c in (ok, vac, bad)] == ["ok", "vacuous", "failed"]
    assert [c.failed for c in (ok, vac, bad)] == [False, False, True]  # what gates a run
    # a script counting `ok` never counts a check that exercised nothing as a pass (#30)
    assert vac.to_json() == {"name": "x", "ok": False, "verdict": "vacuous", "detail": "d"}
    with pytest.raises(ValueError, match="vacuous"):
        CheckResult("x", True, "d", vacuous=True)


def test_builtins_are_vacuous_when_nothing_ran_or_completed() -> None:
    assert check_nothing_lost([], []).verdict == "vacuous"
    all_failed = [failed(1), failed(2)]
    ids = ["r000001", "r000002"]
    verdicts = {c.name: c.verdict for c in run_checkers(all_failed, ids)}
    # every request ended with a reason: nothing lost; but no KV was accounted or decoded
    assert verdicts == {
        "nothing_lost": "ok",
        "kv_accounted": "vacuous",
        "no_unverified_decode": "vacuous",
    }
    assert check_kv_accounted(good()).verdict == "ok"
    assert check_no_unverified_decode(good()).verdict == "ok"


def _partition_run(tmp_path: Path, quiet_during: bool) -> Path:
    """Results of a hand-made partition run, written by the real write_results: with
    `quiet_during`, no request that the policy would offload arrives during the cut."""
    from testbed.metrics.records import HistoryEvent
    from testbed.scenario.plan import RunOptions, prepare_run
    from testbed.scenario.results import write_results
    from testbed.scenario.schema import load_scenario

    tmp_path.mkdir(parents=True, exist_ok=True)
    opts = RunOptions(out_dir=tmp_path, progress=False)
    rp = prepare_run(load_scenario(ROOT / "scenarios" / "partition.yaml"), opts)
    records = []
    for spec in rp.requests:
        during = 60 <= spec.arrival < 100
        records.append(
            replace(
                done(0),
                id=spec.id,
                arrival=spec.arrival,
                input_tokens=1_000 if during and quiet_during else 50_000,
                threshold_tokens=19_500,
                cross_dc=not during,
                prefill_start=spec.arrival + 0.5,
                first_token=spec.arrival + 1.0,
                last_token=spec.arrival + 2.0,
            )
        )
    history = [
        HistoryEvent(60.0, "fault", {"action": "partition", "phase": "start", "index": 0}),
        HistoryEvent(100.0, "fault", {"action": "partition", "phase": "end", "index": 0}),
    ]
    submitted = [r.id for r in records]
    write_results(rp, opts, submitted, records, history, [], False)
    return tmp_path


def test_summary_and_report_show_a_vacuous_check(tmp_path: Path) -> None:
    import json

    out = _partition_run(tmp_path, quiet_during=True)
    checks = {c["name"]: c for c in json.loads((out / "summary.json").read_text())["checks"]}
    assert checks["reroute_partition"]["verdict"] == "vacuous", checks
    assert checks["reroute_partition"]["ok"] is False  # not a pass (#30)
    assert checks["failures"]["verdict"] == "ok"
    report = (out / "report.md").read_text()
    assert "| reroute_partition | VACUOUS |" in report
    assert "no check failed, 1 VACUOUS (exercised nothing)" in report


def test_cli_prints_a_vacuous_check_and_exits_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from testbed import cli
    from testbed.scenario.plan import RunResult

    async def fake_run(rp: object, opts: object, progress: object = None) -> RunResult:
        import json

        from testbed.checkers import CheckResult

        out = _partition_run(tmp_path / "run", quiet_during=True)
        summary = json.loads((out / "summary.json").read_text())
        checks = [CheckResult(c["name"], c["ok"], c["detail"], c["verdict"] == "vacuous")
                  for c in summary["checks"]]  # fmt: skip
        return RunResult(out, [], [], summary, checks)

    monkeypatch.setattr("testbed.scenario.runner.run_scenario", fake_run)  # imported per live run
    rc = cli.main(["run", str(ROOT / "scenarios" / "partition.yaml"), "--quiet", "--out",
                   str(tmp_path / "cli")])  # fmt: skip
    printed = capsys.readouterr().out
    assert "check reroute_partition: VACUOUS - partition at 60s:" in printed, printed
    assert "check failures: ok - " in printed
    assert rc == 0  # vacuous does not fail the run
