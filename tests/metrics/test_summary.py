from typing import Any

import pytest

from testbed.clock import Scale
from testbed.config import SloConfig
from testbed.metrics.records import HistoryEvent, RequestRecord
from testbed.metrics.summary import link_stats, queue_depth_series, stats, summarize, to_text

SLO = SloConfig(ttft="4s", decode_tokens_per_s=10)  # TPOT SLO 0.1 s, 0.105 s with tolerance


def rec(
    i: int, ttft: float | None, *, tpot: float = 0.1, tokens: int = 11, **kw: Any
) -> RequestRecord:
    arrival = float(i)
    r = RequestRecord(id=f"r{i:06d}", input_tokens=1000 * i, output_tokens=tokens, arrival=arrival)
    if ttft is not None:
        r.status = "completed"
        r.first_token = arrival + ttft
        r.last_token = r.first_token + tpot * (tokens - 1)
        r.tokens_out = tokens
    for k, v in kw.items():
        setattr(r, k, v)
    return r


def records() -> list[RequestRecord]:
    return [
        rec(1, 1.0, route="local"),
        rec(2, 2.0, route="local"),
        rec(
            3,
            3.0,
            route="prfaas",
            cross_dc=True,
            kv_wire_bytes_expected=100,
            kv_wire_bytes_sent=100,
            kv_wire_bytes_received=100,
        ),
        rec(4, 4.0, route="prfaas", tpot=0.104),  # within the 5% TPOT tolerance: good
        rec(5, 5.0, route="prfaas"),  # TTFT over the SLO
        rec(6, 1.0, route="local", tpot=0.2),  # TPOT over the SLO
        rec(7, None, route="prfaas", failure_reason="link down"),
        rec(8, None, failure_reason="link down"),
        rec(9, None, route="local", failure_reason="decode crashed"),
    ]


def summary(**kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"duration_s": 10.0, "slo": SLO, "scale": Scale(4.0, 1000.0)}
    return summarize(records(), [], **{**args, **kw})


def test_stats_percentiles() -> None:
    s = stats([5.0, 1.0, 3.0, 2.0, 4.0])
    assert s == pytest.approx({"mean": 3.0, "p50": 3.0, "p90": 4.6, "p99": 4.96})
    assert stats([]) == {"mean": None, "p50": None, "p90": None, "p99": None}


def test_counts_rates_and_failures() -> None:
    s = summary()
    assert s["requests"] == {"submitted": 9, "completed": 6, "failed": 3}
    assert s["failures"] == {"decode crashed": 1, "link down": 2}
    assert s["throughput_rps"] == pytest.approx(0.6)
    assert s["goodput_rps"] == pytest.approx(0.4)  # r1..r4 meet both SLOs
    assert s["slo_attainment"] == pytest.approx(4 / 9)
    assert s["routes"] == {"local": 4, "prfaas": 4, "unrouted": 1}
    assert s["scale"] == {"time": 4.0, "bytes": 1000.0}


def test_latency_statistics_over_completed_requests() -> None:
    s = summary()
    ttft = {k: s["ttft_s"][k] for k in ("mean", "p50", "p90", "p99")}
    assert ttft == pytest.approx({"mean": 16 / 6, "p50": 2.5, "p90": 4.5, "p99": 4.95})
    assert s["ttft_ms"]["p90"] == pytest.approx(4500.0)
    assert s["tpot_s"]["p50"] == pytest.approx(0.1)
    assert s["tpot_s"]["mean"] == pytest.approx((0.1 * 4 + 0.104 + 0.2) / 6)
    assert s["e2e_s"]["p50"] == pytest.approx(3.5)


def test_by_route_breakdown_and_kv_bytes_in_real_units() -> None:
    s = summary()
    prfaas = s["by_route"]["prfaas"]
    assert (prfaas["requests"], prfaas["completed"], prfaas["failed"]) == (4, 3, 1)
    assert prfaas["ttft_s"]["p50"] == pytest.approx(4.0)
    assert prfaas["kv_bytes"] == 100_000.0
    assert s["kv_bytes"] == {"expected": 1e5, "sent": 1e5, "received": 1e5, "cross_dc": 1e5}


def test_goodput_without_data_and_tpot_of_single_token_requests() -> None:
    one_token = [rec(1, 1.0, tokens=1)]
    s = summarize(one_token, [], duration_s=2.0, slo=SLO, scale=Scale(1, 1))
    assert s["goodput_rps"] == pytest.approx(0.5)  # no TPOT to violate
    assert s["tpot_s"]["mean"] is None
    empty = summarize([], [], duration_s=2.0, slo=SLO, scale=Scale(1, 1))
    assert empty["ttft_s"]["p99"] is None and empty["slo_attainment"] is None


