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
