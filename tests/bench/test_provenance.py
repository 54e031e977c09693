"""The provenance header's commit line: a tree changed only in bench/reports/ (what the
scripts write, a multi-section script its own report after the first section) is clean; a
change anywhere else is said (issue #37)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.email=t@t", "-c", "user.name=t", *args],
        cwd=repo, check=True, capture_output=True,
    )  # fmt: skip


def test_only_a_report_changed_is_not_an_uncommitted_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import provenance

    (tmp_path / "bench" / "reports").mkdir(parents=True)
    report, code = tmp_path / "bench" / "reports" / "r.md", tmp_path / "code.py"
    report.write_text("# r\n")
    code.write_text("x = 1\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "base")
    monkeypatch.setattr(provenance, "ROOT", tmp_path)
    monkeypatch.setattr(provenance, "commit", lambda cwd=tmp_path: "abc1234")

    def commit_line() -> str:
        head = provenance.provenance("bench/x.py", [], os.getloadavg(), "sim")
        return next(line for line in head.splitlines() if line.startswith("- commit:"))

    report.write_text("# r\n\nfirst section\n")
    assert commit_line() == "- commit: abc1234"
    code.write_text("x = 2\n")
    assert commit_line() == "- commit: abc1234 (with uncommitted changes in the tree)"
