"""`--max-requests` on `testbed sweep`, `testbed hindsight` and `testbed scorecard` (issue 33,
defect 1's loose end): each enforces the default cap through prepare_run (a scenario planning
2M requests is one error line, exit 2, before anything is allocated), and each passes its
`--max-requests` to every prepare_run it makes, as `testbed run` and `testbed plan` do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from testbed.cli import main
from testbed.errors import UserError
from testbed.scenario import hindsight, scorecard, sweep
from testbed.scenario.plan import RunOptions

ROOT = Path(__file__).resolve().parents[2]
TINY = (ROOT / "tests" / "data" / "tiny.yaml").read_text()

COMMANDS = {
    "sweep": ["sweep", "{path}", "--set", "seed=1", "--no-saturation", "--jobs", "1"],
    "hindsight": ["hindsight", "{path}", "--seeds", "1", "--no-splits", "--jobs", "1"],
    "scorecard": ["scorecard", "--policy", "prfaas-static", "--scenarios", "{path}"],
}
COMMANDS["scorecard"] += [
    "--seeds",
    "1",
    "--baseline",
    "prfaas-static",
    "--no-cache",
    "--jobs",
    "1",
]


def _argv(command: str, path: Path, *extra: str) -> list[str]:
    return [a.replace("{path}", str(path)) for a in COMMANDS[command]] + list(extra)


def _big(tmp_path: Path) -> Path:
    big = tmp_path / "big.yaml"
    big.write_text(TINY.replace("rate: 1.0}", "rate: 1.0e5}").replace("40s", "20s"))  # 2M
    return big


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_over_the_default_cap_is_one_line_exit_2(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(_argv(command, _big(tmp_path), "--out", str(tmp_path / "out")))
    err = capsys.readouterr().err
    assert rc == 2, err
    errors = [line for line in err.splitlines() if line.startswith("testbed: error:")]
    assert len(errors) == 1 and "above the cap of 1,000,000" in errors[0], err
    assert "Traceback" not in err


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_flag_reaches_prepare_run(
    command: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`--max-requests 2100000` reaches the run's options (the 2M-request scenario would then
    be accepted; the stub stops it before it is drawn)."""
    seen: list[int | None] = []

    def stub(scenario: Any, opts: RunOptions) -> Any:
        seen.append(opts.max_requests)
        raise UserError(f"stub: max_requests={opts.max_requests}")

    for module in (sweep, hindsight, scorecard):
        monkeypatch.setattr(module, "prepare_run", stub)
    argv = _argv(command, _big(tmp_path), "--out", str(tmp_path / "o"), "--max-requests")
    assert main([*argv, "2100000"]) == 2
    assert seen and set(seen) == {2_100_000}, capsys.readouterr().err


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_lowered_cap_refuses_a_small_scenario(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(TINY)  # about 40 requests
    assert main(_argv(command, path, "--out", str(tmp_path / "o"), "--max-requests", "5")) == 2
    assert "above the cap of 5" in capsys.readouterr().err


def test_cells_carry_the_cap(tmp_path: Path) -> None:
    """The grid's cells (run in other processes) keep the cap for their own prepare_run."""
    path = tmp_path / "s.yaml"
    path.write_text(TINY)
    axes = [sweep.parse_set("seed=1,2")]
    assert {c.max_requests for c in sweep.cells(path, axes, max_requests=77)} == {77}
    hp = hindsight.plan_hindsight(path, [1], "goodput", sweep_split=False, max_requests=4321)
    assert hp.cells and {c.max_requests for c in hp.cells} == {4321}
