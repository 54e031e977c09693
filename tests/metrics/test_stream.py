"""RecordStream's order and RunHistory's, against the list-and-sort they replace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.metrics.files import jsonl_line, write_jsonl_atomic
from testbed.metrics.history import RunHistory, events
from testbed.metrics.records import HistoryEvent, RequestRecord
from testbed.metrics.stream import RecordFile, RecordStream
from testbed.metrics.summary import queue_depth_series


def _rec(i: int, **kw: object) -> RequestRecord:
    return RequestRecord(f"r{i}", 10 * i, 5, float(i), **kw)  # type: ignore[arg-type]


def test_records_are_written_in_submission_order_whatever_order_they_finish(
    tmp_path: Path,
) -> None:
    path = tmp_path / "requests.jsonl"
    stream = RecordStream(path)
    for i in range(6):
        stream.submitted(f"r{i}")
    stream.put(_rec(2))
    stream.put(_rec(0))
    assert stream.lines == 1  # r0 written; r2 waits for r1
    stream.put(_rec(1, status="completed"))
    stream.put(_rec(1, status="failed"))  # a second record of a written request: ignored
    stream.put(_rec(5))
    stream.put(_rec(4, status="completed"))
    stream.put(_rec(4, status="failed", failure_reason="x"))  # replaces the one still held
    assert stream.lines == 3 and stream.received == 5
    assert not path.exists()  # renamed into place at the end
    stream.close()  # r3 never finished: left out, as the sim's list left it out
    expected = [_rec(0), _rec(1, status="completed"), _rec(2),
                _rec(4, status="failed", failure_reason="x"), _rec(5)]  # fmt: skip
    write_jsonl_atomic(tmp_path / "want.jsonl", (r.to_json() for r in expected))
    assert path.read_bytes() == (tmp_path / "want.jsonl").read_bytes()
    assert list(stream.table.arrival) == [0.0, 1.0, 2.0, 4.0, 5.0]
    back = RecordFile(path, 5)  # read from the file on every pass
    assert list(back) == expected and list(back) == expected and back[-1] == expected[-1]
    assert stream.table.records == expected  # a small run keeps them for its checkers


def test_a_run_past_keep_holds_no_records(tmp_path: Path) -> None:
    stream = RecordStream(tmp_path / "requests.jsonl", keep=2)
    for i in range(3):
        stream.submitted(f"r{i}")
        stream.put(_rec(i))
    stream.close()
    assert stream.table.records is None and len(stream.table) == 3


def _q(t: float, inst: str, depth: int, role: str = "prefill") -> HistoryEvent:
    return HistoryEvent(t, "queue", {"instance": inst, "cluster": "local", "role": role,
                                     "depth": depth})  # fmt: skip


def test_run_history_iterates_as_the_stable_sort_by_time() -> None:
    added = [
        HistoryEvent(0.0, "policy", {"threshold_tokens": 1.0}),
        _q(1.0, "a", 3),
        HistoryEvent(1.0, "link", {"wire_bytes": 5}),
        _q(1.0, "b", 1),
        HistoryEvent(0.5, "fault", {"action": "x"}),  # added late, earlier in time
        _q(2.0, "a", 0),
        _q(2.0, "b", 2, role="decode"),  # b switched role: another series
        _q(2.5, "c", 1.5),  # type: ignore[arg-type]  # not an int: kept as an event
    ]
    h = RunHistory()
    for e in added[:3]:
        h.append(e)
    h.extend(added[3:])
    want = sorted(added, key=lambda e: e.t)
    assert list(h) == want and len(h) == len(want)
    assert [h[i] for i in range(len(h))] == want and h[-1] == want[-1] and h[1:3] == want[1:3]
    assert list(h.docs()) == [e.to_json() for e in want]
    assert events(h, "fault", "link") == [e for e in want if e.kind in ("fault", "link")]
    assert queue_depth_series(h) == queue_depth_series(want)
    assert queue_depth_series(h)["local/prefill"] == ([1.0, 2.0, 2.5], [4, 1, 2])
    assert h.loose_queue
    h2 = RunHistory()
    h2.extend(added[:-1])  # every queue sample as columns
    assert not h2.loose_queue
    assert queue_depth_series(h2) == queue_depth_series(want[:-1])
    assert queue_depth_series(h2)["local/prefill"] == ([1.0, 2.0], [4, 1])


def test_a_results_line_is_what_json_dumps_gives_compact() -> None:
    """jsonl_line reuses _json's C encoder; its bytes must stay json.dumps's, for every kind of
    value a record or a history event carries (requests.jsonl is compared byte for byte)."""
    docs = [
        {"id": "r1", "t": 0.1 + 0.2, "tiny": 5e-05, "big": 1e16, "n": -3, "ok": True, "x": None},
        {"s": 'é "quoted"\n\t', "nested": {"a": [1, 2.5, None, {"b": False}]}, "e": []},
        {"nan": float("nan"), "inf": float("inf"), "neg": -float("inf")},
        {},
    ]
    for doc in docs:
        assert jsonl_line(doc) == json.dumps(doc, separators=(",", ":")) + "\n"
    with pytest.raises(TypeError, match="not JSON serializable"):
        jsonl_line({"x": object()})
