"""The scenario's `router:` section: an external router run unchanged in front of the fleet
instead of ours (docs/real-routers.md).

`kind: external` with a `preset` naming a router the testbed knows how to start
(testbed.scenario.external_router): `sglang-router`, SGLang's gateway, or `vllm-router`,
versions pinned by the `routers` extra. `policy` is the router's own policy name, `flags` more
command-line flags passed as they are (after the preset's, so they win where the router lets a
later flag win). Router timers are wall-clock, so a scenario with an external router runs at
time_scale 1 unless it says otherwise.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from testbed.config.base import PositiveDuration, StrictModel

__all__ = ["PRESET_POLICIES", "ExternalRouterConfig"]

PRESET_POLICIES: dict[str, tuple[str, ...]] = {
    "sglang-router": ("cache_aware", "round_robin", "random", "power_of_two"),
    "vllm-router": (
        "cache_aware",
        "round_robin",
        "random",
        "power_of_two",
        "consistent_hash",
        "sticky_least_loaded",
        "kv_aware",
    ),
}
"""The policies each preset's router accepts (its `--policy` choices, from its --help)."""


class ExternalRouterConfig(StrictModel):
    kind: Literal["external"] = "external"
    """A router the testbed starts and stops with the run but does not implement."""
    preset: Literal["sglang-router", "vllm-router"] = "sglang-router"
    """Which router, started as the testbed knows how (testbed.scenario.external_router):
    `sglang-router`, SGLang's gateway (the `routers` extra pins 0.3.2), or `vllm-router` (0.1.17);
    each fleet then speaks that router's PD handshake (services.facade)."""
    policy: str = "cache_aware"
    """The router's own policy (its default: cache_aware)."""
    flags: list[str] = Field(default_factory=list)
    """More command-line flags for the router, passed as they are."""
    python: str | None = None
    """The interpreter the router's Python package is installed in (`python -m MODULE`); None:
    the one running the testbed (install it with `pip install -e '.[routers]'`)."""
    ready_timeout: PositiveDuration = 60.0
    """Wall seconds the router has to start and register every worker."""

    @model_validator(mode="after")
    def _policy_is_the_routers(self) -> ExternalRouterConfig:
        known = PRESET_POLICIES[self.preset]
        if self.policy not in known:
            raise ValueError(
                f"policy: {self.preset} has no policy {self.policy!r}; use one of "
                f"{', '.join(known)}"
            )
        return self
