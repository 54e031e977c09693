"""#15 item 5: `testbed sweep` runs a grid of what-ifs on the sim and tabulates them."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from testbed.cli import main
from testbed.errors import UserError
from testbed.metrics.sweep import pareto_front
from testbed.scenario.library import LIBRARY_DIR
from testbed.scenario.sweep import (
    Cell,
    cell_scenario,
    cells,
    parse_set,
    parse_setting,
    run_cell,
    run_grid,
    scenario_with_settings,
)

PAPER = LIBRARY_DIR / "paper.yaml"
BW = "deployments.prfaas-pd.link.bandwidth"
N = "deployments.prfaas-pd.prfaas.instances"


@pytest.mark.parametrize(
    ("text", "needle"),
    [("x", "path=value1"), ("=1,2", "path=value1"), ("a..b=1", "not a dotted path"),
     ("a=1,,2", "an empty value"), ("a=1,1", "a value given twice")],
)  # fmt: skip
def test_bad_sets_are_one_line(text: str, needle: str) -> None:
    with pytest.raises(UserError, match=needle):
        parse_set(text)


def test_one_setting_keeps_its_commas_and_names_its_mistakes() -> None:
    fixed = "workload.lengths={kind: fixed, tokens: 100}"
    assert parse_setting(fixed) == ("workload.lengths", "{kind: fixed, tokens: 100}")
    for text, needle in (("x", "path=value"), ("a=", "path=value"), ("a..b=1", "dotted")):
        with pytest.raises(UserError, match=needle):
            parse_setting(text)
    sc = scenario_with_settings(PAPER, [parse_setting(fixed)])
    assert sc.workload.lengths is not None and sc.workload.lengths.kind == "fixed"


def test_the_grid_is_the_product_of_the_axes() -> None:
    axes = [parse_set(f"{BW}=10Gbps,100Gbps"), parse_set(f"{N}=2,4,8")]
    grid = cells(PAPER, axes)
    assert len(grid) == 6
    assert grid[0].settings == ((BW, "10Gbps"), (N, "2"))
    assert grid[-1].settings == ((BW, "100Gbps"), (N, "8"))
    with pytest.raises(UserError, match="each path may be --set once"):
        cells(PAPER, [parse_set("seed=1"), parse_set("seed=2")])


def test_a_cell_is_the_file_with_its_values_written_in() -> None:
    sc = cell_scenario(
        Cell(str(PAPER), ((BW, "25Gbps"), (N, "6"), ("workload.arrivals.load", "0.5")))
    )
    dep = sc.deployments["prfaas-pd"]
    assert dep.link is not None and dep.link.bandwidth == pytest.approx(25e9 / 8)
    assert dep.prfaas is not None and dep.prfaas.instances == 6
    assert sc.workload.arrivals.load == 0.5
    with pytest.raises(UserError, match=rf"{BW}: 25 has no unit.*with --set {BW}=25"):
        cell_scenario(Cell(str(PAPER), ((BW, "25"),)))
    with pytest.raises(UserError, match="unknown field; did you mean 'bandwidth'"):
        cell_scenario(Cell(str(PAPER), (("deployments.prfaas-pd.link.bandwith", "1Gbps"),)))


def test_a_name_with_dots_is_one_step_of_a_path() -> None:
    # thesis.yaml's dense deployment is called minimax-m2.5: its link is there to be swept
    thesis = LIBRARY_DIR / "thesis.yaml"
    sc = cell_scenario(
        Cell(str(thesis), (("deployments.minimax-m2.5.link.bandwidth", "200Gbps"),
                           ("deployments.minimax-m2.5.local.prefill", "4"),
                           ("deployments.minimax-m2.5.local.decode", "4")))
    )  # fmt: skip
    dep = sc.deployments["minimax-m2.5"]
    assert dep.link is not None and dep.link.bandwidth == pytest.approx(200e9 / 8)
    assert dep.local is not None and dep.local.prefill == 4
    assert sc.deployments["kimi-linear-48b"].link.bandwidth == pytest.approx(100e9 / 8)
    # where no key has the dots, the parts are steps as before: a new deployment minimax-m2
    with pytest.raises(UserError, match=r"deployments\.minimax-m2\.kind"):
        cell_scenario(Cell(str(thesis), (("deployments.minimax-m2.local.prefill", "4"),)))


def test_a_cell_row_has_the_sims_figures_next_to_the_planners() -> None:
    row = run_cell(Cell(str(PAPER), ((N, "4"),)))
    assert row[N] == "4" and row["policy"] == "prfaas-static" and row["gpus"] == 96
    assert row["planner_lambda_max_rps"] == pytest.approx(3.22, abs=0.01)
    assert 0 < row["throughput_rps"] <= row["offered_rps"] * 1.05
    assert row["sim_saturation_rps"] == pytest.approx(3.13, rel=0.05)  # live: 3.11
    assert row["flagged"] is False
    assert row == run_cell(Cell(str(PAPER), ((N, "4"),)))  # a pure function of the cell


def test_a_pool_gives_the_same_rows_as_one_process() -> None:
    todo = cells(PAPER, [parse_set(f"{N}=2,4")], saturation=False)
    seen: list[int] = []
    serial = run_grid(todo, jobs=1, on_row=lambda i, r: seen.append(i))
    assert run_grid(todo, jobs=2) == serial
    assert sorted(seen) == [0, 1] and "sim_saturation_rps" not in serial[0]


def test_pareto_front() -> None:
    rows = [
        {"ttft_p90_s": 5.0, "goodput_per_gpu": 0.03},
        {"ttft_p90_s": 4.0, "goodput_per_gpu": 0.02},
        {"ttft_p90_s": 6.0, "goodput_per_gpu": 0.02},  # beaten by the first
        {"ttft_p90_s": 9.0, "goodput_per_gpu": 0.04},
    ]
    assert pareto_front(rows) == [1, 0, 3]


def test_cli_writes_the_table_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sw"
    argv = [
        "sweep",
        "paper",
        "--set",
        f"{BW}=10Gbps,100Gbps",
        "--set",
        f"{N}=2,4",
        "--out",
        str(out),
    ]
    assert main([*argv, "--jobs", "2"]) == 0
    captured = capsys.readouterr()
    assert captured.err.count("] ") == 4  # a line per finished cell
    assert "4 cells" in captured.out and (out / "sweep.png").stat().st_size > 0
    with (out / "sweep.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r[BW], r[N]) for r in rows] == [
        ("10Gbps", "2"),
        ("10Gbps", "4"),
        ("100Gbps", "2"),
        ("100Gbps", "4"),
    ]
    assert all(r["sim_saturation_rps"] and r["planner_lambda_max_rps"] for r in rows)
    md = (out / "sweep.md").read_text()
    assert "sim saturation" in md and "planner lambda_max" in md and "Pareto front" in md
    assert main([*argv, "--no-saturation", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "] " not in captured.err and "sim saturation" not in (out / "sweep.md").read_text()


def test_ray_without_ray_or_cluster_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["sweep", "paper", "--set", f"{N}=2", "--ray", "127.0.0.1:1", "--out", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("testbed: error: --ray")
