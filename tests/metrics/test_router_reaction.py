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


def test_a_killed_decode_is_traced_by_the_prefill_halves_no_decode_journaled() -> None:
    """The dead decode logs nothing and a prefill attempt does not name its decode: a prefill
    half whose room no decode journaled inside the window is a call for the cut-off decode."""
    d1 = {"instance": "local-decode-1", "cluster": "local"}
    history = [
        _attempt(1.0, "prefill", room=1, request="a", **P0),
        _attempt(1.0, "decode", room=1, request="a", prefill_target="prfaas-prefill-0", **D0),
        _fault(3.0, "start", 0, "kill", "local-decode-0"),
        # the gateway's decode half went to the dead decode: only the prefill half is journaled
        _attempt(3.2, "prefill", "failed", reason="no decode", room=2, request="b", **P0),
        _attempt(4.0, "prefill", room=3, request="b", **L0),  # the retry, paired with a live one
        _attempt(4.0, "decode", room=3, request="b", prefill_target="local-prefill-0", **d1),
        _attempt(5.5, "prefill", "released", reason="not pulled", room=4, request="c", **P1),
        _fault(7.0, "end", 0, "kill", "local-decode-0"),
        _attempt(8.0, "prefill", room=5, request="d", **P0),  # after the window: not counted
    ]
    out = router_reaction([_rec("c", 5.4, "router: 500 decode down")], history)
    assert out is not None
    (kill,) = out["faults"]
    assert kill["instances"] == ["local-decode-0"]
    assert kill["attempts_during"] == 2 and kill["unpaired"] == 2 and kill["held"] == 0
    assert kill["stopped_after_s"] == pytest.approx(2.5)
    assert kill["client_failures_during"] == 1 and kill["last_failure_s"] == pytest.approx(2.4)


def test_a_paused_prefill_counts_the_calls_it_read_on_resuming_at_their_client_arrival() -> None:
    """A paused instance holds the router's connections and journals their arrival when it
    resumes: such an attempt, for a request sent inside the window, counts at that request's
    client arrival; the decode halves paired with the paused prefill count as they arrived."""
    history = [
        _fault(2.0, "start", 0, "pause", "prfaas-prefill-0"),
        _attempt(2.5, "decode", "failed", request="a", prefill_target="prfaas-prefill-0", **D0),
        _fault(6.0, "end", 0, "pause", "prfaas-prefill-0"),
        _attempt(6.1, "prefill", request="b", **P0),  # sent at 3.3 s, read on resuming
        _attempt(6.1, "prefill", request="x", **P0),  # sent before the pause: not counted
        _attempt(6.2, "prefill", request="c", **P1),  # another instance: not counted
        _attempt(7.0, "prefill", request="d", **P0),  # sent after the pause: not counted
    ]
    records = [_rec("x", 1.5), _rec("a", 2.4), _rec("b", 3.3), _rec("c", 3.4), _rec("d", 6.9)]
    out = router_reaction(records, history)
    assert out is not None
    (pause,) = out["faults"]
    assert pause["attempts_during"] == 2 and pause["held"] == 1 and pause["unpaired"] == 0
    assert pause["stopped_after_s"] == pytest.approx(1.3)
    assert pause["client_failures_during"] == 0


def test_a_stream_broken_by_the_fault_counts_though_it_arrived_before() -> None:
    """A decode killed mid-stream fails requests that arrived before the fault, their last token
    just before its start: each counts; a stream that failed long before does not."""
    history = [
        _attempt(0.5, "prefill", room=1, request="a", **P0),
        _fault(3.0, "start", 0, "kill", "local-decode-0"),
        _fault(7.0, "end", 0, "kill", "local-decode-0"),
    ]
    broken = _rec("a", 0.4, "client: response payload is not completed")
    broken.first_token, broken.last_token, broken.tokens_out = 1.0, 2.95, 40
    older = _rec("b", 0.3, "client: response payload is not completed")
    older.first_token, older.last_token, older.tokens_out = 0.5, 1.0, 10  # broke before
    out = router_reaction([broken, older, _rec("c", 5.0, "router: 500")], history)
    assert out is not None
    (kill,) = out["faults"]
    assert kill["client_failures_during"] == 2 and kill["broken_streams"] == 1
    assert kill["last_failure_s"] == pytest.approx(2.0)
