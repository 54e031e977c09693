"""The sim's records and history streamed (testbed.metrics.stream, testbed.metrics.history):
the same requests.jsonl, history.jsonl and summary as a run that held them, from a run that did
not (issue #35: the 10K-GPU hour in bounded memory)."""

from __future__ import annotations

import json
from pathlib import Path

from testbed.clock import Scale
from testbed.metrics.files import write_jsonl_atomic
from testbed.metrics.stream import RecordStream
from testbed.metrics.summary import summarize
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.schema import load_scenario
from testbed.scenario.sim_run import sim_inputs
from testbed.sim import simulate

ROOT = Path(__file__).resolve().parents[2]


def test_a_streamed_run_writes_and_summarises_what_a_held_run_does(tmp_path: Path) -> None:
    """decode-crash: a fault, retries, records finishing out of submission order."""
    sc = load_scenario(ROOT / "scenarios" / "decode-crash.yaml")
    opts = RunOptions(substrate="sim", out_dir=tmp_path)
    rp = prepare_run(sc, opts)
    held = simulate(sim_inputs(rp, opts))
    streamed = simulate(sim_inputs(rp, opts), RecordStream(tmp_path / "requests.jsonl"))
    assert streamed.records == [] and streamed.table is not None
    assert streamed.run_history is not None and streamed.history == []
    write_jsonl_atomic(tmp_path / "held.jsonl", (r.to_json() for r in held.records))
    lines = (tmp_path / "requests.jsonl").read_bytes()
    assert lines == (tmp_path / "held.jsonl").read_bytes()
    assert len(lines.splitlines()) == len(rp.requests) > 100
    finished = [r.last_token or r.arrival for r in held.records]
    assert finished != sorted(finished)  # they did finish out of the file's order

    def same(doc: dict[str, object]) -> str:  # the decisions event's wall figures vary
        return json.dumps({k: v for k, v in doc.items() if not str(k).endswith("wall_ms")})

    assert [same(d) for d in streamed.run_history.docs()] == [
        same(e.to_json()) for e in held.history
    ]
    assert len(streamed.run_history) == len(held.history)
    assert [e for e in streamed.run_history if e.kind != "decisions"] == [
        e for e in held.history if e.kind != "decisions"
    ]

    def summary(records: object, history: object) -> dict[str, object]:
        s = summarize(records, history, duration_s=rp.duration_s, slo=sc.slo,  # type: ignore[arg-type]
                      scale=Scale.of(sc.scale))  # fmt: skip
        s["decisions"].pop("latency_wall_ms")  # type: ignore[attr-defined]  # wall: varies
        return s

    a, b = summary(held.records, held.history), summary(streamed.table, streamed.run_history)
    assert a == b
    assert a["retries"] > 0
    assert a["queues"]  # the queue samples, from columns on one side


def test_an_aborted_stream_leaves_the_previous_file(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_text("old\n")
    stream = RecordStream(path)
    stream.abort()
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["requests.jsonl"]
