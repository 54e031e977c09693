"""A report built only from sim runs, with no wall-clock column, is a function of its seeds:
regenerating it reproduces it byte for byte, provenance lines aside (issue #37)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def bench_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))


@pytest.mark.usefixtures("bench_path")
def test_sim_saturation_report_regenerates_byte_for_byte() -> None:
    import sim_saturation
    from provenance import report_body

    committed = (BENCH / "reports" / "sim_saturation.md").read_text()
    assert "- command: `python bench/sim_saturation.py" in committed  # it carries provenance
    assert sim_saturation.report(sim_saturation.grid(600.0), 600.0) == report_body(committed)


@pytest.mark.usefixtures("bench_path")
def test_predict_variants_burst_table_regenerates_byte_for_byte() -> None:
    """docs/scheduler.md quotes this table (where cache-skew's burst sends its requests)."""
    import predict_variants

    committed = (BENCH / "reports" / "predict_variants.md").read_text()
    assert "- command: `python bench/predict_variants.py" in committed
    assert "\n".join(predict_variants.burst(1)) in committed


@pytest.mark.usefixtures("bench_path")
def test_report_body_drops_only_the_provenance_lines() -> None:
    from provenance import report_body

    text = "# t\n\n- command: `x`\n- commit: y\n- date: d\n- machine: m\n- substrate: s\n\n| a |\n"
    assert report_body(text) == "# t\n\n| a |\n"


@pytest.mark.usefixtures("bench_path")
def test_printed_output_becomes_a_section_and_replaces_the_last_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from provenance import output_section, printed

    report = tmp_path / "r.md"
    report.write_text("# r\n\nkept prose\n")
    for run in ("first", "second"):
        with printed() as out:
            print(f"table {run}")
        output_section(report, "t", "Tables", f"- command: `{run}`\n", out.getvalue())
    assert capsys.readouterr().out == "table first\ntable second\n"  # still printed
    assert report.read_text() == (
        "# r\n\nkept prose\n\n## Tables\n\n<!-- t:start -->\n- command: `second`\n"
        "\n```\ntable second\n```\n<!-- t:end -->\n"
    )


@pytest.mark.parametrize("report", sorted((BENCH / "reports").glob("*.md")), ids=lambda p: p.name)
def test_every_report_says_where_its_figures_came_from(report: Path) -> None:
    """A report has a provenance header, or says which part is not yet regenerated; a section a
    script writes (between its markers) starts with the header, so one left empty fails."""
    text = report.read_text()
    assert "- command: `" in text or "not yet regenerated" in text
    for name in re.findall(r"<!-- (\S+):start -->", text):
        body = text.split(f"<!-- {name}:start -->", 1)[1].split(f"<!-- {name}:end -->", 1)[0]
        assert body.startswith("\n- command: `python bench/"), f"section {name}: no header"


@pytest.mark.usefixtures("bench_path")
def test_route_lines_split_the_records_by_route(tmp_path: Path) -> None:
    """sample_run.py --router's per-route lines (docs/real-routers.md quotes them): counts, TTFT
    and the prefill-end-to-KV-received hand-off per route, retries and failure reasons."""
    import json

    from sample_run import route_lines

    def rec(i: int, route: str, **kw: object) -> dict[str, object]:
        return {"id": str(i), "input_tokens": 9, "output_tokens": 1, "arrival": 0.0,
                "route": route, **kw}  # fmt: skip

    docs = [
        rec(1, "prfaas", status="completed", first_token=2.0, prefill_end=1.0, transfer_end=1.1),
        rec(2, "prfaas", status="completed", first_token=4.0, prefill_end=1.0, transfer_end=1.3),
        rec(
            3,
            "local",
            status="completed",
            first_token=1.0,
            prefill_end=0.5,
            transfer_end=0.502,
            retries=2,
        ),
        rec(4, "local", failure_reason="kv transfer timed out at decode", retries=1),
    ]
    (tmp_path / "requests.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    lines = route_lines(tmp_path).splitlines()
    assert lines[0] == (
        "route prfaas: 2 requests; TTFT p50 / p90 / p99 3 / 3.8 / 3.98 s; "
        "prefill end to KV received p50 / p90 / p99 200 / 280 / 298 ms"
    )
    assert lines[1].startswith("route local: 2 requests; TTFT p50 / p90 / p99 1 / 1 / 1 s;")
    assert lines[2] == "retried: 3 attempts over 2 requests"
    assert lines[3] == "failed: 1 x kv transfer timed out at decode"


@pytest.mark.usefixtures("bench_path")
def test_router_scorecard_table_shows_each_row_per_scenario() -> None:
    from router_scorecard import table

    rows = {
        "vllm-router": {"slo_attainment": 0.769, "ttft_p90_s": 5.1, "failed": 9.0},
        "prfaas": {"slo_attainment": 0.718, "ttft_p90_s": 12.8, "failed": 0.0},
    }
    raw = [{"scenario": "prefill-crash", "label": x, "requests": 39} for x in rows]
    card = {"policy": "vllm-router", "baselines": ["prfaas"], "rows": raw,
            "scenarios": [{"name": "prefill-crash", "rows": rows}]}  # fmt: skip
    assert table(card).splitlines() == [
        "| scenario | requests | vllm-router | prfaas |",
        "|---|---|---|---|",
        "| prefill-crash | 39 | 76.9 %, TTFT p90 5.1 s, **9 failed** | 71.8 %, TTFT p90 12.8 s |",
    ]
