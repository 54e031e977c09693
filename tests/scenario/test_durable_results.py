"""A run killed mid-load keeps its records and leaves no process behind (issue #12 item 10).

SIGTERM and SIGHUP behave like Ctrl-C: stop submitting, fail in-flight requests with the signal
as reason, write every file, exit 128 + signal. SIGKILL cannot be handled, so records are
journaled to requests.jsonl / history.jsonl as they end, and every service dies with its runner
(testbed.lifeline). Real processes on loopback; assertions are about files and processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.processes import alive, descendants, jsonl_lines

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "tiny.yaml"

pytestmark = pytest.mark.slow


def _start(out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "testbed.cli", "run", str(TINY), "--out", str(out)),
            *("--quiet", "--duration", "2000"),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_records(proc: subprocess.Popen[str], out: Path, n: int) -> list[str]:
    """Ids of the records journaled once at least `n` requests have ended (bounded wait)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        ids = [str(r["id"]) for r in jsonl_lines(out / "requests.jsonl")]
        if len(ids) >= n:
            return ids
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"fewer than {n} records journaled within 120 s")


def _wait_gone(pids: set[int]) -> set[int]:
    """Pids still alive after up to 10 s."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return {p for p in pids if alive(p)}


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_sigterm_and_sighup_write_everything(
    tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    proc = _start(tmp_path)
    before = _wait_for_records(proc, tmp_path, 5)
    children = descendants(proc.pid)
    assert len(children) >= 5  # the zygote, the router, three workers (and the link emulator)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert not _wait_gone(children)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["interrupted"] is True
    req = summary["requests"]
    assert req["submitted"] == req["completed"] + req["failed"] >= len(before)
    records = jsonl_lines(tmp_path / "requests.jsonl")
    assert len(records) == req["submitted"]
    assert set(before) <= {str(r["id"]) for r in records}
    reasons = {r["failure_reason"] for r in records if r["status"] == "failed"}
    assert reasons <= {f"interrupted ({sig.name})"}, reasons
    assert jsonl_lines(tmp_path / "history.jsonl")
    assert sig.name in (tmp_path / "report.md").read_text()
    assert (tmp_path / "timeline.png").read_bytes().startswith(b"\x89PNG")
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert not leftovers  # no temporary files of the atomic writes


def test_sigkill_keeps_the_journal_and_leaves_no_process(tmp_path: Path) -> None:
    proc = _start(tmp_path)
    before = _wait_for_records(proc, tmp_path, 5)
    children = descendants(proc.pid)
    assert len(children) >= 5  # the zygote, the router, three workers (and the link emulator)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert not _wait_gone(children), "services outlived their runner"
    records = jsonl_lines(tmp_path / "requests.jsonl")  # every line parses
    assert set(before) <= {str(r["id"]) for r in records}
    assert all(r["status"] in ("completed", "failed") for r in records)
    assert jsonl_lines(tmp_path / "history.jsonl")
    assert not (tmp_path / "summary.json").exists()  # never half-written: absent
