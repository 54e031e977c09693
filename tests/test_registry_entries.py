"""Every entry of every registry (policies, nemesis actions, checkers) keeps the same promises,
checked as properties of the registry rather than against a list of its names, so a new entry
is one file plus its test and nothing here changes (docs/extending.md):

- it validates: a policy builds and a scenario naming it validates; an action's or a checker's
  example validates against its model. An example is a `nemesis:` / `checkers:` entry in a
  library scenario (scenarios/*.yaml), a YAML block of the docs, or a YAML block of the entry's
  own module docstring (what a new entry carries until the docs show it);
- it plans: a policy's scenario goes through `prepare_run`; an action's example through
  `plan_faults`; a checker's example finds nothing to refuse (`problems`) on a timeline holding
  one example of every action;
- it appears in the docs (a backquoted name in docs/, the generated reference included);
- it has a test: a test file other than this one mentions its name in quotes.

`test_a_broken_entry_fails_every_property` registers one toy that keeps none of them, so the
properties stay able to fail.
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, ClassVar, Literal

import pytest
import yaml

from testbed.checkers import CHECKERS, Checker, CheckerConfig, CheckInput, CheckResult
from testbed.config import FixedLengths, WorkloadConfig
from testbed.nemesis import ACTIONS, NemesisEvent, instance_ids, plan_faults
from testbed.policy import POLICIES, make_policy
from testbed.policy.base import RequestView, Route, Snapshot
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.schema import Scenario

ROOT = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve()

BASE: dict[str, Any] = {
    "name": "registry",
    "seed": 1,
    "duration": "60s",
    "deployments": {
        "pd": {
            "kind": "prfaas-pd",
            "prfaas": {"hardware": "h200x8", "instances": 2},
            "local": {"hardware": "h20x8", "instances": 4},
            "link": {"bandwidth": "100Gbps"},
        }
    },
    "workload": {
        "lengths": {"kind": "fixed", "tokens": 4000},
        "output_tokens": 64,
        "arrivals": {"process": "poisson", "rate": 1.0},
    },
    "planner": {"threshold_step": 1000},
}


# --------------------------------------------------------------------------- where names live


def _yaml_blocks(text: str) -> Iterator[Any]:
    for block in re.findall(r"```ya?ml\n(.*?)```", text, re.S):
        try:
            yield yaml.safe_load(block)
        except yaml.YAMLError:
            continue  # a fragment with placeholders: not an example


def _entries_in(doc: Any, key: str) -> Iterator[dict[str, Any]]:
    """`nemesis:` (key "action") or `checkers:` (key "check") entries anywhere in `doc`."""
    section = {"action": "nemesis", "check": "checkers"}[key]
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k == section and isinstance(v, list):
                yield from (e for e in v if isinstance(e, dict) and key in e)
            else:
                yield from _entries_in(v, key)
    elif isinstance(doc, list):
        for v in doc:
            yield from _entries_in(v, key)


@cache
def _library_and_docs() -> tuple[Any, ...]:
    docs = [yaml.safe_load(p.read_text()) for p in sorted((ROOT / "scenarios").glob("*.yaml"))]
    for p in sorted((ROOT / "docs").rglob("*.md")):
        docs += list(_yaml_blocks(p.read_text(encoding="utf-8")))
    return tuple(docs)


def examples(key: str, names: tuple[str, ...], model: type[Any]) -> list[dict[str, Any]]:
    """Examples of the entry answering to `names`: from the library and the docs, then from its
    model's module docstring; an example of one of its names stands for the others (ttft's
    entries show e2e's), with the tag changed."""
    docstring = inspect.getdoc(sys.modules[model.__module__]) or ""
    found = [
        e
        for doc in (*_library_and_docs(), *_yaml_blocks(docstring))
        for e in _entries_in(doc, key)
        if e[key] in names
    ]
    return [{**e, key: name} for e in found[:1] for name in names]


@cache
def _docs_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").rglob("*.md")))


@cache
def _tests_text() -> str:
    return "\n".join(
        p.read_text(encoding="utf-8")
        for p in sorted((ROOT / "tests").rglob("*.py"))
        if p.resolve() != THIS
    )


def in_docs(name: str) -> bool:
    return f"`{name}`" in _docs_text() or f"{name}:" in _docs_text().replace(" ", "")


def has_test(name: str) -> bool:
    return f'"{name}"' in _tests_text() or f"'{name}'" in _tests_text()


# ------------------------------------------------------------------------------ the properties


def scenario(**over: Any) -> Scenario:
    return Scenario.model_validate({**BASE, **over})


