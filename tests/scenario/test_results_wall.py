"""summary.json says where the wall time went, whatever the substrate (`wall`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.results import write_results
from testbed.scenario.schema import load_scenario
from testbed.scenario.sim_run import sim_inputs
from testbed.sim import simulate

ROOT = Path(__file__).resolve().parents[2]


def test_write_results_records_the_run_the_results_and_the_total(tmp_path: Path) -> None:
    sc = load_scenario(ROOT / "scenarios" / "burst.yaml")
    opts = RunOptions(substrate="local", out_dir=tmp_path, duration_s=30)
    rp = prepare_run(sc, opts)
    out = simulate(sim_inputs(rp, opts))  # any records will do
    started = time.perf_counter() - 5.0  # the command began 5 s ago
    write_results(rp, opts, out.submitted, out.records, out.history, [], False,
                  simulate_s=3.0, started=started)  # fmt: skip
    wall = json.loads((tmp_path / "summary.json").read_text())["wall"]
    assert wall["simulate_s"] == 3.0
    assert 0 < wall["results_s"] < wall["total_s"]
    assert wall["total_s"] >= 5.0
