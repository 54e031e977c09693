"""The toys' own test (tests/test_extension_toys.py copies it to tests/test_toys.py beside
testbed/policy/toy_split.py, testbed/nemesis/actions/toy_fragment.py and
testbed/checkers/toy_cross_dc.py): each does what its knob or field says, through the same
paths a built-in entry goes through."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.checkers import run_checkers
from testbed.errors import ConfigError
from testbed.metrics.records import RequestRecord
from testbed.nemesis import ACTIONS, plan_faults, unplayable
from testbed.policy import make_policy
from testbed.policy.base import InstanceLoad, RequestView, Snapshot
from testbed.scenario.schema import scenario_from_data
from testbed.scenario.sweep import scenario_with_settings
from testbed.sim.nemesis import SIM_LINK

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "scenarios" / "paper.yaml"


def _paper(**policy: Any) -> Any:
    data = yaml.safe_load(PAPER.read_text())
    data["policy"] = {"name": "toy-split", **policy}
    return scenario_from_data(data, PAPER)


def _snapshot() -> Snapshot:
    loads = [
        InstanceLoad("local-prefill-0", "local", "prefill", 0, 0.0),
        InstanceLoad("prfaas-prefill-0", "prfaas", "prefill", 0, 0.0),
        InstanceLoad("local-decode-0", "local", "decode", 0, 0.0),
    ]
    return Snapshot(now=0.0, instances=tuple(loads))


def test_the_knob_moves_the_split(tmp_path: Path) -> None:
    request = RequestView(id="r1", input_tokens=5000, output_tokens=8)
    default = _paper()  # local_max 8000: 5000 tokens stay on PD-P
    narrow = _paper(toy_split={"local_max": 2000})
    assert (
        make_policy("toy-split", default.policy).decide(request, _snapshot()).prefill_cluster
        == "local"
    )
    assert (
        make_policy("toy-split", narrow.policy).decide(request, _snapshot()).prefill_cluster
        == "prfaas"
    )
    with pytest.raises(ConfigError, match=r"policy\.toy_split\.local_max: Input should be greater"):
        _paper(toy_split={"local_max": 0})
    path = tmp_path / "paper.yaml"
    path.write_text(
        yaml.safe_dump({**yaml.safe_load(PAPER.read_text()), "policy": {"name": "toy-split"}})
    )
    set_ = scenario_with_settings(path, [("policy.toy_split.local_max", "1234")])
    assert set_.policy.knobs(type(make_policy("toy-split").knobs)).local_max == 1234  # type: ignore[attr-defined]


class _Link:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    async def add_slicer(self, key: str, /, **kw: Any) -> None:
        self.calls.append((key, kw["average_bytes"]))


async def test_the_fault_slices_by_its_size() -> None:
    fault_cls = ACTIONS["toy_fragment"]
    event = fault_cls.config.model_validate({"action": "toy_fragment", "at": "1s", "size": 512})
    assert unplayable([event], SIM_LINK) == (
        "nemesis[0] 'toy_fragment': the sim cannot play link verb 'slice' (docs/sim.md)"
    )

    class _Timeline:
        name, seed, nemesis = "t", 0, [event]

    (planned,) = plan_faults(_Timeline(), ["local-prefill-0"], link_enabled=True)  # type: ignore[arg-type]
    link = _Link()
    fault = fault_cls(planned)
    assert await fault.apply(link, fault.key) == {"size": 512}  # type: ignore[attr-defined]
    assert link.calls == [(fault.key, 512)]  # type: ignore[attr-defined]


def test_the_checker_bounds_the_share() -> None:
    base = RequestRecord(id="r", input_tokens=100, output_tokens=1, arrival=0.0, status="completed")
    records = [replace(base, id=f"r{i}", cross_dc=i < 3) for i in range(10)]  # 30% crossed
    ids = [r.id for r in records]
    from testbed.checkers.base import CHECKERS

    model = CHECKERS["toy_cross_dc"].config
    ok = run_checkers(records, ids, configs=[model(min_fraction=0.2)])[-1]
    low = run_checkers(records, ids, configs=[model(min_fraction=0.5)])[-1]
    assert (ok.name, ok.verdict, low.verdict) == ("toy_cross_dc", "ok", "failed")
    assert run_checkers([], [], configs=[model()])[-1].verdict == "vacuous"
