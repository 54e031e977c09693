"""`testbed scorecard --router` (testbed.scenario.scorecard_router): argument checks, the
scenarios it picks and how it cuts them, the expected wall time, and the card it assembles
(its live runs replaced by made-up rows: no process starts there); and one cheap live run of
the whole path (marked chaos and routers: 2 runs of 8 s, about 45 s of wall)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.cli import main
from testbed.errors import UserError
from testbed.scenario import scorecard_router as sr
from testbed.scenario.library import LIBRARY_DIR, library_scenarios
from testbed.scenario.schema import load_scenario
from testbed.scenario.scorecard import Entry


def _load(name: str) -> Any:
    return load_scenario(LIBRARY_DIR / f"{name}.yaml")


def test_the_timeline_is_scaled_into_the_duration() -> None:
    sc = sr.fit_timeline(_load("partition"), 45.0)  # 60-100 s of 180 s
    (ev,) = sc.nemesis
    assert (ev.at, ev.end) == pytest.approx((15.0, 25.0))
    crash = sr.fit_timeline(_load("prefill-crash"), 60.0)  # 180 s: a third
    spans = [(ev.action, ev.at, ev.end) for ev in crash.nemesis]
    assert spans == [
        ("kill", pytest.approx(40 / 3), pytest.approx(80 / 3)),
        ("kill", pytest.approx(100 / 3), pytest.approx(130 / 3)),
        ("pause", pytest.approx(140 / 3), pytest.approx(150 / 3)),
    ]
    burst = _load("burst")
    assert sr.fit_timeline(burst, 45.0) is burst  # no faults: nothing to move
    long = _load("partition")
    assert sr.fit_timeline(long, 500.0) is long  # a longer run keeps the timeline


def test_every_row_runs_the_short_deployment_at_time_scale_1() -> None:
    sc = sr.short_for_router(_load("bandwidth-drop"), 45.0)
    dep = sc.deployments["tiny"]
    assert dep.prfaas is not None and dep.prfaas.instances == 2
    assert (dep.local.prefill, dep.local.decode) == (1, 3)
    assert sc.scale.time_scale == 1 and sc.duration == 45.0
    (ev,) = sc.nemesis  # 60-120 s of 200 s, at 2.5 Gbps after the short version's cut
    assert (ev.at, ev.end) == pytest.approx((13.5, 27.0))
    assert ev.model_dump()["bandwidth"] == pytest.approx(2.5e9 / 8)


def test_the_default_scenarios_are_four_and_every_other_one_says_why() -> None:
    assert len(sr.ROUTER_SCENARIOS) <= 4
    names = {p.stem for p in library_scenarios()}
    assert set(sr.ROUTER_SCENARIOS) <= names
    assert set(sr.LEFT_OUT) == names - set(sr.ROUTER_SCENARIOS)  # a new scenario needs a word


@pytest.mark.parametrize("router", ["sglang-router", "vllm-router:round_robin"])
def test_the_default_scenarios_pass_the_external_runs_own_checks(router: str) -> None:
    for name in sr.ROUTER_SCENARIOS:
        base = sr.short_for_router(_load(name), sr.DEFAULT_DURATION_S)
        n = sr._preflight(sr._router(base, router), base, sr.ROUTER_BASELINES)
        assert n > 10, name


def test_the_expected_wall_time() -> None:
    expected, bound = sr.expected_wall_s(12, 45.0)
    assert expected == 12 * (45.0 + sr.RUN_OVERHEAD_S)
    assert bound == expected + 12 * sr.DRAIN_S
    assert expected <= 15 * 60  # the default scorecard: 4 scenarios x 3 rows x 1 seed
    line = sr.estimate_text(12, 45.0)
    assert line.startswith("scorecard: 12 live runs of 45 s at time_scale 1: expected wall time")
    assert f"~{expected / 60:.0f} min" in line and f"at most {bound / 60:.0f} min" in line


NONE_DECIDED = {"policy": 0, "fallback": 0, "reasons": {}, "left_out": 0, "share": None}


def _fake_rows(
    entries: Sequence[Entry], specs: Sequence[str], seeds: Sequence[int], *_: Any
) -> list[dict[str, Any]]:
    """run_local's rows without a process: the router 10 points under the baselines."""
    rows = []
    for e in entries:
        for i, spec in enumerate(specs):
            for seed in seeds:
                rows.append(
                    {
                        "scenario": e.name,
                        "label": spec,
                        "policy": "prfaas-static" if i == 0 else spec,
                        "seed": seed,
                        "requests": 40,
                        "failed": 0,
                        "goodput_rps": 0.5 if i else 0.4,
                        "slo_attainment": 0.9 if i else 0.8,
                        "ttft_p90_s": 5.0,
                        "checks": {"nothing_lost": "ok"},
                        "decisions": NONE_DECIDED,  # what an idle policy of ours records
                    }
                )
    return rows


