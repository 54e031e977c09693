"""`testbed run --substrate sim`: the same results files in virtual time, byte-identical for the
same scenario and seed, `--seed` honoured, what the sim does not model refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testbed.cli import main
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.schema import load_scenario
from testbed.scenario.sim_run import run_sim, sim_inputs
from testbed.sim import simulate
from testbed.sim.loop import VirtualLoop

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios"


def _run(tmp: Path, name: str, *extra: str) -> tuple[int, Path]:
    out = tmp / name
    rc = main(["run", str(SCENARIOS / f"{name}.yaml"), "--substrate", "sim", "--quiet",
               "--out", str(out), *extra])  # fmt: skip
    return rc, out


def test_same_scenario_and_seed_give_byte_identical_requests(tmp_path: Path) -> None:
    rc1, a = _run(tmp_path / "1", "link-flap")
    # and in another process, with another hash seed (no set or dict order leaks in)
    b = tmp_path / "2" / "link-flap"
    cmd = [sys.executable, "-m", "testbed.cli", "run", str(SCENARIOS / "link-flap.yaml"),
           "--substrate", "sim", "--quiet", "--out", str(b)]  # fmt: skip
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    rc2 = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, check=False).returncode
    assert rc1 == rc2 == 0
    first = (a / "requests.jsonl").read_bytes()
    assert first == (b / "requests.jsonl").read_bytes()
    assert len(first.splitlines()) > 100
    # and the faults really played (partitions, resets) in that history
    kinds = [json.loads(x) for x in (a / "history.jsonl").read_text().splitlines()]
    assert {e["action"] for e in kinds if e["kind"] == "fault"} >= {"partition", "reset_peer"}


def test_seed_override_changes_the_run_and_is_recorded(tmp_path: Path) -> None:
    _, a = _run(tmp_path / "1", "burst", "--duration", "60")
    _, b = _run(tmp_path / "2", "burst", "--duration", "60", "--seed", "99")
    sa = json.loads((a / "summary.json").read_text())
    sb = json.loads((b / "summary.json").read_text())
    assert (sa["seed"], sb["seed"]) == (7, 99)
    assert (a / "requests.jsonl").read_bytes() != (b / "requests.jsonl").read_bytes()


def test_seed_reaches_the_plan_on_every_substrate() -> None:
    sc = load_scenario(SCENARIOS / "burst.yaml")
    base = prepare_run(sc, RunOptions(substrate="local", duration_s=60))
    other = prepare_run(sc, RunOptions(substrate="local", duration_s=60, seed=99))
    assert other.scenario.seed == 99
    assert [r.arrival for r in base.requests] != [r.arrival for r in other.requests]


def test_summary_says_sim_and_where_the_wall_time_went(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out = _run(tmp_path, "paper")
    assert rc == 0
    text = capsys.readouterr().out
    assert "simulated in virtual time" in text and "time_scale" not in text
    assert "s running" in text
    s = json.loads((out / "summary.json").read_text())
    assert s["substrate"] == "sim"
    assert s["link"]["mean_gbps"] > 0 and s["link"]["samples"] > 10  # sampled like live
    assert set(s["routes"]) == {"local", "prfaas"}
    assert s["queues"]  # queue depth samples per cluster/role
    wall = s["wall"]
    assert set(wall) == {"simulate_s", "results_s", "total_s"}
    assert 0 < wall["simulate_s"] <= wall["total_s"]
    assert 0 < wall["results_s"] <= wall["total_s"]
    for name in ("requests.jsonl", "history.jsonl", "report.md", "timeline.png"):
        assert (out / name).stat().st_size > 0


def test_timeline_off_writes_every_other_file_and_no_image(tmp_path: Path) -> None:
    """RunOptions.timeline=False (the test suite's runs): no timeline.png, and a report that
    does not embed one; the same requests.jsonl and summary figures as a run that draws it."""
    sc = load_scenario(SCENARIOS / "burst.yaml")
    runs = {}
    for draw in (True, False):
        out = tmp_path / str(draw)
        opts = RunOptions(substrate="sim", out_dir=out, progress=False, timeline=draw)
        result = run_sim(prepare_run(sc, opts), opts)
        runs[draw] = (out, result)
    (drawn, a), (bare, b) = runs[True], runs[False]
    assert (drawn / "timeline.png").exists() and not (bare / "timeline.png").exists()
    assert "## Timeline" in (drawn / "report.md").read_text()
    assert "## Timeline" not in (bare / "report.md").read_text()
    assert (drawn / "requests.jsonl").read_bytes() == (bare / "requests.jsonl").read_bytes()
    assert a.summary["ttft_s"] == b.summary["ttft_s"]


def test_event_count_grows_with_requests_not_tokens(tmp_path: Path) -> None:
    """Ten times the output tokens, about the same number of timers per request."""
    sc = load_scenario(SCENARIOS / "paper.yaml")
    counts = []
    original = VirtualLoop.call_at
    for out_tokens in (100, 1000):
        var = sc.model_copy(
            update={"workload": sc.workload.model_copy(update={"output_tokens": out_tokens})}
        )
        rp = prepare_run(var, RunOptions(substrate="sim", out_dir=tmp_path))
        calls = 0

        def counting(self: VirtualLoop, *a: object, **k: object) -> object:
            nonlocal calls
            calls += 1
            return original(self, *a, **k)  # type: ignore[arg-type]

        VirtualLoop.call_at = counting  # type: ignore[method-assign,assignment]
        try:
            simulate(sim_inputs(rp, RunOptions(substrate="sim", out_dir=tmp_path)))
        finally:
            VirtualLoop.call_at = original  # type: ignore[method-assign]
        counts.append((calls, len(rp.requests)))
    (few, n), (many, n2) = counts
    assert n > 100 and n2 > 100
    assert many / n2 < 1.5 * few / n, counts  # per request, not x10
    assert many / n2 < 40, counts  # a 1,000-token request is not 1,000 timers


def _refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], doc: dict[str, object]) -> str:
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(doc))
    rc = main(["run", str(path), "--substrate", "sim", "--quiet", "--out", str(tmp_path / "o")])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    return err


def test_torch_engine_and_tc_shaper_are_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["run", str(SCENARIOS / "real-model.yaml"), "--substrate", "sim", "--quiet",
               "--out", str(tmp_path / "rm")])  # fmt: skip
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert "engine: torch" in err and len(err.splitlines()) == 1
    doc = yaml.safe_load((SCENARIOS / "burst.yaml").read_text())
    doc["deployments"]["prfaas-pd"]["link"]["shaper"] = "tc"
    assert "shaper: tc" in _refused(tmp_path, capsys, doc)
    assert not (tmp_path / "o").exists()  # refused before anything ran


def test_run_sim_returns_the_checked_result(tmp_path: Path) -> None:
    sc = load_scenario(SCENARIOS / "decode-crash.yaml")
    opts = RunOptions(substrate="sim", out_dir=tmp_path)
    result = run_sim(prepare_run(sc, opts), opts)
    assert result.ok, [(c.name, c.detail) for c in result.checks]
    assert result.summary["retries"] > 0  # the killed decode's requests were retried


def test_a_request_ends_when_both_its_decode_and_its_kv_acknowledgement_have(
    tmp_path: Path,
) -> None:
    """One output token over a 4 s RTT: the last token comes before the prefill's KV is
    acknowledged; the record still has the transfer's end and the bytes sent (as live, where
    the router awaits the prefill's answer before the decode's end)."""
    sc = load_scenario(SCENARIOS / "burst.yaml")
    dep = sc.deployments["prfaas-pd"]
    link = dep.link.model_copy(update={"rtt": 4.0, "jitter": 0.0})
    sc = sc.model_copy(
        update={
            "deployments": {"prfaas-pd": dep.model_copy(update={"link": link})},
            "workload": sc.workload.model_copy(update={"output_tokens": 1}),
            "checkers": [],
        }
    )
    opts = RunOptions(substrate="sim", out_dir=tmp_path, duration_s=60)
    result = run_sim(prepare_run(sc, opts), opts)
    assert result.ok, [(c.name, c.detail) for c in result.checks]
    crossed = [r for r in result.records if r.cross_dc]
    assert crossed
    for r in crossed:
        assert r.last_token is not None and r.transfer_end is not None
        assert r.transfer_end > r.last_token  # acknowledged after the only token
        assert r.kv_wire_bytes_sent == r.kv_wire_bytes_expected
