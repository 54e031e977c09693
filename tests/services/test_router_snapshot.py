"""The router's snapshot: cost curves and queue waits come from each instance's hardware."""

from __future__ import annotations

import pytest

from testbed.profiles import MODELS
from testbed.services.router.dispatch import RouterState
from testbed.services.spec import InstanceInfo, ServiceSpec

MODEL = MODELS["internal-1t-hybrid"]


def _router(hardware: dict[str, str | None]) -> RouterState:
    infos = [
        InstanceInfo(id="p0", cluster="prfaas", role="prefill", url="http://x",
                     hardware=hardware["prfaas"]),
        InstanceInfo(id="l0", cluster="local", role="prefill", url="http://x",
                     hardware=hardware["local"]),
        InstanceInfo(id="d0", cluster="local", role="decode", url="http://x",
                     hardware=hardware["local"]),
    ]  # fmt: skip
    spec = ServiceSpec(
        role="router", id="router", policy="prfaas-static", threshold_tokens=8000, instances=infos
    )
    return RouterState(spec)


@pytest.mark.parametrize("prfaas_hw", ["h200x8", "h20x8"])
def test_costs_and_queue_wait_follow_the_instances_hardware(prfaas_hw: str) -> None:
    state = _router({"prfaas": prfaas_hw, "local": "h20x8"})
    state.book.charge("p0", 30_000, "d0", 100, +1)
    snap = state.snapshot()
    assert snap.costs is not None
    want = MODEL.prefill_time(prfaas_hw, 30_000)
    assert snap.costs.prefill_s("prfaas", 30_000) == pytest.approx(want)
    load = snap.least_loaded("prfaas", "prefill")
    assert (load.hardware, load.queue_wait_s) == (prfaas_hw, pytest.approx(want))
    assert snap.link is not None and snap.link.scarce is False


def test_without_hardware_there_are_no_cost_curves_and_no_queue_wait() -> None:
    state = _router({"prfaas": None, "local": None})
    state.book.charge("p0", 30_000, "d0", 100, +1)
    snap = state.snapshot()
    assert snap.costs is None
    assert snap.least_loaded("prfaas", "prefill").queue_wait_s == 0.0


def test_a_failed_instance_stays_in_the_snapshot_as_suspect_and_is_not_routed_to() -> None:
    state = _router({"prfaas": "h200x8", "local": "h20x8"})
    state.mark_down("l0")
    snap = state.snapshot()
    assert {i.id: i.state for i in snap.instances}["l0"] == "suspect"
    with pytest.raises(LookupError):
        snap.least_loaded("local", "prefill")
