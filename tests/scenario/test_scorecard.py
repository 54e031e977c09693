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
from tests.policy.servers import PROMPT, Replay, serve
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
    a = {"slo_attainment": 0.90, "ttft_p90_s": 10.0, "goodput_rps": 1.0, "checks": {"x": "ok"}}
    failing = {"x": "failed (1/2 seeds)"}
    assert compare(a, {**a, "slo_attainment": 0.85})["verdict"] == "win"
    assert compare(a, {**a, "slo_attainment": 0.897})["verdict"] == "tie"
    assert compare(a, {**a, "slo_attainment": 0.897, "ttft_p90_s": 12.0})["verdict"] == "win"
    # a checker the baseline fails decides nothing against better figures (#30) ...
    assert compare(a, {**a, "slo_attainment": 0.99, "checks": failing})["verdict"] == "loss"
    # ... and breaks a tie only: against the side that fails it, whichever side that is
    assert compare(a, {**a, "checks": failing})["verdict"] == "win"
    assert compare({**a, "checks": failing}, a)["verdict"] == "loss"
    assert compare(a, {**a, "checks": {"x": "vacuous (1/1 seeds)"}})["verdict"] == "tie"
    w = {"ttft_p90_window_s": 10.0, "goodput_rps": 1.0}
    assert compare(w, {**w, "ttft_p90_window_s": 12.0}, "ttft-p90-fault")["verdict"] == "win"
    assert compare(w, {**w, "ttft_p90_window_s": None}, "ttft-p90-fault")["verdict"] == "win"
    assert compare(w, {**w, "goodput_rps": 1.005}, "goodput")["verdict"] == "tie"
    assert compare(w, {**w, "goodput_rps": 1.5}, "goodput")["verdict"] == "loss"


def test_each_verdict_names_the_criterion_that_decided_it() -> None:
    a = {"slo_attainment": 0.90, "ttft_p90_s": 10.0, "goodput_rps": 1.0, "checks": {}}
    assert compare(a, {**a, "slo_attainment": 0.869})["criterion"] == "SLO attainment +3.1 pt"
    assert compare(a, {**a, "ttft_p90_s": 12.5})["criterion"] == "P90 TTFT -20%"
    tied = compare(a, a)
    assert tied["verdict"] == "tie"
    assert tied["criterion"] == "SLO attainment within 0.5 pt, P90 TTFT within 5%"
    by_check = compare(a, {**a, "checks": {"ttft_p90_during_bandwidth": "failed (1/1 seeds)"}})
    assert by_check["criterion"].endswith(
        "checker ttft_p90_during_bandwidth fails for the baseline only"
    )
    assert by_check["gates"] == {"policy": [], "baseline": ["ttft_p90_during_bandwidth"]}
    w = {"ttft_p90_window_s": 9.0, "goodput_rps": 1.0}
    fault = compare(w, {**w, "ttft_p90_window_s": 10.0}, "ttft-p90-fault")
    assert fault["criterion"] == "P90 TTFT over the fault window -10%"
    assert compare(w, {**w, "goodput_rps": 0.9}, "goodput")["criterion"] == "goodput +11.1%"


# bandwidth-drop, seed 1, as issue #30 saw it: a round-robin plugin against prfaas-static
RATIO = "ttft_p90_during_bandwidth"
ROUND_ROBIN = {"slo_attainment": 0.613, "goodput_rps": 1.00, "ttft_p90_s": 43.4,
               "checks": {RATIO: "ok", "failures": "ok"}}  # fmt: skip
STATIC = {"slo_attainment": 0.840, "goodput_rps": 1.37, "ttft_p90_s": 17.9,
          "checks": {RATIO: "failed (1/1 seeds)", "failures": "ok"}}  # fmt: skip


def test_a_policy_worse_on_every_figure_is_never_a_win() -> None:
    cmp = compare(ROUND_ROBIN, STATIC)  # the baseline fails the ratio checker; RR passes it
    assert cmp["verdict"] == "loss", cmp
    assert cmp["criterion"] == "SLO attainment -22.7 pt"
    assert cmp["gates"]["baseline"] == ["ttft_p90_during_bandwidth"]  # shown beside, not deciding
    # within the ties but worse on all three at once: the checker cannot make it a win
    close = {**STATIC, "slo_attainment": 0.838, "goodput_rps": 1.36, "ttft_p90_s": 18.0,
             "checks": ROUND_ROBIN["checks"]}  # fmt: skip
    cmp = compare(close, STATIC)
    assert cmp["verdict"] == "tie"
    assert cmp["criterion"].endswith("but worse on SLO attainment, goodput and P90 TTFT")
    # nor a loss for one better on all three that fails a checker the other passes
    better = {**STATIC, "slo_attainment": 0.842, "goodput_rps": 1.38, "ttft_p90_s": 17.8}
    assert compare(better, close)["verdict"] == "tie"