def link(t: float, wire: int, gbps: float, configured: float = 100.0) -> HistoryEvent:
    return HistoryEvent(
        t, "link", {"wire_bytes": wire, "gbps": gbps, "configured_gbps": configured}
    )


def test_link_stats_from_samples() -> None:
    events = [
        HistoryEvent(0.5, "queue", {"depth": 3}),
        link(1.0, 1_000_000, 8.0),
        link(2.0, 3_000_000, 16.0, configured=50.0),
        link(4.0, 5_000_000, 8.0, configured=50.0),
    ]
    s = link_stats(events, byte_scale=1000.0)
    assert s["samples"] == 3
    assert s["bytes"] == 5e9  # last cumulative wire count x byte_scale
    assert s["mean_gbps"] == pytest.approx(5e9 * 8 / 1e9 / 4.0)  # 10 Gbps over 4 s
    assert s["peak_gbps"] == 16.0
    assert s["configured_gbps"] == {"min": 50.0, "max": 100.0}
    # Configured time-weighted: 100 for 1 s, 50 for 3 s -> 62.5 Gbps.
    assert s["utilisation"] == pytest.approx(10.0 / 62.5)
    none = link_stats([], byte_scale=1.0)
    assert none["bytes"] == 0.0 and none["mean_gbps"] is None and none["peak_gbps"] is None


def queue(t: float, instance: str, cluster: str, role: str, depth: int) -> HistoryEvent:
    data = {"instance": instance, "cluster": cluster, "role": role, "depth": depth, "active": 0}
    return HistoryEvent(t, "queue", data)


def test_history_sections() -> None:
    history = [
        link(2.0, 2_000, 4.0),
        queue(1.0, "p0", "prfaas", "prefill", 2),
        queue(1.5, "p1", "prfaas", "prefill", 3),
        queue(2.0, "p0", "prfaas", "prefill", 0),
        queue(1.0, "d0", "local", "decode", 1),
        HistoryEvent(3.0, "policy", {"threshold_tokens": 19400}),
        HistoryEvent(6.0, "policy", {"threshold_tokens": 25000}),
        HistoryEvent(5.0, "fault", {"action": "link-down", "for_s": 10}),
        HistoryEvent(
            9.0,
            "engine",
            {
                "instance": "p0",
                "steps": 10,
                "lateness_mean_s": 0.001,
                "lateness_p99_s": 0.004,
                "timing_error": 0.02,
            },
        ),
        HistoryEvent(
            9.0,
            "engine",
            {
                "instance": "d0",
                "steps": 99,
                "lateness_mean_s": 0.002,
                "lateness_p99_s": 0.01,
                "timing_error": 0.07,
            },
        ),
    ]
    assert queue_depth_series(history)["prfaas/prefill"] == ([1.0, 1.5, 2.0], [2, 5, 3])
    s = summarize(
        records(),
        history,
        duration_s=10,
        slo=SLO,
        scale=Scale(1, 10),
        extra={"deployment": "prfaas-pd", "policy": "prfaas-static"},
    )
    assert s["queues"]["prfaas/prefill"] == {"peak_depth": 5, "mean_depth": pytest.approx(10 / 3)}
    assert s["queues"]["local/decode"]["peak_depth"] == 1
    assert s["policy_thresholds"] == {"samples": 2, "min": 19400, "max": 25000, "last": 25000}
    assert s["faults"] == [{"t": 5.0, "action": "link-down", "for_s": 10}]
    assert s["engine"]["max_timing_error"] == 0.07
    assert s["engine"]["instances"]["p0"]["steps"] == 10
    assert s["link"]["bytes"] == 20_000
    assert s["deployment"] == "prfaas-pd"


def test_extra_cannot_overwrite_computed_fields() -> None:
    with pytest.raises(ValueError, match="goodput_rps"):
        summary(extra={"goodput_rps": 99})


def test_summary_is_json_ready_and_renders_as_text() -> None:
    import json

    s = summary()
    assert json.loads(json.dumps(s)) == s
    text = to_text(s)
    assert "9 submitted, 6 completed, 3 failed" in text
    assert "goodput 0.4 req/s" in text
    assert "time_scale 4" in text and "byte_scale 1000" in text
