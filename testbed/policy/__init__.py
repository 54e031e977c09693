"""Routing policies, one module each, behind the interface in `base`."""

from __future__ import annotations

from testbed.policy.base import Policy
from testbed.policy.prfaas import Prfaas, PrfaasNoCache, PrfaasNoLongTerm
from testbed.policy.static import Homogeneous, Naive, PrfaasStatic

POLICIES: dict[str, type] = {
    "homogeneous": Homogeneous,
    "naive": Naive,
    "prfaas-static": PrfaasStatic,
    "prfaas": Prfaas,
    "prfaas-nocache": PrfaasNoCache,
    "prfaas-nolongterm": PrfaasNoLongTerm,
}

# The deployment kind each policy runs on when a scenario has several.
POLICY_DEPLOYMENT_KIND = {
    "homogeneous": "homogeneous",
    "naive": "naive",
    "prfaas-static": "prfaas-pd",
    "prfaas": "prfaas-pd",
    "prfaas-nocache": "prfaas-pd",
    "prfaas-nolongterm": "prfaas-pd",
}


def make_policy(name: str) -> Policy:
    try:
        cls = POLICIES[name]
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None
    policy: Policy = cls()
    return policy


__all__ = ["POLICIES", "POLICY_DEPLOYMENT_KIND", "Policy", "make_policy"]