def test_round_robin_on_bandwidth_drop_is_not_a_win(monkeypatch: pytest.MonkeyPatch) -> None:
    """The case of issue #30 on the sim: the whole bandwidth-drop scenario, one seed."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))
    rr = "tests.scenario.round_robin:RoundRobin"
    try:
        card = run_scorecard(rr, scenarios=["bandwidth-drop"], seeds=[1], hindsight=False)
    finally:
        POLICIES.forget_plugins()
    (sc,) = card["scenarios"]
    me = sc["rows"][rr]
    for base in ("prfaas", "prfaas-static"):
        them, cmp = sc["rows"][base], sc["against"][base]
        # the premise: worse on every figure, yet the only one to pass the ratio checker
        assert me["slo_attainment"] < them["slo_attainment"] - 0.1
        assert me["goodput_rps"] < them["goodput_rps"] and me["ttft_p90_s"] > them["ttft_p90_s"]
        assert me["checks"]["ttft_p90_during_bandwidth"] == "ok"
        assert them["checks"]["ttft_p90_during_bandwidth"].startswith("failed")
        assert cmp["verdict"] == "loss" and cmp["criterion"].startswith("SLO attainment -"), cmp
        assert cmp["gates"]["baseline"] == ["ttft_p90_during_bandwidth"]
    assert sc["judged"] and sc["policy_share"]["share"] == 1.0
    assert card["overall"]["prfaas"]["win"] == 0


def test_a_cell_the_fallback_decided_is_not_judged() -> None:
    seeds = [{"seed": 1, "slo_attainment": 0.9, "checks": {},
              "decisions": {"policy": 0, "fallback": 300, "reasons": {"status": 300}}},
             {"seed": 2, "slo_attainment": 0.9, "checks": {},
              "decisions": {"policy": 1, "fallback": 199,
                            "reasons": {"status": 190, "timeout": 9}}}]  # fmt: skip
    mine = mean_rows(seeds)
    assert mine["policy_share"]["share"] == pytest.approx(1 / 500)
    assert mine["policy_share"]["reasons"] == {"status": 490, "timeout": 9}
    worse = {"slo_attainment": 0.5, "checks": {}}
    for objective in (None, "goodput", "ttft-p90-fault"):  # never a win, tie or loss
        cmp = compare(mine, worse, objective)
        assert cmp["verdict"] == "not judged"
        assert cmp["criterion"] == "not judged (100% by the fallback: status 490, timeout 9)"
    # the bound is the scorecard's: at 0 every cell is judged; at 0.99 one fallback in 100 is fine
    assert compare(mine, worse, min_share=0.0)["verdict"] == "win"
    ok = mean_rows([{**seeds[0], "decisions": {"policy": 99, "fallback": 1, "reasons": {}}}])
    assert compare(ok, worse)["verdict"] == "win"
    assert mean_rows([{"seed": 1, "checks": {}}])["policy_share"] is None  # rows that do not say


def test_cli_a_service_answering_500_is_not_judged_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Acceptance (#30), cut short: every decision falls back, so no cell is judged."""
    burst = short_scenario(tmp_path, "burst", 40)
    out = tmp_path / "out"
    with serve(Replay(500, '{"error": "down"}').app()) as base:
        policy = f"{base}/route#{PROMPT}&fallback=prfaas-static"
        argv = ["scorecard", "--policy", policy, "--scenarios", str(burst), "--seeds", "1",
                "--no-cache", "--out", str(out)]  # fmt: skip
        rc = main(argv)
        printed = capsys.readouterr().out
        assert rc == 1, printed
        # with no bound, the same runs are judged (and exit 0)
        assert main([*argv, "--min-policy-share", "0", "--out", str(tmp_path / "any")]) == 0
        assert "not judged" not in capsys.readouterr().out
    POLICIES.forget_plugins()
    data = json.loads((out / "scorecard.json").read_text())
    (sc,) = data["scenarios"]
    n = sc["policy_share"]["fallback"]
    assert n > 0 and sc["policy_share"]["policy"] == 0 and sc["policy_share"]["min"] == 0.99
    assert sc["policy_share"]["reasons"] == {"status": n} and sc["judged"] is False
    assert {c["verdict"] for c in sc["against"].values()} == {"not judged"}
    assert f"burst: not judged (100% by the fallback: status {n})" in printed
    short = base + "/route"  # the URL's short label, its fragment's settings stripped
    for other in ("prfaas", "hindsight-best"):
        line = (f"overall {short} vs {other}: 0 wins, 0 ties, 0 losses, 1 not judged (the "
                "fallback decided more than 1% of the routes) over 1 scenarios")  # fmt: skip
        assert line in printed, printed
    assert data["overall"]["prfaas"]["not_judged"] == 1
    md = (out / "scorecard.md").read_text()
    assert "#timeout" not in md and f"# Scorecard: {short}" in md
    assert f"**not judged (100% by the fallback: status {n})**" in md


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
