"""#17 item 7: the progress display speaks the report's units: real-world seconds of workload
and real-world req/s, with start-up and writing the results shown apart."""

from __future__ import annotations

import io

from testbed.cli.progress import ProgressDisplay
from testbed.scenario.plan import Progress


def feed(display: ProgressDisplay) -> None:
    display(Progress("starting", planned=40, services=13))
    display(Progress("running", done=0, submitted=5, planned=40, workload_s=2, duration_s=20))
    display(Progress("running", done=10, submitted=30, planned=40, workload_s=10, duration_s=20))
    display(Progress("draining", done=36, submitted=40, planned=40, workload_s=20, duration_s=20))
    display(Progress("results", done=40, submitted=40, planned=40, workload_s=20, duration_s=20))
    display.close()


def test_phase_lines_without_a_bar() -> None:
    out = io.StringIO()
    feed(ProgressDisplay(out, bar=False))
    lines = out.getvalue().splitlines()
    assert lines[0] == "starting 13 services ..."
    assert lines[1].startswith("started in ") and lines[1].endswith("s wall")
    assert lines[2].startswith("arrivals and drain took ") and "writing results" in lines[2]
    assert len(lines) == 3


def test_the_bar_counts_real_world_seconds_and_rate() -> None:
    out = io.StringIO()
    display = ProgressDisplay(out, bar=True)
    feed(display)
    text = out.getvalue().replace("\r", "\n")
    assert "workload (real-world s)" in text
    assert "10/20s" in text  # real-world seconds of workload, not requests
    assert "10/40 req done, 20 in flight, 1.00 req/s real-world" in text
    assert "36/40 req done, 4 in flight, 1.80 req/s real-world, draining" in text
    assert set(display.walls) == {"starting", "running", "results"}


def test_progress_of_a_plan_runs_then_drains() -> None:
    class Plan:
        duration_s = 20.0
        requests = [object()] * 4

    rp = Plan()
    running = Progress.of(rp, now=5.0, done=1, submitted=2)  # type: ignore[arg-type]
    assert (running.phase, running.workload_s, running.planned) == ("running", 5.0, 4)
    all_in = Progress.of(rp, now=5.0, done=1, submitted=4)  # type: ignore[arg-type]
    assert all_in.phase == "draining"
    late = Progress.of(rp, now=25.0, done=3, submitted=3)  # type: ignore[arg-type]
    assert (late.phase, late.workload_s) == ("draining", 20.0)
    early = Progress.of(rp, now=-1.0, done=0, submitted=0)  # type: ignore[arg-type]
    assert early.workload_s == 0.0
