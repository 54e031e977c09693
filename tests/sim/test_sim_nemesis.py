"""The sim plays link verbs on its link model (testbed.sim.nemesis), and refuses before the run
a fault whose verbs it does not model: a slicer fault never becomes a failed start and a VACUOUS
verdict."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Literal

import pytest

from testbed.errors import UserError
from testbed.metrics.records import HistoryEvent
from testbed.nemesis import (
    ACTIONS,
    LINK_VERBS,
    LinkEvent,
    LinkFault,
    NemesisPlayer,
    PlannedFault,
    refuse_unplayable,
    unplayable,
)
from testbed.nemesis.verbs import LinkControl
from testbed.scenario.schema import load_scenario
from testbed.sim.link import SimLink
from testbed.sim.loop import VirtualClock, run_virtual
from testbed.sim.nemesis import SIM_LINK, SIM_VERBS, SimLinkControl, SimNemesis, SimProcesses

ROOT = Path(__file__).resolve().parents[2]


class FragmentAction(LinkEvent):
    action: Literal["fragment"] = "fragment"
    size: int = 512


class FragmentFault(LinkFault[FragmentAction]):
    """A slicer fault (the toy, registered for these tests only)."""

    config = FragmentAction
    verbs = frozenset({"slice"})

    async def apply(self, link: LinkControl, key: str) -> dict[str, Any]:
        await link.add_slicer(key, average_bytes=self.event.size, variation_bytes=0, delay_s=0)
        return {"size": self.event.size}


def _on_link(script: Any) -> Any:
    async def main() -> Any:
        link = SimLink(asyncio.get_running_loop(), bandwidth=1e9, rtt=0.02, jitter=0.0, seed=1)
        return await script(link, SimLinkControl(link, ["xdc-a", "xdc-b"]))

    return run_virtual(main())


def test_the_verbs_set_the_link_model_and_remove_undoes_them() -> None:
    async def script(link: SimLink, ctl: SimLinkControl) -> list[Any]:
        seen: list[Any] = []
        await ctl.add_delay("d1", rtt_s=0.2, jitter_s=0.1)
        await ctl.add_delay("d2", rtt_s=0.1, jitter_s=0.05)
        seen.append((link.extra_rtt, link.extra_jitter))
        await ctl.remove("d1")
        seen.append((link.extra_rtt, link.extra_jitter))
        await ctl.add_timeout("t", timeout_s=20.0)
        seen.append((link.partition, link.partition_timeout))
        await ctl.partition()  # a cut outranks the black hole
        seen.append(link.partition)
        await ctl.heal()
        seen.append(link.partition)
        await ctl.remove("t")
        seen.append(link.partition)
        await ctl.add_reset("r", after_s=1.0, probability=0.5)
        seen.append((link.resetting, link.reset_toxicity, link.reset_after))
        await ctl.remove("r")
        await ctl.add_slow_close("s", delay_s=2.0, probability=1.0)  # nothing for transfers
        seen.append((link.resetting, link.partition))
        await ctl.set_bandwidth(1.25e9)
        seen.append(ctl.configured_bytes_per_s)
        await ctl.remove("nothing-there")
        return seen

    assert _on_link(script) == [
        (pytest.approx(0.3), 0.1),
        (0.1, 0.05),
        ("timeout", 20.0),
        "disable",
        "timeout",
        None,
        (True, 0.5, 1.0),
        (False, None),
        1.25e9,
    ]


def test_the_sim_models_every_verb_but_the_byte_level_ones() -> None:
    assert LINK_VERBS - {"slice", "data_limit"} == SIM_VERBS
    assert SIM_LINK.supported == SIM_VERBS

    async def script(link: SimLink, ctl: SimLinkControl) -> None:
        with pytest.raises(RuntimeError, match="'slice' is not modelled on the sim"):
            await ctl.add_slicer("k", average_bytes=10, variation_bytes=0, delay_s=0.0)
        with pytest.raises(RuntimeError, match="'data_limit' is not modelled on the sim"):
            await ctl.add_data_limit("k", limit_bytes=10)

    _on_link(script)


def test_every_library_scenario_plays_on_the_sim() -> None:
    for path in sorted((ROOT / "scenarios").glob("*.yaml")):
        assert unplayable(load_scenario(path).nemesis, SIM_LINK) is None, path.name


def test_a_slicer_fault_is_refused_before_the_player_plays_anything() -> None:
    with ACTIONS.added(FragmentFault):
        faults = [
            PlannedFault(0, ACTIONS["bandwidth"].config.model_validate(
                {"action": "bandwidth", "at": "1s", "bandwidth": "10Gbps"}), ("link",)),
            PlannedFault(1, FragmentAction(at=2), ("link",)),
        ]  # fmt: skip
        line = "nemesis[1] 'fragment': the sim cannot play link verb 'slice' (docs/sim.md)"
        assert unplayable(faults, SIM_LINK) == line
        assert unplayable([f.event for f in faults], SIM_LINK) == line  # a scenario's list
        with pytest.raises(UserError, match=r"^nemesis\[1\] 'fragment': the sim cannot"):
            refuse_unplayable(faults, SIM_LINK)

        async def main() -> list[HistoryEvent]:
            link = SimLink(asyncio.get_running_loop(), 1e9, 0.02, 0.0, seed=1)
            clock = VirtualClock(asyncio.get_running_loop())
            ctx = SimNemesis(SimProcesses({}, lambda i, why: None), SimLinkControl(link, []), clock)
            history: list[HistoryEvent] = []
            with pytest.raises(UserError, match="cannot play link verb 'slice'"):
                NemesisPlayer(ctx, faults, history, clock)
            return history

        assert run_virtual(main()) == []  # not even the bandwidth fault before it was played


def test_partition_declares_the_verb_of_its_mode() -> None:
    partition = ACTIONS["partition"]
    disable = partition.config.model_validate({"action": "partition", "at": "1s"})
    timeout = partition.config.model_validate(
        {"action": "partition", "at": "1s", "mode": "timeout"}
    )
    assert partition.verbs_for(disable) == {"partition"}
    assert partition.verbs_for(timeout) == {"timeout"}
    for fault in ACTIONS.entries():
        assert fault.verbs <= LINK_VERBS, fault


def test_a_link_fault_that_declares_no_verbs_is_not_registered() -> None:
    class Silent(FragmentFault):
        verbs = frozenset()

    class Unknown(FragmentFault):
        verbs = frozenset({"teleport"})

    # `added` takes the entry away again should the check ever let one through
    with pytest.raises(TypeError, match="declares no link verbs"), ACTIONS.added(Silent):
        pass
    with (
        pytest.raises(TypeError, match=r"unknown link verbs \['teleport'\]"),
        ACTIONS.added(Unknown),
    ):
        pass
    assert "fragment" not in ACTIONS
