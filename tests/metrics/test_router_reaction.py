"""An external router's reaction to faults (testbed.metrics.router_reaction), on synthetic
attempts and fault events: failures by the router's reason, retries and orphan halves as the
workers saw them, and per fault the last call the router sent to the instances it cut off."""

from __future__ import annotations

from typing import Any

import pytest

from testbed.metrics.records import HistoryEvent, RequestRecord
from testbed.metrics.router_reaction import reaction_lines, router_reaction


def _attempt(at: float, side: str, outcome: str = "completed", **kw: Any) -> HistoryEvent:
    return HistoryEvent(at + 0.2, "attempt", {"at": at, "side": side, "outcome": outcome, **kw})


def _fault(t: float, phase: str, index: int, action: str, target: str) -> HistoryEvent:
    data = {"action": action, "phase": phase, "index": index, "target": target, "at": t}
    return HistoryEvent(t, "fault", data)


def _rec(rid: str, arrival: float, reason: str | None = None) -> RequestRecord:
    rec = RequestRecord(id=rid, input_tokens=100, output_tokens=4, arrival=arrival)
    if reason is None:
        rec.status = "completed"
    else:
        rec.failure_reason = reason
    return rec


P0 = {"instance": "prfaas-prefill-0", "cluster": "prfaas"}
P1 = {"instance": "prfaas-prefill-1", "cluster": "prfaas"}
L0 = {"instance": "local-prefill-0", "cluster": "local"}
D0 = {"instance": "local-decode-0", "cluster": "local"}


def test_the_last_call_to_a_killed_instance_and_what_the_clients_saw() -> None:
    history = [
        HistoryEvent(0.0, "control_path", {"proxies": {"prfaas-prefill-0": "http://h:1"}}),
        _attempt(1.0, "prefill", request="r1", **P0),
        _attempt(1.0, "decode", request="r1", prefill_target="prfaas-prefill-0", **D0),
        _fault(3.0, "start", 0, "kill", "prfaas-prefill-0"),
        # the dead prefill logs nothing; the decode half the gateway paired with it does
        _attempt(3.5, "decode", "failed", request="r2", prefill_target="prfaas-prefill-0", **D0),
        _attempt(4.0, "prefill", request="r2", **L0),  # the retry, elsewhere
        _attempt(4.0, "decode", request="r2", prefill_target="local-prefill-0", **D0),
        _attempt(
            4.5,
            "decode",
            "released",
            reason="gone",
            request="r3",
            prefill_target="prfaas-prefill-0",
            **D0,
        ),
        _attempt(6.0, "prefill", request="r4", **P1),
        _fault(7.0, "end", 0, "kill", "prfaas-prefill-0"),
        _attempt(8.0, "prefill", request="r5", **P0),  # back in rotation after the restart
    ]
    records = [_rec("r1", 1.0), _rec("r2", 3.4), _rec("r3", 4.4, "router: 500 prefill down"),
               _rec("r4", 5.9), _rec("r5", 7.9)]  # fmt: skip
    out = router_reaction(records, history)
    assert out is not None
    assert out["failures"] == {"router: 500 prefill down": 1}
    assert out["attempts"] == {
        "decode": {"completed": 2, "failed": 1, "released": 1},
        "prefill": {"completed": 4},
    }
    assert out["retried_requests"] == {"decode": 1, "prefill": 0}  # r2 reached decode twice
    assert out["orphans"] == {"decode": {"gone": 1}}
    (kill,) = out["faults"]
    assert kill["instances"] == ["prfaas-prefill-0"]
    assert kill["attempts_during"] == 2  # r2's and r3's decode halves, paired with the dead one
    assert kill["stopped_after_s"] == pytest.approx(1.5)
    assert kill["window_s"] == pytest.approx(4.0)
    assert kill["client_failures_during"] == 1
    assert kill["last_failure_s"] == pytest.approx(1.4)
    assert out["control_path"] == {"prfaas-prefill-0": "http://h:1"}
    text = "\n".join(reaction_lines(out))
    assert "prfaas-prefill-0 = http://h:1" in text and "| kill prfaas-prefill-0 | 3.0 s |" in text


def test_a_link_fault_cuts_off_every_prfaas_prefill_and_an_open_fault_runs_to_the_end() -> None:
    history = [
        _attempt(0.5, "prefill", request="a", **P0),
        _attempt(0.6, "prefill", request="b", **P1),
        _attempt(0.7, "prefill", request="c", **L0),
        _fault(2.0, "start", 0, "partition", "link"),
        _attempt(2.5, "prefill", "failed", reason="cut", request="d", **P1),
        _attempt(2.6, "prefill", request="e", **L0),
        _attempt(9.0, "prefill", request="f", **L0),
        _fault(1.0, "start", 1, "burst", "link"),  # no instance to cut off: left out
    ]
    out = router_reaction([], history)
    assert out is not None
    (part,) = out["faults"]
    assert part["instances"] == ["prfaas-prefill-0", "prfaas-prefill-1"]
    assert part["end_s"] is None and part["window_s"] is None
    assert part["attempts_during"] == 1 and part["stopped_after_s"] == pytest.approx(0.5)
    assert part["client_failures_during"] == 0 and part["last_failure_s"] is None


def test_no_attempts_no_section() -> None:
    """Our own router's runs journal no attempts: the summary has no such section."""
    assert router_reaction([_rec("r", 0.0)], [_fault(1.0, "start", 0, "kill", "x")]) is None
    assert reaction_lines(None) == []
