"""#16 item 5: `testbed scorecard`, a policy against its baselines over the scenario library."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from testbed.cli import main
from testbed.errors import UserError
from testbed.metrics.scorecard import compare, mean_rows
from testbed.policy import POLICIES
from testbed.scenario.library import LIBRARY_DIR
from testbed.scenario.schema import load_scenario
from testbed.scenario.scorecard import HINDSIGHT, run_scorecard
from testbed.scenario.short import short_variant
from tests.policy.test_policy_plugins import make_package
from tests.scenario.test_hindsight import drop, short_scenario


def two(tmp_path: Path) -> list[str]:
    """Two short library scenarios: burst (no faults: judged by goodput) and a bandwidth drop."""
    burst = short_scenario(tmp_path, "burst", 60)
    return [str(burst), str(drop(tmp_path))]


@pytest.fixture(scope="module")
def card(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    lines: list[str] = []
    result = run_scorecard(
        "prfaas-static",
        baselines=["prfaas", "prfaas-static"],
        scenarios=two(tmp_path_factory.mktemp("sc")),
        seeds=[1, 2],
        jobs=2,
        log=lines.append,
    )
    result["_log"] = lines
    return result


def test_every_scenario_runs_policy_and_baselines_with_the_same_seeds(card: dict[str, Any]) -> None:
    assert card["baselines"] == ["prfaas"]  # the policy itself is not its own baseline
    assert [s["name"] for s in card["scenarios"]] == ["burst", "bandwidth-drop"]
    for sc in card["scenarios"]:
        mine = [r for r in card["rows"] if r["scenario"] == sc["name"]]
        for label in ("prfaas-static", "prfaas"):
            runs = [r for r in mine if r["label"] == label]
            assert sorted(r["seed"] for r in runs) == [1, 2]
            assert {r["policy"] for r in runs} == {label}
        for seed in (1, 2):  # the same requests for both policies
            assert len({r["requests"] for r in mine if r["seed"] == seed}) == 1
        assert set(sc["rows"]) == {"prfaas-static", "prfaas", HINDSIGHT}
        assert sc["rows"]["prfaas"]["checks"]["nothing_lost"] == "ok"
    runs = sum(1 for line in card["_log"] if line.startswith("["))
    assert runs == card["runs"] == len(card["rows"])  # a progress line per run


def test_deltas_are_policy_minus_baseline(card: dict[str, Any]) -> None:
    for sc in card["scenarios"]:
        me, base = sc["rows"]["prfaas-static"], sc["rows"]["prfaas"]
        d = sc["against"]["prfaas"]["deltas"]
        for key in ("goodput_rps", "slo_attainment", "ttft_p90_s", "cross_dc_gib"):
            assert d[key] == pytest.approx(me[key] - base[key])
    o = card["overall"]["prfaas"]
    assert o["win"] + o["tie"] + o["loss"] == o["scenarios"] == 2
    deltas = [sc["against"]["prfaas"]["deltas"]["slo_attainment"] for sc in card["scenarios"]]
    assert o["mean_slo_attainment_delta"] == pytest.approx(sum(deltas) / 2)


def test_the_hindsight_row_is_at_least_as_good_as_the_static_policy(card: dict[str, Any]) -> None:
    # the grid holds the planner's threshold at the running split and the same offered rate,
    # which is exactly the prfaas-static run: the best of the grid cannot be worse on the objective
    burst, bw = card["scenarios"]
    assert burst["objective"] == "goodput" and bw["objective"] == "ttft-p90-fault"
    static, best = burst["rows"]["prfaas-static"], burst["rows"][HINDSIGHT]
    assert best["goodput_rps"] >= static["goodput_rps"] - 1e-9
    static, best = bw["rows"]["prfaas-static"], bw["rows"][HINDSIGHT]
    assert best["ttft_p90_window_s"] <= static["ttft_p90_window_s"] + 1e-9
    assert len(bw["hindsight"]["thresholds"]) == 8
    assert "best of 8 thresholds by ttft-p90-fault" in bw["note"]


def test_verdicts() -> None:
    a = {"slo_attainment": 0.90, "ttft_p90_s": 10.0, "checks_ok": True}
    assert compare(a, {**a, "slo_attainment": 0.85})["verdict"] == "win"
    assert compare(a, {**a, "slo_attainment": 0.897})["verdict"] == "tie"
    assert compare(a, {**a, "slo_attainment": 0.897, "ttft_p90_s": 12.0})["verdict"] == "win"
    assert compare(a, {**a, "slo_attainment": 0.99, "checks_ok": False})["verdict"] == "win"
    assert compare({**a, "checks_ok": False}, a)["verdict"] == "loss"
    w = {"ttft_p90_window_s": 10.0, "goodput_rps": 1.0}
    assert compare(w, {**w, "ttft_p90_window_s": 12.0}, "ttft-p90-fault")["verdict"] == "win"
    assert compare(w, {**w, "ttft_p90_window_s": None}, "ttft-p90-fault")["verdict"] == "win"
    assert compare(w, {**w, "goodput_rps": 1.005}, "goodput")["verdict"] == "tie"
    assert compare(w, {**w, "goodput_rps": 1.5}, "goodput")["verdict"] == "loss"


def test_mean_over_seeds_keeps_the_worst_verdict() -> None:
    rows = [
        {"seed": 1, "slo_attainment": 0.8, "checks": {"failures": "ok"}},
        {"seed": 2, "slo_attainment": 0.6, "checks": {"failures": "failed"}},
    ]
    m = mean_rows(rows)
    assert m["slo_attainment"] == pytest.approx(0.7)
    assert m["checks"] == {"failures": "failed (1/2 seeds)"} and m["checks_ok"] is False
    assert mean_rows([*rows, {"seed": 3, "slo_attainment": None}])["slo_attainment"] is None


def test_cli_writes_the_files_and_skips_what_the_sim_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    burst = short_scenario(tmp_path, "burst", 40)
    args = ["--scenarios", f"real-model,{burst}", "--seeds", "3", "--no-hindsight", "--no-cache"]
    rc = main(["scorecard", "--policy", "prfaas-static", "--baseline", "prfaas", *args,
               "--out", str(out)])  # fmt: skip
    assert rc == 0
    printed = capsys.readouterr()
    assert "skipped real-model: prfaas-static: substrate sim" in printed.out
    assert "overall prfaas-static vs prfaas:" in printed.out and "s wall" in printed.out
    assert sum(line.startswith("[") for line in printed.err.splitlines()) == 2
    data = json.loads((out / "scorecard.json").read_text())
    assert [s["name"] for s in data["scenarios"]] == ["burst"]
    assert set(data["scenarios"][0]["rows"]) == {"prfaas-static", "prfaas"}  # no hindsight row
    md = (out / "scorecard.md").read_text()
    assert "| prfaas-static - prfaas |" in md and "## Skipped" in md
    assert (out / "scorecard.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_substrate_hindsight_and_quiet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a live substrate refuses the hindsight grid, before any run
    argv = ["scorecard", "--policy", "prfaas", "--substrate", "local", "--hindsight"]
    assert main(argv) == 2
    assert "sim substrate only" in capsys.readouterr().err
    burst = short_scenario(tmp_path, "burst", 40)
    base = ["scorecard", "--policy", "prfaas-static", "--baseline", "prfaas", "--seeds", "1"]
    rc = main([*base, "--scenarios", str(burst), "--jobs", "1", "--out", str(tmp_path / "a")])
    assert rc == 0
    err = capsys.readouterr().err
    assert "2 local process(es)" not in err and "1 local process(es)" in err
    assert sum(line.startswith("[") for line in err.splitlines()) == 2 + 8  # runs + hindsight
    cache = tmp_path / "cache"
    rc = main([*base, "--scenarios", "paper", "--no-hindsight", "--quiet", "--jobs", "2",
               "--out", str(tmp_path / "b"), "--cache", str(cache)])  # fmt: skip
    assert rc == 0
    err = capsys.readouterr().err
    assert "2 local process(es)" in err
    assert not any(line.startswith("[") for line in err.splitlines())
    assert len(list(cache.glob("*.json"))) == 2  # both runs kept for the next scorecard


@pytest.mark.parametrize(
    ("spec", "needle"),
    [("no_such_module_xyz:Policy", "policy plugin 'no_such_module_xyz:Policy': cannot import"),
     ("no-such-policy", "unknown policy 'no-such-policy'")],
)  # fmt: skip
def test_a_policy_that_cannot_load_stops_before_any_run(
    spec: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["scorecard", "--policy", spec, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
    with pytest.raises(UserError, match="unknown policy 'nope'"):
        run_scorecard("prfaas", baselines=["nope"])


def test_bad_arguments_are_one_line() -> None:
    with pytest.raises(UserError, match="substrate 'compose'"):
        run_scorecard("prfaas", substrate="compose")
    with pytest.raises(UserError, match="a seed given twice"):
        run_scorecard("prfaas", seeds=[1, 1])
    with pytest.raises(UserError, match="sim substrate only"):
        run_scorecard("prfaas", substrate="local", hindsight=True)


def test_the_local_short_version_is_the_chaos_suites() -> None:
    sc = short_variant(load_scenario(LIBRARY_DIR / "bandwidth-drop.yaml"))
    dep = sc.deployments["tiny"]
    assert dep.prfaas is not None and dep.prfaas.instances == 2
    assert dep.local.instances == 4 and sc.scale.time_scale == 20
    # 4 PrfaaS instances cut to 2: the bandwidth fault is cut in the same proportion
    assert sc.nemesis[0].model_dump()["bandwidth"] == pytest.approx(2.5e9 / 8)


def test_the_cache_gives_back_the_same_rows_and_only_for_library_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    args: dict[str, Any] = {"baselines": [], "seeds": [1], "hindsight": False, "cache": cache}
    first = run_scorecard("prfaas-static", scenarios=["paper"], **args)
    assert first["runs"] == 1 and first["cached_runs"] == 0
    assert len(list(cache.glob("*.json"))) == 1
    again = run_scorecard("prfaas-static", scenarios=["paper"], **args)
    assert again["cached_runs"] == 1 and again["rows"] == first["rows"]
    other = run_scorecard("prfaas-static", scenarios=["paper"], **{**args, "seeds": [2]})
    assert other["cached_runs"] == 0  # another seed is another run
    mine = short_scenario(tmp_path, "paper", 40, checkers=[])  # outside the library: not cached
    run_scorecard("prfaas-static", scenarios=[str(mine)], **args)
    assert len(list(cache.glob("*.json"))) == 2
    # outside code is never cached; the built-in baseline next to it still is
    monkeypatch.syspath_prepend(str(make_package(tmp_path, "scorerouting", "score-local")))
    try:
        plugin = run_scorecard(
            "scorerouting:AlwaysLocal",
            scenarios=["paper"],
            **{**args, "baselines": ["prfaas-static"]},
        )
    finally:
        POLICIES.forget_plugins()  # the registry is global: no plugin outlives its test
    assert plugin["runs"] == 2 and plugin["cached_runs"] == 1
    assert plugin["scenarios"][0]["rows"]["scorerouting:AlwaysLocal"]["cross_dc_gib"] == 0
    assert len(list(cache.glob("*.json"))) == 2


@pytest.mark.slow
def test_local_runs_the_short_versions_live(tmp_path: Path) -> None:
    burst = short_scenario(tmp_path, "burst", 60)  # 3 s of arrivals at time_scale 20
    card = run_scorecard(
        "prfaas-static",
        baselines=["prfaas"],
        substrate="local",
        scenarios=[str(burst)],
        seeds=[1],
        out=tmp_path / "out",
    )
    assert card["substrate"] == "local" and card["runs"] == 2
    (sc,) = card["scenarios"]
    assert set(sc["rows"]) == {"prfaas-static", "prfaas"}  # no hindsight row live
    for row in card["rows"]:
        assert (row["n_prefill"], row["n_decode"]) == (1, 3)  # the short deployment
        assert Path(row["results"], "summary.json").is_file()
        assert row["checks"]["nothing_lost"] == "ok" and row["failed"] == 0
