"""The scheduler's settings are the scenario's own typed models end to end: they cross the
process boundary inside the router's ServiceSpec JSON and come back as the same models, and a
wrong value is refused when the spec is read, not later inside a loop."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from testbed.config import (
    DeploymentConfig,
    FixedLengths,
    LongTermConfig,
    ShortTermConfig,
)
from testbed.scheduler.spec import SchedulerSpec
from testbed.services.spec import ServiceSpec

DEP = DeploymentConfig.model_validate(
    {
        "kind": "prfaas-pd",
        "prfaas": {"hardware": "h200x8", "instances": 2},
        "local": {"hardware": "h20x8", "instances": 4},
        "link": {"bandwidth": "40Gbps", "rtt": "10ms"},
    }
)


def _spec(**over: object) -> SchedulerSpec:
    fields: dict[str, object] = {
        "deployment": DEP,
        "lengths": FixedLengths(tokens=3000),
        "output_tokens": 512,
        "tpot_slo_s": 0.025,
        "threshold_step": 100,
        "n_prefill": 2,
        "short_term": ShortTermConfig(interval=2.0, queue_balance=False),
        "long_term": LongTermConfig(window=20.0, role_switch=3.0),
        "n_local": 4,
    }
    return SchedulerSpec.model_validate({**fields, **over})


def test_settings_survive_the_service_spec_json_as_typed_models() -> None:
    sent = ServiceSpec(role="router", id="router", scheduler=_spec())
    got = ServiceSpec.model_validate_json(sent.model_dump_json()).scheduler
    assert got is not None
    assert isinstance(got.deployment, DeploymentConfig) and got.deployment == DEP
    assert got.deployment.link.bandwidth == 40e9 / 8
    assert got.lengths == FixedLengths(tokens=3000)
    assert got.short_term == ShortTermConfig(interval=2.0, queue_balance=False)
    assert got.long_term == LongTermConfig(window=20.0, role_switch=3.0)


def test_a_bad_setting_is_refused_when_the_spec_is_read() -> None:
    doc = ServiceSpec(role="router", id="router", scheduler=_spec()).model_dump(mode="json")
    doc["scheduler"]["short_term"]["replan_change"] = -1
    with pytest.raises(ValidationError, match="replan_change"):
        ServiceSpec.model_validate(doc)
    doc = ServiceSpec(role="router", id="router", scheduler=_spec()).model_dump(mode="json")
    doc["scheduler"]["lengths"] = {"kind": "zipf"}
    with pytest.raises(ValidationError, match="lengths"):
        ServiceSpec.model_validate(doc)
