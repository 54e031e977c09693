"""Every field of every `checkers:` entry changes the verdict: the same records and history,
judged through the registry (`run_checker`, as the runner does) with one field moved, give
another verdict. Hand-made records, no run."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from testbed.checkers import CHECKERS, CheckResult, run_checker
from testbed.metrics.records import HistoryEvent, RequestRecord


def rec(i: int, arrival: float, ttft: float = 1.0, **kw: Any) -> RequestRecord:
    base = RequestRecord(
        id=f"r{i:06d}",
        input_tokens=30_000,
        output_tokens=11,
        arrival=arrival,
        status="completed",
        tokens_out=11,
        route="prfaas",
        prefill_instance="prfaas-prefill-0",
        decode_instance="local-decode-0",
        cross_dc=True,
        prefill_start=arrival + 0.1,
        first_token=arrival + ttft,
        last_token=arrival + ttft + 1.0,
        kv_verified=True,
        threshold_tokens=10_000,
    )
    return replace(base, **kw)


def fault(t: float, action: str, phase: str, index: int = 0) -> HistoryEvent:
    data = {"action": action, "phase": phase, "target": "link", "index": index}
    return HistoryEvent(t, "fault", data)


HISTORY = [
    HistoryEvent(0.0, "plan", {"lambda_max_rps": 1.0, "shift_at": None}),
    fault(50, "partition", "start"),
    fault(60, "partition", "end"),
    fault(70, "bandwidth", "start", 1),
    fault(80, "bandwidth", "end", 1),
]


def judge(entry: dict[str, Any], records: list[RequestRecord]) -> CheckResult:
    cfg = CHECKERS[entry["check"]].config.model_validate(entry)
    return run_checker(cfg, records, HISTORY, len(records))


def verdicts(base: dict[str, Any], records: list[RequestRecord], **moved: Any) -> tuple[str, str]:
    return judge(base, records).verdict, judge({**base, **moved}, records).verdict


def test_failures_max_fraction() -> None:
    records = [rec(1, 1), rec(2, 2, status="failed", failure_reason="x")]
    assert verdicts({"check": "failures", "max_fraction": 0.6}, records, max_fraction=0.4) == (
        "ok", "failed",
    )  # fmt: skip


# ttft 1 s for most, 2 s (tpot 0.1 s) for every third; e2e = ttft + 1 s
LATENCY = [rec(i, i, ttft=2.0 if i % 3 == 0 else 1.0) for i in range(1, 31)]


def test_latency_check_picks_the_metric() -> None:
    assert verdicts({"check": "ttft", "max": "1.5s", "p": 50}, LATENCY, check="e2e") == (
        "ok", "failed",
    )  # fmt: skip
    assert verdicts({"check": "tpot", "max": "0.15s", "p": 50}, LATENCY, check="ttft") == (
        "ok", "failed",
    )  # fmt: skip


def test_latency_p_and_max() -> None:
    base = {"check": "ttft", "max": "1.5s", "p": 50}
    assert verdicts(base, LATENCY, p=90) == ("ok", "failed")
    assert verdicts(base, LATENCY, max="0.5s") == ("ok", "failed")


def test_latency_during_and_max_ratio() -> None:
    # slow only while the partition is in force (arrivals in [50, 60))
    records = [rec(i, i, ttft=9.0 if 50 <= i < 60 else 1.0) for i in range(30, 90)]
    assert verdicts({"check": "ttft", "max": "5s", "p": 50}, records, during="partition") == (
        "ok", "failed",
    )  # fmt: skip
    ratio = {"check": "ttft", "during": "partition", "max_ratio": 10}
    assert verdicts(ratio, records, max_ratio=2) == ("ok", "failed")


# after the partition ends at 60 s: TTFT 6 s for requests arriving before 66 s, then 1 s
RECOVERING = [rec(i, 40 + i, ttft=6.0 if 40 + i < 66 else 1.0) for i in range(60)]


def test_recover_fault_within_ttft_and_streak() -> None:
    base = {"check": "recover", "fault": "partition", "within": "10s", "ttft": "2s"}
    assert verdicts(base, RECOVERING, within="3s") == ("ok", "failed")
    assert verdicts(base, RECOVERING, ttft="0.5s") == ("ok", "failed")
    # after the bandwidth fault (80 s) everything is fast already
    assert verdicts({**base, "within": "3s"}, RECOVERING, fault="bandwidth") == ("failed", "ok")
    # 34 fast requests follow the partition: a streak of 35 is never seen
    assert verdicts({**base, "within": "12s"}, RECOVERING, streak=35) == ("ok", "failed")


def test_reroute_fault_and_within() -> None:
    # the first request that avoids the link starts prefill 5.1 s into the partition [50, 60),
    # 0.6 s into the bandwidth fault [70, 80)
    records = [
        *(rec(i, i) for i in range(40, 50)),
        *(rec(i, i, status="failed", failure_reason="link", first_token=None) for i in (50, 52)),
        rec(55, 55, route="local", cross_dc=False, prefill_instance="local-prefill-0"),
        *(rec(i, i) for i in range(60, 90)),
        rec(200, 70.5, route="local", cross_dc=False, prefill_instance="local-prefill-0"),
    ]
    base = {"check": "reroute", "fault": "partition", "within": "10s"}
    assert verdicts(base, records, within="2s") == ("ok", "failed")
    assert verdicts({**base, "within": "2s"}, records, fault="bandwidth") == ("failed", "ok")


def test_throughput_after_until_and_min_fraction() -> None:
    # one completion a second over [0, 40), none after: the planner said 1 req/s
    records = [rec(i, i - 1.1, ttft=0.1) for i in range(40)]
    base = {"check": "throughput", "after": "0s", "until": "40s", "min_fraction": 0.9}
    assert verdicts(base, records, min_fraction=1.1) == ("ok", "failed")
    assert verdicts(base, records, after="30s", until="50s") == ("ok", "failed")
    assert verdicts(base, records, until="80s") == ("ok", "failed")


class Reference:
    """Single-process generation, faked: token i of every request is i."""

    def prepare(self) -> None:
        return None

    def prompt_digest(self, request_id: str, n_tokens: int) -> str:
        return "d"

    def generate(self, request_id: str, n_tokens: int, n_out: int) -> list[int]:
        return list(range(n_out))


def test_token_exact_compares_with_the_reference() -> None:
    cfg = CHECKERS["token_exact"].config.model_validate({"check": "token_exact"})
    good = rec(1, 1, output_ids=list(range(11)), prompt_digest="d")
    bad = rec(2, 2, output_ids=[0] * 11, prompt_digest="d")
    assert run_checker(cfg, [good], [], 1, Reference()).verdict == "ok"
    assert run_checker(cfg, [good, bad], [], 2, Reference()).verdict == "failed"
