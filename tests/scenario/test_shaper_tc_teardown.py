"""A `shaper: tc` run leaves no namespace behind: stopped by SIGTERM (the runner's clean stop)
its namespaces go with it; killed by SIGKILL (nothing of it runs any more) they stay, and the
next run's start removes them as stale (`testbed link tc down --stale` does it by hand,
tests/link/test_netns_link.py). Needs root (marker tc)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.link.netns_link import NetnsLink

pytestmark = [pytest.mark.tc, pytest.mark.slow, pytest.mark.timeout(240)]

TINY = str(Path(__file__).resolve().parents[1] / "data" / "tiny.yaml")


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _start(out: Path) -> tuple[subprocess.Popen[bytes], set[str]]:
    """A tc run, once its namespaces exist (bounded wait)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "testbed.cli", "run", TINY, "--shaper", "tc", "--quiet",
         "--out", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    mine = {f"tbl-r{proc.pid}-a", f"tbl-r{proc.pid}-b"}
    deadline = time.monotonic() + 90
    while not mine <= _namespaces():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            err = proc.communicate()[1].decode(errors="replace")
            pytest.fail(f"the run's namespaces never appeared: {err[-2000:]}")
        time.sleep(0.2)
    return proc, mine


def test_sigterm_removes_the_runs_namespaces(tmp_path: Path) -> None:
    proc, mine = _start(tmp_path / "term")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    assert not mine & _namespaces()


def test_a_killed_runs_namespaces_go_at_the_next_start(tmp_path: Path) -> None:
    proc, mine = _start(tmp_path / "kill")
    proc.kill()
    proc.wait(timeout=30)
    assert mine <= _namespaces()  # nothing of the run was left to clean up
    link = NetnsLink.create(1e6)  # what the next tc run does first
    try:
        assert mine <= set(link.removed_stale)
        assert not mine & _namespaces()
    finally:
        link.close()
