"""Short versions of the library's scenarios: what the chaos suite (tests/chaos) and
`testbed scorecard --substrate local` run live, a 180 s scenario in about 9 s of wall time.

`short_variant` keeps a scenario's workload, policy, nemesis timeline and checkers (all in
real-world time) and swaps in a tiny deployment (SHORT_DEPLOYMENT) at time_scale 20 / byte_scale
2000.
"""

from __future__ import annotations

from testbed.config import DeploymentConfig, ScaleConfig
from testbed.planner import plan_deployment, plan_inputs
from testbed.scenario.schema import Scenario

__all__ = ["SHORT_DEPLOYMENT", "short_variant"]


SHORT_DEPLOYMENT = DeploymentConfig.model_validate(
    {
        "kind": "prfaas-pd",
        "prfaas": {"hardware": "h200x8", "instances": 2},
        "local": {"hardware": "h20x8", "instances": 4, "prefill": 1, "decode": 3},
        "link": {"bandwidth": "100Gbps", "rtt": "20ms", "jitter": "2ms", "connections": 2},
    }
)
"""2 PrfaaS + 1 PD-P + 3 PD-D instances, one process each: what a live short run stands up."""


def short_variant(sc: Scenario, **updates: object) -> Scenario:
    """The short version of a scenario, as the chaos suite runs the library (tests/chaos).

    It keeps the scenario's workload, policy, nemesis timeline and checkers (all in real-world
    time) and swaps in SHORT_DEPLOYMENT (with the scenario's model and hardware, a user
    profile's too) at time_scale 20 / byte_scale 2000, so a 180 s scenario plays in about 9 s
    of wall time. Faults aimed at a group (`local-decode`) still resolve; the arrival rate
    follows the smaller deployment (a `load` by itself, a fixed `rate` by the ratio of the two
    lambda_max), and so do link bandwidth faults (scaled by the ratio of PrfaaS instances).
    Scenarios on the tiny real model (`engine: torch`) are small already: they keep their
    deployment and run 8 s of arrivals (4 requests, both routes)."""
    if any(d.engine == "torch" for d in sc.deployments.values()):
        return sc.model_copy(update={"duration": 8.0, **updates})
    full = sc.deployments[sc.deployment] if sc.deployment else next(iter(sc.deployments.values()))
    tiny = _tiny_like(full)
    assert SHORT_DEPLOYMENT.prfaas is not None
    ratio = (
        SHORT_DEPLOYMENT.prfaas.instances / full.prfaas.instances
        if full.prfaas is not None
        else 1.0
    )
    nemesis = []
    for ev in sc.nemesis:
        bw = getattr(ev, "bandwidth", None)  # a `bandwidth` action's new capacity
        if ev.action == "bandwidth" and bw is not None:
            ev = ev.model_copy(update={"bandwidth": bw * ratio})
        nemesis.append(ev)
    workload = sc.workload
    rate = workload.arrivals.rate
    if rate is not None:  # a rate, unlike a load, does not follow the deployment: scale it
        inputs = plan_inputs(sc)
        t = sc.policy.threshold
        fixed = None if t == "auto" else float(t)  # as prepare_run plans a fixed threshold
        ratio_rps = (
            plan_deployment("tiny", tiny, inputs, threshold_tokens=fixed).lambda_max_rps
            / plan_deployment("full", full, inputs, threshold_tokens=fixed).lambda_max_rps
        )
        arrivals = workload.arrivals.model_copy(update={"rate": rate * ratio_rps})
        workload = workload.model_copy(update={"arrivals": arrivals})
    return sc.model_copy(
        update={
            "deployments": {"tiny": tiny},
            "deployment": "tiny",
            "scale": ScaleConfig(time_scale=20, byte_scale=2000),
            "nemesis": nemesis,
            "workload": workload,
            **updates,
        }
    )


def _tiny_like(full: DeploymentConfig) -> DeploymentConfig:
    """SHORT_DEPLOYMENT with the scenario's own model and hardware."""
    tiny = SHORT_DEPLOYMENT
    assert tiny.prfaas is not None
    prfaas_hw = full.prfaas.hardware if full.prfaas is not None else tiny.prfaas.hardware
    return tiny.model_copy(
        update={
            "model": full.model,
            "prfaas": tiny.prfaas.model_copy(update={"hardware": prfaas_hw}),
            "local": tiny.local.model_copy(update={"hardware": full.local.hardware}),
        }
    )
