"""A simulated request's objects are freed when it ends, by reference counting alone: the
10K-GPU hour ends a million requests, and each one left in a reference cycle (an attempt's
callbacks close over the attempt) waited for the cyclic collector, which then scanned a heap
that only grew (issue #35, bench/sim_scale.py)."""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.schema import load_scenario
from testbed.scenario.sim_run import sim_inputs
from testbed.sim import simulate

ROOT = Path(__file__).resolve().parents[2]
PER_REQUEST = {"SimRequest", "Attempt", "Slot", "PrefillJob", "Flow", "RequestDispatch"}


@contextmanager
def garbage_kept() -> Iterator[list[object]]:
    """Cyclic garbage made inside the block (the collector off, then one collection that keeps
    what it finds in gc.garbage)."""
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    found: list[object] = []
    try:
        yield found
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        found.extend(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was:
            gc.enable()


@pytest.mark.parametrize("name", ["decode-crash", "link-flap"])
def test_ended_requests_leave_no_cycles(name: str, tmp_path: Path) -> None:
    """decode-crash: attempts abandoned and retried; link-flap: KV across a failing link."""
    sc = load_scenario(ROOT / "scenarios" / f"{name}.yaml")
    opts = RunOptions(substrate="sim", out_dir=tmp_path)
    rp = prepare_run(sc, opts)
    with garbage_kept() as garbage:
        out = simulate(sim_inputs(rp, opts))
    assert len(out.records) == len(rp.requests) > 100
    if name == "decode-crash":
        assert sum(r.retries for r in out.records) > 0  # the failure paths ran
    else:
        assert any(r.cross_dc for r in out.records)  # flows on the link
    left = Counter(type(o).__name__ for o in garbage)
    assert {k: n for k, n in left.items() if k in PER_REQUEST} == {}