def policy_problems(name: str) -> list[str]:
    out = []
    try:
        assert make_policy(name).name == name
        sc = scenario(policy={"name": name})
        prepare_run(sc, RunOptions(substrate="sim", policy=name))
    except Exception as exc:  # any failure is the finding
        out.append(f"does not validate or plan: {type(exc).__name__}: {exc}")
    return out + _documented_and_tested(name)


def _documented_and_tested(name: str) -> list[str]:
    out = []
    if not in_docs(name):
        out.append(f"{name!r} is in no doc under docs/ (extending.md, the reference)")
    if not has_test(name):
        out.append(f"no test file mentions {name!r}")
    return out


@dataclass
class _Timeline:
    nemesis: list[NemesisEvent]
    seed: int = 0
    name: str = "registry"
    workload: WorkloadConfig = field(
        default_factory=lambda: WorkloadConfig(lengths=FixedLengths(tokens=1000), output_tokens=8)
    )


IDS = instance_ids(2, 1, 4)


def action_examples() -> list[NemesisEvent]:
    return [
        ACTIONS[e["action"]].config.model_validate(e)
        for fault in ACTIONS.entries()
        for e in examples("action", (fault.config.model_fields["action"].default,), fault.config)
    ]


def action_problems(name: str) -> list[str]:
    fault = ACTIONS[name]
    found = examples("action", (name,), fault.config)
    if not found:
        return [f"action {name!r} has no example (library, docs or its module docstring)"]
    try:
        ev = fault.config.model_validate(found[0])
        plan_faults(_Timeline([ev]), IDS, link_enabled=True)
    except Exception as exc:
        return [f"action {name!r}: {found[0]} does not validate or plan: {exc}"]
    return _documented_and_tested(name)


def checker_problems(entry: Checker[Any]) -> list[str]:
    found = examples("check", entry.names, entry.config)
    if not found:
        return [f"check {entry.names} has no example (library, docs or its module docstring)"]
    out = []
    timeline = [ev.model_copy(update={"end": ev.end or ev.at + 1.0}) for ev in action_examples()]
    for e in found:
        try:
            problems = entry.config.model_validate(e).problems(timeline, 3600.0)
        except Exception as exc:
            problems = [f"{e} does not validate: {exc}"]
        out += [f"check {e['check']!r} {p}" for p in problems]
    for name in entry.names:
        out += _documented_and_tested(name)
    return out


@pytest.mark.parametrize("name", sorted(n for n in POLICIES if not POLICIES.is_plugin(n)))
def test_every_policy_validates_plans_is_documented_and_tested(name: str) -> None:
    assert policy_problems(name) == []


@pytest.mark.parametrize("name", sorted(ACTIONS))
def test_every_action_validates_plans_is_documented_and_tested(name: str) -> None:
    assert action_problems(name) == []


@pytest.mark.parametrize("name", sorted(CHECKERS))
def test_every_checker_validates_plans_is_documented_and_tested(name: str) -> None:
    assert checker_problems(CHECKERS[name]) == []


# ------------------------------------------------------------------- the properties can fail


class _Untested:
    """An entry nobody documented, tested or gave an example: every property fails."""

    name: ClassVar[str] = "zz-undocumented-toy"
    deployment_kind: ClassVar[str] = "homogeneous"
    needs_threshold: ClassVar[bool] = False
    replans: ClassVar[bool] = False
    long_term: ClassVar[bool] = False
    cache_aware: ClassVar[bool] = False

    def __init__(self) -> None:
        raise RuntimeError("cannot be built")

    def decide(self, request: RequestView, snapshot: Snapshot) -> Route:
        raise NotImplementedError


class _UntestedCheck(CheckerConfig):
    check: Literal["zz_undocumented_check"] = "zz_undocumented_check"


def _never(cfg: CheckerConfig, run: CheckInput) -> CheckResult:
    return CheckResult("zz_undocumented_check", True, "")


def test_a_broken_entry_fails_every_property() -> None:
    prop: Callable[..., list[str]]
    with POLICIES.added(_Untested):  # type: ignore[type-abstract]
        prop = policy_problems
        problems = prop(_Untested.name)
    assert len(problems) == 3, problems
    assert problems[0].startswith("does not validate or plan: RuntimeError: cannot be built")
    assert "is in no doc" in problems[1] and "no test file mentions" in problems[2]
    entry = Checker(_UntestedCheck, _never)
    with CHECKERS.added(entry):
        assert checker_problems(entry) == [
            "check ('zz_undocumented_check',) has no example (library, docs or its module "
            "docstring)"
        ]
