"""Adding a fault is one file (docs/extending.md): a toy action defined here, registered for the
test only, is planned, played against a fake run and judged by the checkers like any built-in
one; the docs' example, dropped into testbed/nemesis/actions/ of a fresh interpreter as its one
file, is accepted in a scenario file (with errors worded like the built-ins'), planned and
played; the docs' slicer fault, which the sim cannot play, is refused by `testbed run
--substrate sim` before the run with one line (never played to a VACUOUS verdict)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml
from pydantic import Field, ValidationError

from testbed.checkers import check_reroute
from testbed.checkers.reroute import RerouteCheck
from testbed.clock import LiveClock
from testbed.config import PositiveDuration
from testbed.metrics.records import HistoryEvent, RequestRecord
from testbed.nemesis import (
    ACTIONS,
    NemesisContext,
    NemesisEvent,
    NemesisPlayer,
    ProcessEvent,
    ProcessFault,
    instance_ids,
    plan_faults,
)

ROOT = Path(__file__).resolve().parents[2]


class StallAction(ProcessEvent):
    """stall: SIGSTOP the targets for `for`, then SIGCONT (the toy)."""

    action: Literal["stall"] = "stall"
    for_: PositiveDuration = Field(alias="for")


class StallFault(ProcessFault[StallAction]):
    config = StallAction

    async def start(self, ctx: NemesisContext) -> dict[str, Any]:
        for h in self.handles(ctx):
            await ctx.substrate.pause(h)
        return {"stalled": len(self.planned.targets)}

    async def end(self, ctx: NemesisContext) -> dict[str, Any]:
        for h in self.handles(ctx):
            await ctx.substrate.resume(h)
        return {}


class FakeSubstrate:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def kill(self, h: str) -> None:
        self.calls.append(("kill", h))

    async def pause(self, h: str) -> None:
        self.calls.append(("pause", h))

    async def resume(self, h: str) -> None:
        self.calls.append(("resume", h))

    async def restart(self, h: str) -> str:
        self.calls.append(("restart", h))
        return h


@dataclass
class FakeRun:
    substrate: FakeSubstrate
    services: dict[str, Any]
    link: None
    clock: LiveClock


@dataclass
class Timeline:
    nemesis: list[NemesisEvent]
    seed: int = 3
    name: str = "toy"


async def test_a_toy_fault_is_planned_played_and_judged_like_a_built_in() -> None:
    ids = instance_ids(1, 1, 3)
    stall = StallAction(at=10, target="local-decode", **{"for": 20})
    with ACTIONS.added(StallFault):
        assert ACTIONS["stall"] is StallFault
        (planned,) = plan_faults(Timeline([stall]), ids, link_enabled=False)
        run = FakeRun(
            FakeSubstrate(), {i: f"handle:{i}" for i in ids}, None, LiveClock(time_scale=1000.0)
        )
        history: list[HistoryEvent] = []
        await asyncio.wait_for(NemesisPlayer(run, [planned], history, run.clock).run(), 10)
        check = RerouteCheck(fault="stall", within=5)  # a checker may name it while registered
    (target,) = planned.targets
    assert target.startswith("local-decode-")
    assert run.substrate.calls == [("pause", f"handle:{target}"), ("resume", f"handle:{target}")]
    phases = [(e.data["action"], e.data["phase"], e.data["target"]) for e in history]
    assert phases == [("stall", "start", target), ("stall", "end", target)]
    assert history[0].data["stalled"] == 1 and "error" not in history[0].data
    # the reroute checker reads the toy's window from the history like any fault's
    other = next(i for i in ids if i.startswith("local-decode-") and i != target)
    started = history[0].t  # when the fault really began (late on a loaded machine)
    served = RequestRecord(
        id="r1", input_tokens=100, output_tokens=4, arrival=started + 0.5, status="completed",
        prefill_instance="local-prefill-0", decode_instance=other, prefill_start=started + 1.0,
    )  # fmt: skip
    result = check_reroute([served], history, check.fault, check.within)
    assert result.verdict == "ok" and "stall of local-decode-" in result.detail, result
    # and once the toy is gone, neither the registry nor a checker knows the name
    assert "stall" not in ACTIONS
    with pytest.raises(ValidationError, match="unknown nemesis action 'stall'"):
        RerouteCheck(fault="stall", within=5)


def _example(path: str) -> str:
    """The code block marked `<!-- example: path -->` in docs/extending.md."""
    text = (ROOT / "docs" / "extending.md").read_text()
    m = re.search(rf"<!-- example: {re.escape(path)} -->\n```python\n(.*?)```\n", text, re.S)
    assert m is not None, f"docs/extending.md has no example {path}"
    return m.group(1)


DEPLOYMENT = {
    "kind": "prfaas-pd",
    "prfaas": {"hardware": "h200x8", "instances": 1},
    "local": {"hardware": "h20x8", "instances": 2, "prefill": 1, "decode": 1},
}
SCENARIO = {
    "duration": "10s",
    "deployments": {"d": DEPLOYMENT},
    "nemesis": [{"action": "throttle", "at": "1s", "for": "2s", "fraction": 0.1}],
    "checkers": [
        {"check": "recover", "fault": "throttle", "within": "5s", "ttft": "10s"},
        {"check": "ttft", "during": "throttle", "max_ratio": 3},
    ],
}

DRIVER = """
import asyncio, json, sys
import testbed.nemesis.actions
testbed.nemesis.actions.__path__.append(sys.argv[1])  # as if in testbed/nemesis/actions/
from testbed.clock import LiveClock
from testbed.errors import ConfigError
from testbed.nemesis import LINK_VERBS, LinkVerbs, NemesisPlayer, instance_ids, plan_faults
from testbed.scenario.schema import load_scenario

