"""`testbed run --no-timeline` and `testbed timeline RUN_DIR`: the picture drawn after the run
is the one the run would have drawn, embedded where the run embeds it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from testbed.cli import main

RUN = ["run", "burst", "--substrate", "sim", "--duration", "20s", "--quiet"]


def test_a_timeline_drawn_afterwards_is_the_runs_own(tmp_path: Path) -> None:
    drawn, later = tmp_path / "drawn", tmp_path / "later"
    assert main([*RUN, "--out", str(drawn)]) == 0
    assert main([*RUN, "--out", str(later), "--no-timeline"]) == 0
    assert not (later / "timeline.png").exists()
    assert "## Timeline" not in (later / "report.md").read_text()

    assert main(["timeline", str(later)]) == 0
    assert (later / "timeline.png").read_bytes() == (drawn / "timeline.png").read_bytes()
    sections = [ln for ln in (later / "report.md").read_text().splitlines() if ln[:3] == "## "]
    assert sections == [
        ln for ln in (drawn / "report.md").read_text().splitlines() if ln[:3] == "## "
    ]
    report = (later / "report.md").read_text()
    assert main(["timeline", str(later)]) == 0  # again: the picture, not a second section
    assert (later / "report.md").read_text() == report


def test_no_timeline_leaves_no_earlier_picture_behind(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert main([*RUN, "--out", str(out)]) == 0
    assert main([*RUN, "--out", str(out), "--no-timeline"]) == 0
    assert not (out / "timeline.png").exists()
    assert "## Timeline" not in (out / "report.md").read_text()


def test_a_directory_without_results_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "summary.json").write_text("{}")
    assert main(["timeline", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "missing requests.jsonl, history.jsonl" in err
    assert err.count("\n") == 1
    shutil.copy(tmp_path / "summary.json", tmp_path / "requests.jsonl")
    (tmp_path / "history.jsonl").write_text("")
    assert main(["timeline", str(tmp_path)]) == 2  # a foreign file: said, no traceback
    assert "cannot read the run's results" in capsys.readouterr().err
