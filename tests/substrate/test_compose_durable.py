"""The compose substrate after its runner dies: SIGTERM removes the run's containers and networks
on the way out; after a SIGKILL they are left behind, and the next run (or `make down`) removes
them (testbed.substrate.compose.reap_orphans), never a live run's (issue #12 item 10)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.substrate.test_compose import images  # noqa: F401  (the session fixture that builds them)

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "tiny.yaml"

pytestmark = [pytest.mark.compose, pytest.mark.timeout(1800)]


def _start(out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "testbed.cli", "run", str(TINY), "--out", str(out)),
            *("--quiet", "--duration", "2000", "--substrate", "compose"),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_records(proc: subprocess.Popen[str], out: Path, n: int) -> None:
    deadline = time.monotonic() + 300
    path = out / "requests.jsonl"
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if path.exists() and len(path.read_text().splitlines()) >= n:
            return
        time.sleep(0.5)
    proc.kill()
    pytest.fail(f"fewer than {n} records within 300 s")


def _run_name(out: Path) -> str:
    for line in (out / ".env").read_text().splitlines():
        if line.startswith("TESTBED_RUN="):
            return line.split("=", 1)[1]
    raise AssertionError("no TESTBED_RUN in .env")


def test_sigkill_leftovers_are_reaped_by_the_next_run_and_sigterm_removes_its_own(
    images: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    from testbed.substrate.compose import leftovers, reap_orphans

    proc = _start(tmp_path / "killed")
    _wait_for_records(proc, tmp_path / "killed", 3)
    run = _run_name(tmp_path / "killed")
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert leftovers(run)["containers"]  # nothing cleans up after a SIGKILL by itself
    live = _start(tmp_path / "live")  # a run in progress must survive the reaping
    try:
        _wait_for_records(live, tmp_path / "live", 1)
        live_run = _run_name(tmp_path / "live")
        assert run in reap_orphans() or not leftovers(run)["containers"]
        assert leftovers(run) == {"containers": [], "networks": [], "volumes": []}
        assert live_run not in reap_orphans()
        assert leftovers(live_run)["containers"]
        live.send_signal(signal.SIGTERM)  # and a SIGTERM removes a run's own on the way out
        _, err = live.communicate(timeout=300)
        assert live.returncode == 143, err
        assert json.loads((tmp_path / "live" / "summary.json").read_text())["interrupted"] is True
        assert leftovers(live_run) == {"containers": [], "networks": [], "volumes": []}
    finally:
        if live.poll() is None:
            live.send_signal(signal.SIGTERM)
            live.communicate(timeout=300)
