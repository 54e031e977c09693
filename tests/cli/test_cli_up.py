"""`testbed up` and `--percentiles`: each flag reaches the plan or the options the standing
deployment (scenario.standing) is run with; the live behaviour is in
tests/scenario/test_standing.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from testbed.cli import main
from testbed.scenario.plan import RunOptions, RunPlan, RunResult
from testbed.scenario.standing import Endpoints

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "tests" / "data" / "tiny.yaml")


@pytest.fixture
def ups(monkeypatch: pytest.MonkeyPatch) -> list[tuple[RunPlan, RunOptions, bool]]:
    """`testbed up` with the standing deployment replaced: what it would have stood up."""
    import testbed.cli.up as cli_up

    seen: list[tuple[RunPlan, RunOptions, bool]] = []

    async def fake(
        rp: RunPlan, opts: RunOptions, *, faults: bool, on_ready: Any, **_kw: Any
    ) -> RunResult:
        seen.append((rp, opts, faults))
        on_ready(Endpoints("http://r/v1", "http://r", None, {"router": "http://r/metrics"}))
        return RunResult(opts.out_dir, [], [], {}, [])

    monkeypatch.setattr(cli_up, "stand_up", fake)
    monkeypatch.setattr(cli_up, "to_text", lambda summary: "summary")
    return seen


def test_up_runs_at_time_scale_1_with_faults_by_default(
    ups: list[tuple[RunPlan, RunOptions, bool]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["up", TINY, "--out", str(tmp_path / "o")]) == 0
    (rp, opts, faults), = ups  # fmt: skip
    assert rp.scenario.scale.time_scale == 1.0  # tiny.yaml says 20
    assert faults and opts.out_dir == tmp_path / "o" and opts.substrate == "local"
    assert rp.policy == "prfaas-static" and opts.percentiles == (50.0, 90.0, 99.0)
    out = capsys.readouterr()
    assert (
        "OpenAI base URL:  http://r/v1" in out.out and "metrics router: http://r/metrics" in out.out
    )
    assert "warning" not in out.err


def test_up_flags_reach_the_plan_and_the_options(
    ups: list[tuple[RunPlan, RunOptions, bool]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["up", TINY, "--out", str(tmp_path / "p"), "--policy", "prfaas", "--substrate",
            "compose", "--time-scale", "4", "--no-faults", "--percentiles", "95,99.9"]  # fmt: skip
    assert main(argv) == 0
    rp, opts, faults = ups[0]
    assert (rp.policy, opts.substrate, opts.out_dir) == ("prfaas", "compose", tmp_path / "p")
    assert rp.scenario.scale.time_scale == 4.0 and not faults
    assert opts.percentiles == (95.0, 99.9)
    err = capsys.readouterr().err
    assert "warning: time_scale 4" in err and "divided by 4" in err


def test_percentiles_flag_of_run_and_its_errors(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import testbed.cli.run as cli_run

    seen: list[RunOptions] = []

    async def fake_run(rp: RunPlan, opts: RunOptions, progress: Any = None) -> RunResult:
        seen.append(opts)
        return RunResult(opts.out_dir, [], [], {}, [])

    monkeypatch.setattr("testbed.scenario.runner.run_scenario", fake_run)  # imported per live run
    monkeypatch.setattr(cli_run, "to_text", lambda summary: "summary")
    assert main(["run", TINY, "--quiet", "--out", str(tmp_path), "--percentiles", "99,75"]) == 0
    assert seen[0].percentiles == (75.0, 99.0)
    with pytest.raises(SystemExit) as exit_:
        main(["run", TINY, "--percentiles", "50,120"])
    assert exit_.value.code == 2 and "not in (0, 100]" in capsys.readouterr().err