sc = load_scenario(sys.argv[2])
faults = plan_faults(sc, instance_ids(1, 1, 1), link_enabled=True)

class Link:
    verbs = LinkVerbs("fake", LINK_VERBS, "-")
    configured_bytes_per_s = 12.5e9
    proxies = ["p0"]
    caps = []
    async def set_bandwidth(self, v):
        self.configured_bytes_per_s = v
        self.caps.append(v)

class Run:
    substrate = None
    services = {}
    link = Link()
    clock = LiveClock(time_scale=1000.0)

history = []
asyncio.run(NemesisPlayer(Run(), faults, history, Run.clock).run())
errors = []
for path in sys.argv[3:]:
    try:
        load_scenario(path)
    except ConfigError as exc:
        errors.append(str(exc))
try:
    plan_faults(sc, instance_ids(0, 1, 1), link_enabled=False)
except ConfigError as exc:
    errors.append(str(exc))
print(json.dumps({
    "entry": type(sc.nemesis[0]).__module__,
    "targets": [f.targets for f in faults],
    "caps": Link.caps,
    "phases": [[e.data["phase"], e.data.get("gbps"), e.data.get("error")] for e in history],
    "checks": [c.check for c in sc.checkers],
    "errors": errors,
}))
"""


def test_the_docs_example_is_one_file_a_scenario_can_use(tmp_path: Path) -> None:
    (tmp_path / "throttle.py").write_text(_example("testbed/nemesis/actions/throttle.py"))
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(SCENARIO))
    bad = []
    for n, entry in enumerate(
        [
            {"action": "throttle", "at": "1s", "fraction": 2},
            {"action": "throttle", "at": "1s", "fraction": 0.5, "target": "local-decode"},
            {"action": "throttle", "at": "1s"},
        ]
    ):
        bad.append(tmp_path / f"bad{n}.yaml")
        bad[-1].write_text(yaml.safe_dump({**SCENARIO, "nemesis": [entry], "checkers": []}))
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(DRIVER), str(tmp_path), str(good), *map(str, bad)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["entry"] == "testbed.nemesis.actions.throttle"
    assert got["targets"] == [["link"]]
    assert got["caps"] == pytest.approx([1.25e9, 12.5e9])
    assert got["phases"] == [["start", pytest.approx(10.0), None], ["end", 100.0, None]]
    assert got["checks"] == ["recover", "ttft"]
    assert got["errors"] == [
        f"{bad[0]}: nemesis.0.fraction: Input should be less than 1",
        f"{bad[1]}: nemesis.0: field 'target' does not apply to action 'throttle'",
        f"{bad[2]}: nemesis.0: action 'throttle' needs field 'fraction'",
        "scenario 'good': nemesis.0: action 'throttle' needs a cross-datacenter link, and "
        "this deployment has none",
    ]
    assert "throttle" not in ACTIONS  # this interpreter's registry is untouched


FRAGMENT_RUN = """
import sys
import testbed.nemesis.actions
testbed.nemesis.actions.__path__.append(sys.argv[1])  # as if in testbed/nemesis/actions/
from testbed.cli import main
sys.exit(main(sys.argv[2:]))
"""


def test_a_slicer_fault_is_refused_on_the_sim_before_the_run(tmp_path: Path) -> None:
    (tmp_path / "fragment.py").write_text(_example("testbed/nemesis/actions/fragment.py"))
    scenario = {
        **SCENARIO,
        "nemesis": [
            {"action": "bandwidth", "at": "1s", "for": "1s", "bandwidth": "10Gbps"},
            {"action": "fragment", "at": "2s", "for": "2s", "size": 512},
        ],
        "checkers": [{"check": "recover", "fault": "fragment", "within": "5s", "ttft": "10s"}],
    }
    path = tmp_path / "frag.yaml"
    path.write_text(yaml.safe_dump(scenario))
    out = tmp_path / "out"
    args = ["run", str(path), "--substrate", "sim", "--quiet", "--no-timeline", "--out", str(out)]
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FRAGMENT_RUN), str(tmp_path), *args],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    # refused while the run is planned, from the sim's facts (its link's verbs): one line,
    # before the run's banner
    assert proc.stderr.splitlines() == [
        "testbed: error: nemesis[1] 'fragment': the sim cannot play link verb 'slice' (docs/sim.md)"
    ]
    assert proc.stdout == "" and not (out / "requests.jsonl").exists()
