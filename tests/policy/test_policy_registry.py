"""The policy registry: every policy class carries its facts, and the registry refuses a class
that lacks one (testbed/policy/base.py, testbed/registry.py)."""

from __future__ import annotations

import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, ClassVar

import pytest

from testbed.errors import UserError
from testbed.policy import POLICIES, UnknownName, get_policy, make_policy
from testbed.policy.base import RequestView, Route, Snapshot

# The tables runner.py and router.py kept by hand before the facts moved onto the classes
# (POLICY_DEPLOYMENT_KIND, THRESHOLD_POLICIES, RE_PLANNING_POLICIES, LONG_TERM_POLICIES and the
# router's getattr(policy, "cache_aware", False)): the classes they covered must say the same. A
# policy added since is not listed here: what every entry must keep is a property of the
# registry (tests/test_registry_entries.py).
BEFORE = {
    # name: (deployment_kind, needs_threshold, replans, long_term, cache_aware)
    "homogeneous": ("homogeneous", False, False, False, False),
    "naive": ("naive", False, False, False, False),
    "prfaas-static": ("prfaas-pd", True, False, False, False),
    "prfaas": ("prfaas-pd", True, True, True, True),
    "prfaas-nocache": ("prfaas-pd", True, True, True, False),
    "prfaas-nolongterm": ("prfaas-pd", True, True, False, True),
    "prfaas-predict": ("prfaas-pd", True, True, True, True),
}


def facts(cls: Any) -> tuple[Any, ...]:
    return (cls.deployment_kind, cls.needs_threshold, cls.replans, cls.long_term, cls.cache_aware)


def test_every_policy_declares_the_facts_the_old_tables_held() -> None:
    assert {name: facts(get_policy(name)) for name in BEFORE} == BEFORE
    for name in POLICIES:
        assert make_policy(name).name == name


def test_discovery_imports_every_module_of_the_package() -> None:
    package = Path(__import__("testbed.policy").policy.__file__).parent
    modules = {p.stem for p in package.glob("*.py")} - {"__init__"}
    registering = {get_policy(name).__module__.rsplit(".", 1)[1] for name in POLICIES}
    assert {"static", "prfaas"} <= registering <= modules
    # support modules (base, book, ...) register nothing but are imported all the same
    assert all(f"testbed.policy.{m}" in sys.modules for m in modules)


def test_an_unknown_name_is_one_line_listing_the_known_ones() -> None:
    with pytest.raises(UnknownName) as info:
        get_policy("random")
    assert isinstance(info.value, KeyError) and isinstance(info.value, UserError)
    builtin = [n for n in POLICIES if not POLICIES.is_plugin(n)]
    assert set(BEFORE) <= set(builtin)
    # an installed plugin package (examples/least-ttft, say) is a known name too
    installed = [ep.name for ep in entry_points(group="prfaas_testbed.policies")]
    assert str(info.value) == (
        f"unknown policy 'random'; known: {', '.join(sorted(builtin + installed))} "
        "(or an outside one as module:Class)"
    )
    assert "random" not in POLICIES


class _Complete:
    name: ClassVar[str] = "test-complete"
    deployment_kind: ClassVar[str] = "homogeneous"
    needs_threshold: ClassVar[bool] = False
    replans: ClassVar[bool] = False
    long_term: ClassVar[bool] = False
    cache_aware: ClassVar[bool] = False

    def decide(self, request: RequestView, snapshot: Snapshot) -> Route:
        raise NotImplementedError


@pytest.mark.parametrize(
    ("attr", "value", "message"),
    [
        ("cache_aware", None, "'cache_aware' must be True or False"),
        ("replans", "yes", "'replans' must be True or False"),
        ("deployment_kind", "mesh", "'deployment_kind' must be one of"),
        ("name", "", "'name' must be a non-empty string"),
        ("decide", None, r"needs a decide\(request, snapshot\) method"),
    ],
)
def test_a_class_without_a_fact_is_refused_when_it_registers(
    attr: str, value: Any, message: str
) -> None:
    broken = type("Broken", (_Complete,), {attr: value})
    with pytest.raises(TypeError, match=message):
        POLICIES.register(broken)
    assert "test-complete" not in POLICIES


def test_a_taken_name_is_refused_and_added_is_undone_after_the_block() -> None:
    taken = type("Taken", (_Complete,), {"name": "prfaas"})
    with pytest.raises(ValueError, match=r"policy name 'prfaas' is taken by .*prfaas\.Prfaas"):
        POLICIES.register(taken)
    assert get_policy("prfaas").__name__ == "Prfaas"
    with POLICIES.added(_Complete):
        assert get_policy("test-complete") is _Complete
        POLICIES.register(_Complete)  # the same class again: no-op
    assert "test-complete" not in POLICIES
