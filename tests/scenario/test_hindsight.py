"""#18 item 1: `testbed hindsight`, the best fixed threshold (and PD split) on the sim."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.cli import main
from testbed.config import load_yaml
from testbed.errors import UserError
from testbed.metrics.records import RequestRecord
from testbed.metrics.scorecard import fault_window, window_percentile
from testbed.scenario.hindsight import (
    best_fixed,
    default_splits,
    default_thresholds,
    plan_hindsight,
)
from testbed.scenario.library import LIBRARY_DIR
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.schema import load_scenario
from testbed.scenario.sweep import cell_scenario


def short_scenario(tmp_path: Path, name: str, duration: int, **changes: Any) -> Path:
    """A library scenario cut short (`changes` replaces top-level keys), as a file."""
    data = load_yaml(LIBRARY_DIR / f"{name}.yaml")
    data.update({"duration": f"{duration}s", **changes})
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def drop(tmp_path: Path) -> Path:
    """bandwidth-drop in 80 s: 100 -> 5 Gbps from 20 s to 50 s, checkers that fit."""
    return short_scenario(
        tmp_path,
        "bandwidth-drop",
        80,
        nemesis=[{"action": "bandwidth", "at": "20s", "for": "30s", "bandwidth": "5Gbps"}],
        checkers=[{"check": "failures", "max_fraction": 0}],
    )


def rec(i: int, arrival: float, ttft: float | None) -> RequestRecord:
    r = RequestRecord(id=f"r{i}", input_tokens=10, output_tokens=2, arrival=arrival)
    if ttft is not None:
        r.status = "completed"
        r.first_token = arrival + ttft
    return r


def test_window_p90_counts_a_failure_as_infinite() -> None:
    recs = [rec(i, 10.0 + i, float(i + 1)) for i in range(10)]  # TTFT 1..10 s
    assert window_percentile(recs, 0, 100) == pytest.approx(9.1)
    assert window_percentile(recs, 10, 14) == pytest.approx(4.6)  # arrivals 10..14 only
    assert window_percentile(recs, 200, 300) is None
    recs[-1] = rec(9, 19.0, None)  # the slowest one failed instead: the P90 cannot improve
    assert math.isinf(window_percentile(recs, 0, 100) or 0.0)
    recs[-1] = rec(9, 99.0, None)  # outside the window: not counted
    assert window_percentile(recs, 0, 20) == pytest.approx(8.2)


def test_fault_window_spans_first_start_to_last_end() -> None:
    def window(name: str) -> tuple[float, float]:
        opts = RunOptions(substrate="sim", progress=False)
        rp = prepare_run(load_scenario(LIBRARY_DIR / f"{name}.yaml"), opts)
        return fault_window(rp.faults, rp.duration_s)

    # kill 50-90 s, restart at 110 s (instantaneous), pause 140-150 s
    assert window("decode-crash") == (50.0, 150.0)
    assert window("burst") == (0.0, 240.0)  # no faults: the whole run


def test_default_grids() -> None:
    ts = default_thresholds(19_500)
    assert len(ts) == 8 and 19_500 in ts
    assert ts[0] == pytest.approx(19_500 / 4, abs=1) and ts[-1] == pytest.approx(55_154, abs=1)
    assert all(b / a == pytest.approx(2**0.5, rel=1e-3) for a, b in itertools.pairwise(ts))
    assert default_splits(8, 3) == [2, 3, 4]
    assert default_splits(4, 1) == [1, 2]  # each role keeps an instance
    assert default_splits(2, 1) == [1]


def test_every_setting_is_offered_the_same_requests(tmp_path: Path) -> None:
    hp = plan_hindsight(drop(tmp_path), [1], "ttft-p90-fault", thresholds=[5000, 40_000])
    assert hp.window_s == (20.0, 50.0)
    settings = [dict(c.settings) for c in hp.cells]
    assert len(settings) == 2 * 3  # two thresholds x the running split and one either side
    rates = {s["workload.arrivals.rate"] for s in settings}
    assert len(rates) == 1 and float(rates.pop()) == pytest.approx(hp.offered_rps)
    assert all(s["workload.arrivals.load"] == "null" for s in settings)
    key = "deployments.prfaas-pd.local.prefill"  # pinned: a fixed t would re-plan the split
    pinned = {(s["policy.threshold"], s[key]) for s in settings}
    assert pinned == {(t, p) for t in ("5000", "40000") for p in ("2", "3", "4")}


def test_overrides_search_a_variant_of_the_scenario() -> None:
    # thesis.yaml runs the hybrid model; the dense one is another deployment of the same file
    thesis, dense_60s = (
        LIBRARY_DIR / "thesis.yaml",
        [("deployment", "minimax-m2.5"), ("duration", "60s")],
    )
    hp = plan_hindsight(thesis, [19], "goodput", thresholds=[30_000], sweep_split=False,
                        overrides=dense_60s)  # fmt: skip
    assert len(hp.cells) == 1
    cell = hp.cells[0]
    settings = dict(cell.settings)
    assert settings["deployment"] == "minimax-m2.5" and settings["duration"] == "60s"
    assert settings["deployments.minimax-m2.5.local.prefill"] == "3"
    dense = cell_scenario(cell)
    assert dense.deployment == "minimax-m2.5" and dense.duration == 60.0
    hybrid = plan_hindsight(thesis, [19], "goodput", thresholds=[30_000], sweep_split=False)
    assert hybrid.window_s == (0.0, 240.0) and hp.window_s == (0.0, 60.0)  # planned on the variant
    assert dict(hybrid.cells[0].settings)["deployment"] == "internal-1t-hybrid"


def test_best_fixed_keeps_the_best_mean_over_seeds(tmp_path: Path) -> None:
    result = best_fixed(
        drop(tmp_path), [1, 2], "ttft-p90-fault", thresholds=[5000, 40_000], sweep_split=False
    )
    assert len(result.rows) == 4 and len(result.settings) == 2
    by_seed: dict[Any, set[int]] = {}
    for r in result.rows:  # the same requests at every threshold, seed by seed
        by_seed.setdefault(r["seed"], set()).add(r["requests"])
    assert all(len(v) == 1 for v in by_seed.values())
    for s in result.settings:
        mine = [r for r in result.rows if r["threshold_tokens"] == s["threshold_tokens"]]
        assert s["ttft_p90_window_s"] == pytest.approx(
            sum(r["ttft_p90_window_s"] for r in mine) / 2
        )
    best = min(result.settings, key=lambda s: s["ttft_p90_window_s"])
    assert result.best["threshold_tokens"] == best["threshold_tokens"]
    assert result.best["objective_value"] == pytest.approx(best["ttft_p90_window_s"])
    by_goodput = best_fixed(
        drop(tmp_path), [1, 2], "goodput", thresholds=[5000, 40_000], sweep_split=False
    )
    top = max(by_goodput.settings, key=lambda s: s["goodput_rps"])
    assert by_goodput.best["threshold_tokens"] == top["threshold_tokens"]


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [({"splits": [0]}, "--splits 0: the local cluster has 8 instances"),
     ({"thresholds": [0.5]}, "positive token count"),
     ({"objective": "latency"}, "objective 'latency'"),
     ({"seeds": []}, "at least one seed")],
)  # fmt: skip
def test_bad_hindsight_arguments_are_one_line(kwargs: dict[str, Any], needle: str) -> None:
    args: dict[str, Any] = {"seeds": [1], "objective": "goodput", **kwargs}
    with pytest.raises(UserError, match=needle):
        plan_hindsight("burst", args.pop("seeds"), args.pop("objective"), **args)


def test_a_deployment_without_prfaas_is_refused(tmp_path: Path) -> None:
    path = short_scenario(
        tmp_path,
        "paper",
        60,
        deployment="homogeneous",
        policy={"name": "homogeneous"},
        checkers=[],
    )
    with pytest.raises(UserError, match="on a prfaas-pd deployment"):
        plan_hindsight(path, [1], "goodput")


def test_cli_writes_the_table_and_prints_the_best(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["hindsight", str(drop(tmp_path)), "--thresholds", "5K,40K", "--splits", "3,4"]
    rc = main([*argv, "--seeds", "1", "--objective", "goodput", "--out", str(out), "--jobs", "1"])
    assert rc == 0
    printed = capsys.readouterr()
    assert "best fixed setting: threshold" in printed.out
    assert sum(line.startswith("[") for line in printed.err.splitlines()) == 4  # one per run
    rows = (out / "hindsight.csv").read_text().splitlines()
    assert len(rows) == 1 + 4
    data = json.loads((out / "hindsight.json").read_text())
    assert data["objective"] == "goodput" and {s["n_prefill"] for s in data["settings"]} == {3, 4}
    assert "**best**" in (out / "hindsight.md").read_text()
    capsys.readouterr()
    rc = main(["hindsight", "burst", "--no-splits", "--seeds", "1", "--quiet", "--thresholds",
               "19.5K", "--out", str(tmp_path / "q")])  # fmt: skip
    assert rc == 0
    assert not any(line.startswith("[") for line in capsys.readouterr().err.splitlines())


def test_cli_set_changes_the_scenario_the_grid_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["hindsight", "jitter", "--no-splits", "--seeds", "1", "--quiet", "--thresholds",
            "19.5K"]  # fmt: skip
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    assert "objective ttft-p90-fault" in capsys.readouterr().err  # jitter has a fault
    quiet = ["--set", "nemesis=[]", "--set", "checkers=[]", "--set", "workload.arrivals.load=0.2"]
    assert main([*argv, *quiet, "--out", str(tmp_path / "b")]) == 0
    assert "objective goodput" in capsys.readouterr().err  # no fault left: the other objective
    a, b = (json.loads((tmp_path / d / "hindsight.json").read_text()) for d in "ab")
    assert b["rows"][0]["goodput_rps"] < 0.5 * a["rows"][0]["goodput_rps"]


def test_cli_refuses_a_live_substrate(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hindsight", "burst", "--substrate", "local"]) == 2
    assert "sim substrate only" in capsys.readouterr().err
