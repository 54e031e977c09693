"""Routing policies, one module each, behind the interface in `base`.

`POLICIES` maps a name to its class (found by importing every module of this package the first
time it is read; see testbed.registry); `get_policy` is the class, with the facts the runner
reads (`deployment_kind`, `needs_threshold`, `replans`, `long_term`, `cache_aware`, and the
optional `link_view`), and
`make_policy` an instance, which is what the router routes with.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from testbed.policy.base import POLICIES, Policy
from testbed.registry import UnknownName

if TYPE_CHECKING:
    from testbed.config import PolicyConfig

__all__ = ["POLICIES", "Policy", "UnknownName", "get_policy", "make_policy"]


def get_policy(name: str) -> type[Policy]:
    """The policy class called `name`; UnknownName (one line listing the known names) if none."""
    return POLICIES[name]


def make_policy(name: str, config: PolicyConfig | None = None) -> Policy:
    """A fresh instance of the policy called `name`; a class with a `from_config` classmethod
    gets the scenario's `policy` section (its own knobs live there, e.g. `policy.predict`)."""
    cls = get_policy(name)
    from_config = getattr(cls, "from_config", None)
    if config is not None and callable(from_config):
        policy: Policy = from_config(config)
        return policy
    return cls()
