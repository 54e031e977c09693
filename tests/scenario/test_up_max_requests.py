"""`testbed up --max-requests`: up plans the scenario (its faults, its deployment) through the
same `prepare_run` as `run`, so the cap on planned requests applies and the flag moves it; the
planned requests themselves are dropped at once (outside clients are the load), instead of held
for as long as the deployment stands."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from testbed.cli import main
from testbed.scenario.plan import RunOptions, RunPlan, RunResult
from testbed.scenario.standing import Endpoints

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "tests" / "data" / "tiny.yaml")  # 1 request/s over 40 s: 40 planned


@pytest.fixture
def ups(monkeypatch: pytest.MonkeyPatch) -> list[tuple[RunPlan, RunOptions]]:
    import testbed.cli.up as cli_up

    seen: list[tuple[RunPlan, RunOptions]] = []

    async def fake(rp: RunPlan, opts: RunOptions, *, on_ready: Any, **_kw: Any) -> RunResult:
        seen.append((rp, opts))
        on_ready(Endpoints("http://r/v1", "http://r", None, {}))
        return RunResult(opts.out_dir, [], [], {}, [], notes=["service x dead at exit: ..."])

    monkeypatch.setattr(cli_up, "stand_up", fake)
    monkeypatch.setattr(cli_up, "to_text", lambda summary: "summary")
    return seen


def test_up_max_requests_moves_the_cap_and_the_plan_keeps_no_requests(
    ups: list[tuple[RunPlan, RunOptions]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["up", TINY, "--out", str(tmp_path / "a"), "--max-requests", "39"]) == 2
    assert "above the cap of 39" in capsys.readouterr().err and not ups
    assert main(["up", TINY, "--out", str(tmp_path / "b"), "--max-requests", "40"]) == 0
    (rp, opts), = ups  # fmt: skip
    assert opts.max_requests == 40 and rp.requests == []
    assert "note: service x dead at exit: ..." in capsys.readouterr().out  # the exit report