def test_the_card_has_the_router_as_the_policy_and_judges_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sr, "run_local", _fake_rows)
    out = tmp_path / "out"
    argv = ["scorecard", "--router", "sglang-router", "--scenarios", "partition,real-model",
            "--duration", "30s", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr()
    err = printed.err.splitlines()
    assert err[0].startswith("scorecard: skip real-model: ")  # the torch engine, refused
    assert err[1].startswith("scorecard: 3 live runs of 30 s at time_scale 1: expected wall")
    assert "overall sglang-router:cache_aware vs prfaas: 0 wins, 0 ties, 1 losses" in printed.out
    card = json.loads((out / "scorecard.json").read_text())
    assert card["policy"] == "sglang-router:cache_aware"
    assert card["baselines"] == ["prfaas", "prfaas-static"] and card["seeds"] == [1]
    assert card["router"]["duration_s"] == 30.0 and card["router"]["time_scale"] == 1
    assert set(card["skipped"]) == {"real-model"}
    (sc,) = card["scenarios"]
    assert sc["judged"] and sc["policy_share"]["share"] == 1.0
    assert sc["policy_share"]["by"] == "router"
    assert sc["against"]["prfaas"]["verdict"] == "loss"
    assert "partition 10.0-16.7 s" in sc["note"]
    mine = [r for r in card["rows"] if r["label"] == "sglang-router:cache_aware"]
    assert [r["policy"] for r in mine] == ["sglang-router:cache_aware"]
    md = (out / "scorecard.md").read_text()
    assert "External router: sglang-router:cache_aware in front of the short deployment" in md
    assert "Decided by sglang-router:cache_aware: all 40 routes (our policy none)." in md
    assert "| sglang-router:cache_aware - prfaas |" in md


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--router", "sglang-router", "--substrate", "sim"], "local substrate only (not sim)"),
        (["--router", "nope"], "--router nope: preset: Input should be"),
        (["--router", "vllm-router:bogus"], "vllm-router has no policy 'bogus'"),
        (["--router", "vllm-router", "--hindsight"], "--hindsight runs on the sim substrate"),
        (["--policy", "prfaas", "--duration", "30s"], "--duration: only with --router"),
        (["--router", "vllm-router", "--seeds", "1,1"], "a seed given twice"),
        (["--router", "vllm-router", "--baseline", "nope"], "unknown policy 'nope'"),
        (["--router", "vllm-router", "--scenarios", "real-model"], "no scenario to run"),
    ],
)
def test_bad_router_arguments_are_one_line_before_any_run(
    argv: list[str],
    needle: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[Any] = []

    def no_run(*args: Any) -> list[dict[str, Any]]:
        ran.append(args)
        return []

    monkeypatch.setattr(sr, "run_local", no_run)
    out = tmp_path / "out"
    assert main(["scorecard", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert needle in err[-1]  # the error, one line (a skipped scenario says so above it)
    assert not ran and not out.exists()


def test_policy_or_router_exactly_one(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["scorecard"], ["scorecard", "--policy", "prfaas", "--router", "vllm-router"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "one of the arguments --policy --router is required" in err
    assert "not allowed with argument" in err


def test_run_router_scorecard_refuses_other_substrates() -> None:
    with pytest.raises(UserError, match="local substrate only"):
        sr.run_router_scorecard("vllm-router", substrate="compose")


TINY = {
    "name": "router-scorecard-tiny",
    "seed": 5,
    "duration": "10s",
    "scale": {"time_scale": 1, "byte_scale": 2000},
    "deployments": {
        "prfaas-pd": {
            "kind": "prfaas-pd",
            "prfaas": {"hardware": "h200x8", "instances": 2},
            "local": {"hardware": "h20x8", "instances": 4, "prefill": 1, "decode": 3},
            "link": {"bandwidth": "100Gbps", "rtt": "10ms", "connections": 2},
        }
    },
    "workload": {
        "lengths": {"kind": "lognormal", "mu": 6.5, "sigma": 0.8, "min": 128, "max": "2K"},
        "output_tokens": 16,
        "arrivals": {"process": "uniform", "rate": 2.0},
    },
    "policy": {"name": "prfaas-static", "threshold": "1K"},
    "nemesis": [{"action": "kill", "at": "4s", "for": "4s", "target": "prfaas-prefill-0"}],
}


@pytest.mark.chaos
@pytest.mark.routers  # the `routers` extra (make test installs it)
@pytest.mark.timeout(150)
def test_one_router_scenario_live(tmp_path: Path) -> None:
    """The whole path once, live: vllm-router and prfaas-static on the same short fleet at
    time_scale 1, 8 s of small requests with a prefill kill scaled into them (2 runs)."""
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    lines: list[str] = []
    card = sr.run_router_scorecard(
        "vllm-router:round_robin",
        baselines=["prfaas-static"],
        scenarios=[str(path)],
        duration_s=8.0,
        out=tmp_path / "out",
        log=lines.append,
    )
    assert lines[0].startswith("scorecard: 2 live runs of 8 s at time_scale 1")
    assert card["runs"] == 2 and card["policy"] == "vllm-router:round_robin"
    (sc,) = card["scenarios"]
    assert "kill 3.2-6.4 s" in sc["note"] and sc["judged"]
    for label, row in sc["rows"].items():
        assert row["checks"]["nothing_lost"] == "ok", (label, row["checks"])
    mine = [r for r in card["rows"] if r["label"] == "vllm-router:round_robin"]
    (row,) = mine
    assert row["decisions"]["share"] == 1.0 and row["requests"] == 16
    assert Path(row["results"], "logs", "router-vllm-router.log").is_file()
    assert (row["n_prefill"], row["n_decode"]) == (1, 3)


def test_router_and_duration_reach_the_router_scorecard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--router` scores the router instead of a policy, `--duration` sets each run's
    arrivals (and with them the expected time printed first)."""
    import testbed.cli.scorecard as cli_scorecard

    seen: list[tuple[str, float]] = []

    def fake(router: str, **kw: Any) -> dict[str, Any]:
        seen.append((router, kw["duration_s"]))
        raise UserError("stop here")

    monkeypatch.setattr(cli_scorecard, "run_router_scorecard", fake)
    out = str(tmp_path / "o")
    assert main(["scorecard", "--router", "sglang-router:round_robin", "--out", out]) == 2
    assert main(["scorecard", "--router", "vllm-router", "--duration", "20s", "--out", out]) == 2
    assert seen == [("sglang-router:round_robin", sr.DEFAULT_DURATION_S), ("vllm-router", 20.0)]
    assert main(["scorecard", "--policy", "prfaas", "--duration", "20s", "--out", out]) == 2
    assert "--duration: only with --router" in capsys.readouterr().err
