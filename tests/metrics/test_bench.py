"""Benchmark-grade figures (issue #17 item 4): ITL, ms fields, percentiles, min/max/std, token
throughputs, goodput with an E2E bound and a configurable TPOT tolerance, run metadata."""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Any

import numpy as np
import pytest

from testbed.clock import Scale
from testbed.config import SloConfig
from testbed.metrics.bench import describe, parse_percentiles, run_metadata
from testbed.metrics.records import RequestRecord, TokenTimer
from testbed.metrics.summary import meets_slo, summarize


def rec(i: int, ttft: float, tpot: float, tokens: int = 11, inp: int = 1000) -> RequestRecord:
    r = RequestRecord(id=f"r{i}", input_tokens=inp, output_tokens=tokens, arrival=float(i))
    r.status = "completed"
    r.first_token = r.arrival + ttft
    r.last_token = r.first_token + tpot * (tokens - 1)
    r.tokens_out = tokens
    return r


RECS = [rec(1, 1.0, 0.02), rec(2, 2.0, 0.04), rec(3, 3.0, 0.06, inp=3000), rec(4, 4.0, 0.08)]


def summary(slo: SloConfig | None = None, **kw: Any) -> dict[str, Any]:
    return summarize(
        RECS,
        [],
        duration_s=10.0,
        slo=slo or SloConfig(ttft="10s", decode_tokens_per_s=20),
        scale=Scale(1.0, 1.0),
        **kw,
    )


def test_itl_is_per_request_and_in_seconds_and_milliseconds() -> None:
    s = summary()
    assert s["itl_s"]["mean"] == pytest.approx(0.05)
    assert s["itl_ms"]["p50"] == pytest.approx(50.0)
    assert s["itl_ms"]["min"] == pytest.approx(20.0)
    assert s["itl_ms"]["max"] == pytest.approx(80.0)
    assert s["itl_ms"]["std"] == pytest.approx(float(np.std([20, 40, 60, 80])))


def test_configured_percentiles_join_the_fixed_ones() -> None:
    s = summary(percentiles=(95.0, 99.9))
    assert set(s["ttft_s"]) == {"mean", "std", "min", "max", "p50", "p90", "p95", "p99", "p99.9"}
    assert s["ttft_s"]["p95"] == pytest.approx(float(np.percentile([1, 2, 3, 4], 95)))
    assert s["benchmark"]["p95_ttft_ms"] == pytest.approx(1000 * s["ttft_s"]["p95"])
    assert "p95_ttft_ms" not in summary()["benchmark"]


def test_benchmark_section_has_vllm_bench_serve_names() -> None:
    b = summary()["benchmark"]
    assert b["request_throughput"] == pytest.approx(0.4)
    assert b["total_input_tokens"] == 6000
    assert b["input_throughput"] == pytest.approx(600.0)
    assert b["output_throughput"] == pytest.approx(4.4)
    assert b["total_token_throughput"] == pytest.approx(604.4)
    assert b["median_ttft_ms"] == b["p50_ttft_ms"] == pytest.approx(2500.0)
    assert b["mean_itl_ms"] == pytest.approx(50.0)
    assert b["mean_tpot_ms"] == pytest.approx(50.0)
    assert b["max_e2el_ms"] == pytest.approx(4800.0)
    assert b["std_ttft_ms"] == pytest.approx(1000 * float(np.std([1, 2, 3, 4])))


def test_goodput_e2e_bound_and_tpot_tolerance() -> None:
    # TPOT SLO 50 ms: 20 and 40 ms pass; 60 ms passes only with a 20% tolerance
    assert summary()["benchmark"]["request_goodput"] == pytest.approx(0.2)
    loose = SloConfig(ttft="10s", decode_tokens_per_s=20, tpot_tolerance=0.2)
    assert summary(loose)["goodput_rps"] == pytest.approx(0.3)
    # E2E: r1 1.2 s, r2 2.4 s, r3 3.6 s: a 3 s bound drops r3
    bounded = SloConfig(ttft="10s", decode_tokens_per_s=20, tpot_tolerance=0.2, e2e="3s")
    s = summary(bounded)
    assert s["goodput_rps"] == pytest.approx(0.2)
    assert s["slo"]["e2e_s"] == 3.0 and s["slo"]["tpot_tolerance"] == 0.2
    assert not meets_slo(RECS[2], bounded) and meets_slo(RECS[2], loose)


def test_describe_empty_and_percentile_parsing() -> None:
    assert describe([], (95.0,)) == dict.fromkeys(
        ["mean", "std", "min", "max", "p50", "p90", "p95", "p99"]
    )
    assert parse_percentiles("99, 50,90,95,99") == (50.0, 90.0, 95.0, 99.0)
    for bad in ("0", "101", "x", "50,,90"):
        with pytest.raises(ValueError):
            parse_percentiles(bad)


def test_token_timer_keeps_statistics_not_timestamps() -> None:
    t = TokenTimer()
    assert t.add(1.0, 1) is None  # the first chunk opens the clock
    assert t.add(1.1, 1) == pytest.approx(0.1)
    assert t.add(1.5, 2) == pytest.approx(0.4)  # two tokens over 0.4 s: gaps of 0.2, 0.2
    r = RequestRecord(id="x", input_tokens=1, output_tokens=4, arrival=0.0)
    t.write(r)
    gaps = [0.1, 0.2, 0.2]
    assert r.token_chunks == 3
    assert r.itl_min == pytest.approx(0.1) and r.itl_max == pytest.approx(0.2)
    assert r.itl_std == pytest.approx(float(np.std(gaps)))
    assert len(vars(t)) == 7  # a fixed handful of numbers however many tokens
    one = RequestRecord(id="y", input_tokens=1, output_tokens=1, arrival=0.0)
    solo = TokenTimer()
    solo.add(2.0, 1)
    solo.write(one)
    assert one.itl_std is None and one.token_chunks == 1


def test_run_metadata_names_what_produced_the_run() -> None:
    m = run_metadata(
        version="9.9", seed=7, scenario_json='{"a":1}', started_at=0.0, argv=["testbed", "run"]
    )
    assert m["testbed_version"] == "9.9" and m["seed"] == 7
    assert m["command_line"] == ["testbed", "run"]
    assert len(m["scenario_sha256"]) == 64
    other = run_metadata(version="9.9", seed=7, scenario_json='{"a":2}', started_at=0.0, argv=[])
    assert other["scenario_sha256"] != m["scenario_sha256"]
    assert m["host_cores"] is not None and m["host_cores"] >= 1
    assert datetime.fromisoformat(m["start_time"]).year == 1970
    assert m["git_commit"] is None or len(m["git_commit"]) == 40
    json.dumps(m)  # summary.json material
    assert not math.isnan(float(m["seed"]))
