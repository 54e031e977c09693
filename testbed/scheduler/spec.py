"""What the scheduler's control loops are told at start, typed end to end.

The router's service spec carries it (`ServiceSpec.scheduler`) as JSON; the configuration models
inside are the scenario's own (testbed.config), so the loops read the same typed values the
scenario file gave, not a dict they would have to re-validate.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from testbed.config import DeploymentConfig, LengthsConfig, LongTermConfig, ShortTermConfig

__all__ = ["SchedulerSpec"]


class SchedulerSpec(BaseModel):
    """What the short-term loop needs to re-run the planner (the deployment, the length
    distribution and the SLO) and, when `long_term` is set, the long-term loop's knobs.

    `replans` False runs the short-term loop for the link view alone: it samples the PrfaaS
    senders for the snapshot (a policy that reads the link without re-planning, such as an
    HTTP policy whose fallback is prfaas-static; policy.base.measures_link), and the
    threshold stays the scenario's."""

    model_config = ConfigDict(extra="forbid")

    deployment: DeploymentConfig
    lengths: LengthsConfig
    output_tokens: float
    tpot_slo_s: float
    threshold_step: float
    n_prefill: int
    short_term: ShortTermConfig = Field(default_factory=lambda: ShortTermConfig())
    long_term: LongTermConfig | None = None
    """None: no role conversion (the prfaas-nolongterm ablation)."""
    n_local: int = 0
    replans: bool = True
    """False: measure the link only (see the class docstring); no threshold events."""
