"""The checker registry: every check name of the old `CheckName` literal has one registered
function, which run_checker dispatches to (testbed/checkers/base.py, run.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

import pytest
from pydantic import BaseModel

from testbed.checkers import (
    CHECKERS,
    Checker,
    CheckerConfig,
    CheckInput,
    CheckResult,
    check_failures,
    check_latency,
    check_recover,
    check_reroute,
    check_throughput,
    run_checker,
    run_checkers,
)
from testbed.checkers.failures import FailuresCheck
from testbed.checkers.invariants import INVARIANTS, Invariant
from testbed.checkers.latency import LatencyCheck
from testbed.checkers.recover import RecoverCheck
from testbed.checkers.reroute import RerouteCheck
from testbed.checkers.throughput import ThroughputCheck
from testbed.metrics.records import HistoryEvent, RequestRecord

# the names of the old `CheckName` literal; checkers added since need not be listed here (what
# every entry keeps is a property of the registry: tests/test_registry_entries.py)
OLD_NAMES = {"ttft", "tpot", "e2e", "reroute", "recover", "failures", "token_exact", "throughput"}


def test_every_old_check_name_has_one_registered_checker() -> None:
    assert set(CHECKERS) >= OLD_NAMES
    assert CHECKERS["ttft"] is CHECKERS["tpot"] is CHECKERS["e2e"]  # one model, three names


def test_every_checker_model_of_the_package_is_registered_under_its_names() -> None:
    """Properties of the registry, not a list of it: each `CheckerConfig` a module of
    testbed/checkers defines is one entry, found by every name its `check` literal gives, and
    every registered name leads to the entry that answers to it."""
    import importlib
    import pkgutil

    import testbed.checkers

    models = {
        v
        for info in pkgutil.iter_modules(testbed.checkers.__path__, "testbed.checkers.")
        for v in vars(importlib.import_module(info.name)).values()
        if isinstance(v, type) and issubclass(v, CheckerConfig) and v is not CheckerConfig
        and v.__module__ == info.name and not issubclass(v, Invariant)
    }  # fmt: skip
    assert models == {entry.config for entry in CHECKERS.entries()}
    for entry in CHECKERS.entries():
        assert entry.names and all(CHECKERS[n] is entry for n in entry.names)
    assert sum(len(e.names) for e in CHECKERS.entries()) == len(set(CHECKERS))


def _records() -> list[RequestRecord]:
    base = RequestRecord(id="r", input_tokens=30_000, output_tokens=4, arrival=0.0)
    out = []
    for i in range(40):
        ok = i % 10 != 3
        out.append(
            replace(
                base, id=f"r{i:03d}", arrival=float(i * 5), status="completed" if ok else "failed",
                failure_reason=None if ok else "x", first_token=i * 5 + 1.0 + i / 20,
                last_token=i * 5 + 3.0, prefill_start=i * 5 + 0.5, tokens_out=4,
                prefill_instance="local-prefill-0", decode_instance="local-decode-0",
            )
        )  # fmt: skip
    return out


HISTORY = [
    HistoryEvent(0.0, "plan", {"lambda_max_rps": 0.1}),
    HistoryEvent(50.0, "fault", {"action": "partition", "phase": "start", "index": 0}),
    HistoryEvent(90.0, "fault", {"action": "partition", "phase": "end", "index": 0}),
]


@pytest.mark.parametrize(
    ("cfg", "direct"),
    [
        (LatencyCheck(check="tpot", p=50, max=1.0),
         lambda r, h: check_latency(r, "tpot", 50, 1.0, history=h)),
        (LatencyCheck(check="ttft", during="partition", max_ratio=1.5),
         lambda r, h: check_latency(r, "ttft", 90, float("inf"), history=h, during="partition",
                                    max_ratio=1.5)),
        (FailuresCheck(max_fraction=0.05), lambda r, h: check_failures(r, 40, 0.05)),
        (RerouteCheck(fault="partition", within=5),
         lambda r, h: check_reroute(r, h, "partition", 5)),
        (RecoverCheck(fault="partition", within=20, ttft=3, streak=2),
         lambda r, h: check_recover(r, h, "partition", 20, 3, 2)),
        (ThroughputCheck(after=10, until=150, min_fraction=0.5),
         lambda r, h: check_throughput(r, h, 10, 150, 0.5)),
    ],
)  # fmt: skip
def test_run_checker_gives_what_the_function_gives(cfg: CheckerConfig, direct: Any) -> None:
    records = _records()
    assert run_checker(cfg, records, HISTORY, 40) == direct(records, HISTORY)


class _Other(CheckerConfig):
    check: Literal["ttft"] = "ttft"


class _NotAConfig(BaseModel):
    check: Literal["nope"] = "nope"


def _fn(cfg: CheckerConfig, run: CheckInput) -> CheckResult:
    return CheckResult("x", True, "")


def test_a_taken_name_or_a_model_that_is_no_checker_config_is_refused() -> None:
    with pytest.raises(ValueError, match="check name 'ttft' is taken by checker testbed"):
        CHECKERS.register(Checker(_Other, _fn))
    with pytest.raises(TypeError, match="must derive from CheckerConfig"):
        CHECKERS.register(Checker(_NotAConfig, _fn))
    assert CHECKERS["ttft"].config is LatencyCheck


def test_the_invariants_are_checkers_called_as_registered_ones_are() -> None:
    """One calling convention: `run_checkers` calls each invariant as `(config, run)`, as it
    calls a registered checker; the invariants stay out of the registry (a scenario cannot list
    or drop them) and `generator_count` only applies when the planned count is known."""
    names = [inv.config().check for inv in INVARIANTS]
    assert names == ["nothing_lost", "kv_accounted", "no_unverified_decode", "generator_count"]
    assert not set(names) & set(CHECKERS)
    records = _records()
    ids = [r.id for r in records]
    run = CheckInput(records, HISTORY, len(ids), submitted_ids=ids, planned=40)
    direct = [inv.run(inv.config(), run) for inv in INVARIANTS]
    assert run_checkers(records, ids, history=HISTORY, planned=40) == direct
    assert [c.name for c in run_checkers(records, ids)] == names[:3]
