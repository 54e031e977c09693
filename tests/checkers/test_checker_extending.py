"""Adding a checker is one file (docs/extending.md): a toy checker defined here, registered for
the test only, is run by run_checkers and refused by checkers_fit like a built-in; the docs'
example, dropped into testbed/checkers/ of a fresh interpreter as its one file, is accepted in a
scenario file (errors worded like the built-ins') and judges a run's records."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import pytest
import yaml

from testbed.checkers import (
    CHECKERS,
    Checker,
    CheckerConfig,
    CheckInput,
    CheckResult,
    checkers_fit,
    run_checker,
    run_checkers,
)
from testbed.checkers.result import vacuous
from testbed.config import PositiveDuration
from testbed.errors import UserError
from testbed.metrics.records import RequestRecord
from testbed.nemesis import NemesisEvent
from testbed.registry import UnknownName

ROOT = Path(__file__).resolve().parents[2]


class SlowestCheck(CheckerConfig):
    """slowest_ttft: no completed request arriving before `until` waited more than `max` for
    its first token (the toy)."""

    check: Literal["slowest_ttft"] = "slowest_ttft"
    max: PositiveDuration
    until: PositiveDuration | None = None

    def problems(self, nemesis: Sequence[NemesisEvent], duration_s: float) -> list[str]:
        if self.until is not None and self.until > duration_s:
            return [f"looks until {self.until:g}s, past the run's {duration_s:g}s"]
        return []


def slowest(cfg: SlowestCheck, run: CheckInput) -> CheckResult:
    until = cfg.until if cfg.until is not None else float("inf")
    ttfts = [
        r.ttft
        for r in run.records
        if r.status == "completed" and r.ttft is not None and r.arrival < until
    ]
    if not ttfts:
        return vacuous("slowest_ttft", "no completed request to time")
    worst = max(ttfts)
    return CheckResult("slowest_ttft", worst <= cfg.max, f"slowest TTFT {worst:.3g}s")


def rec(i: int, ttft: float, **kw: object) -> RequestRecord:
    r = RequestRecord(
        id=f"r{i}", input_tokens=100, output_tokens=4, arrival=float(i), status="completed",
        first_token=i + ttft,
    )  # fmt: skip
    return replace(r, **kw)


@dataclass
class Timeline:
    checkers: list[CheckerConfig]
    nemesis: list[NemesisEvent] = field(default_factory=list)
    name: str = "toy"


def test_a_toy_checker_is_run_and_refused_like_a_built_in() -> None:
    records = [rec(1, 0.5), rec(2, 1.5), rec(3, 4.0)]
    ids = [r.id for r in records]
    with CHECKERS.added(Checker(SlowestCheck, slowest)):
        ok, bad, early = (
            run_checkers(records, ids, configs=[cfg])[-1]
            for cfg in (SlowestCheck(max=5), SlowestCheck(max=2), SlowestCheck(max=2, until=3))
        )
        nothing = run_checker(SlowestCheck(max=1), [], [], 0)
        with pytest.raises(UserError, match=r"checkers\.1 \(slowest_ttft\) looks until 90s"):
            checkers_fit(Timeline([SlowestCheck(max=1), SlowestCheck(max=1, until=90)]), 60)
        checkers_fit(Timeline([SlowestCheck(max=1, until=60)]), 60)
    assert (ok.verdict, bad.verdict, early.verdict) == ("ok", "failed", "ok")
    assert bad.detail == "slowest TTFT 4s"
    assert nothing.verdict == "vacuous"
    with pytest.raises(UnknownName, match="unknown check 'slowest_ttft'"):
        run_checker(SlowestCheck(max=1), records, [], 3)


def _example(path: str) -> str:
    """The code block marked `<!-- example: path -->` in docs/extending.md."""
    text = (ROOT / "docs" / "extending.md").read_text()
    m = re.search(rf"<!-- example: {re.escape(path)} -->\n```python\n(.*?)```\n", text, re.S)
    assert m is not None, f"docs/extending.md has no example {path}"
    return m.group(1)


SCENARIO = {
    "deployments": {"d": {"kind": "homogeneous", "local": {"hardware": "h20x8", "instances": 3}}},
    "checkers": [{"check": "cross_dc", "min_fraction": 0.2}, {"check": "cross_dc"}],
}

DRIVER = """
import json, sys
import testbed.checkers
testbed.checkers.__path__.append(sys.argv[1])  # as if the file sat in testbed/checkers/
from testbed.checkers import run_checkers
from testbed.errors import ConfigError
from testbed.metrics.records import RequestRecord
from testbed.scenario.schema import load_scenario

sc = load_scenario(sys.argv[2])
records = [
    RequestRecord(id=f"r{i}", input_tokens=10, output_tokens=1, arrival=i,
                  status="completed", cross_dc=i % 2 == 0)
    for i in range(4)
]
checks = run_checkers(records, [r.id for r in records], configs=sc.checkers)
narrow = sc.checkers[0].model_copy(update={"max_fraction": 0.25})
failed = run_checkers(records, [r.id for r in records], configs=[narrow])[-1]
none = run_checkers([], [], configs=sc.checkers)[-1]
errors = []
for path in sys.argv[3:]:
    try:
        load_scenario(path)
    except ConfigError as exc:
        errors.append(str(exc))
print(json.dumps({
    "model": type(sc.checkers[0]).__module__,
    "results": [c.to_json() for c in checks[-2:]],
    "failed": failed.to_json(),
    "none": none.verdict,
    "errors": errors,
}))
"""


def test_the_docs_example_is_one_file_a_scenario_can_use(tmp_path: Path) -> None:
    (tmp_path / "cross_dc.py").write_text(_example("testbed/checkers/cross_dc.py"))
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(SCENARIO))
    bad = []
    for n, entry in enumerate(
        [
            {"check": "cross_dc", "min_fraction": 0.8, "max_fraction": 0.5},
            {"check": "cross_dc", "within": "1s"},
            {"check": "cross_dc", "min_fraction": 2},
        ]
    ):
        bad.append(tmp_path / f"bad{n}.yaml")
        bad[-1].write_text(yaml.safe_dump({**SCENARIO, "checkers": [entry]}))
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(DRIVER), str(tmp_path), str(good), *map(str, bad)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["model"] == "testbed.checkers.cross_dc"
    share = "50.0% of 4 completed requests crossed the link"
    assert got["results"] == [
        {"name": "cross_dc", "ok": True, "verdict": "ok", "detail": f"{share} ([20%, 100%])"},
        {"name": "cross_dc", "ok": True, "verdict": "ok", "detail": f"{share} ([0%, 100%])"},
    ]
    assert got["failed"]["verdict"] == "failed"
    assert got["none"] == "vacuous"
    assert got["errors"] == [
        f"{bad[0]}: checkers.0: min_fraction must not exceed max_fraction",
        f"{bad[1]}: checkers.0: field 'within' does not apply to check 'cross_dc'",
        f"{bad[2]}: checkers.0.min_fraction: Input should be less than or equal to 1",
    ]
    assert "cross_dc" not in CHECKERS  # this interpreter's registry is untouched
