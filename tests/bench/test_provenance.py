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


CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 207
model name\t: Intel(R) Xeon(R) Processor

processor\t: 1
cpu family\t: 6
model\t\t: 143
model name\t: another
"""


def test_the_machine_line_names_the_processors_family_and_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two hosts both named "Intel(R) Xeon(R) Processor" ran the same instructions at rates two
    apart: the header tells them apart by the first processor's family and model numbers."""
    monkeypatch.syspath_prepend(str(BENCH))
    import provenance

    info = tmp_path / "cpuinfo"
    info.write_text(CPUINFO)
    assert provenance.cpu_model(info) == "Intel(R) Xeon(R) Processor, family 6 model 207"
    info.write_text("processor\t: 0\nmodel name\t: Some ARM core\n")
    assert provenance.cpu_model(info) == "Some ARM core"
    assert provenance.cpu_model(tmp_path / "none")  # the platform's guess, never empty
