"""A timeline or checker the run cannot exercise is refused before anything starts (issue #12,
item 14): a clear one-line error and exit code 2, not two failed checkers after the run. Fast:
nothing is started."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from testbed.checkers import checkers_fit
from testbed.checkers.latency import LatencyCheck
from testbed.checkers.recover import RecoverCheck
from testbed.checkers.reroute import RerouteCheck
from testbed.errors import UserError
from testbed.nemesis import check_timeline_fits
from testbed.nemesis.actions.restart import RestartAction
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.schema import load_scenario
from tests.chaos.harness import LIBRARY, ROOT, SCENARIOS, chaos_variant


def _prepare(name: str, duration: float | None = None, **updates: object) -> None:
    sc = chaos_variant(name, **updates)
    prepare_run(sc, RunOptions(out_dir=Path("unused"), progress=False, duration_s=duration))


def test_a_fault_past_the_duration_is_refused_before_the_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "testbed.cli", "run", "scenarios/partition.yaml", "--duration",
         "20", "--quiet", "--out", str(out)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "nemesis.0 (partition at 60s)" in lines[0] and "duration of 20s" in lines[0]
    assert not out.exists()  # refused before any process started or file was written


def test_a_fault_that_starts_inside_the_run_may_end_past_it() -> None:
    _prepare("partition", duration=80)  # the cut is 60-100 s: it starts inside, so allowed
    with pytest.raises(UserError, match=r"nemesis\.0 \(partition at 60s\)"):
        _prepare("partition", duration=60)  # at the end of the arrivals: exercises nothing
    with pytest.raises(UserError, match=r"nemesis\.1 \(restart at 110s\), nemesis\.2"):
        _prepare("decode-crash", duration=100)


def test_checkers_about_a_fault_the_timeline_lacks_are_refused() -> None:
    no_fault = [RerouteCheck(fault="kill", within=10)]
    with pytest.raises(UserError, match=r"checkers\.0 \(reroute\) is about a 'kill' fault"):
        _prepare("partition", checkers=no_fault)
    during = [LatencyCheck(check="ttft", during="bandwidth", max_ratio=2)]
    with pytest.raises(UserError, match=r"checkers\.0 \(ttft\) is about a 'bandwidth' fault"):
        _prepare("partition", checkers=during)
    restart = [RecoverCheck(fault="restart", within=10, ttft=10)]
    timeline = [RestartAction(at=10, target="local-decode")]
    with pytest.raises(UserError, match=r"needs a 'restart' fault that ends"):
        _prepare("partition", checkers=restart, nemesis=timeline)
    with pytest.raises(UserError, match=r"throughput\) measures until 600s, past .* 300s"):
        _prepare("traffic-shift", duration=300)


@pytest.mark.parametrize("name", LIBRARY)
def test_every_library_scenario_fits_its_own_duration(name: str) -> None:
    sc = load_scenario(SCENARIOS / f"{name}.yaml")
    check_timeline_fits(sc, sc.duration)
    checkers_fit(sc, sc.duration)
