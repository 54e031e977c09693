"""Live runs on the local substrate: real processes, real sockets, real KV bytes."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.runner import _Run
from testbed.scenario.schema import load_scenario
from testbed.services.router.text import codec
from tests.processes import descendants

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "tiny.yaml"

pytestmark = pytest.mark.slow


def _cli(*args: str, **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "testbed.cli", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,  # type: ignore[call-overload]
    )


def test_tiny_run_writes_results_and_passes_checkers(tmp_path: Path) -> None:
    proc = _cli("run", str(TINY), "--out", str(tmp_path), "--quiet")
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    for name in ("requests.jsonl", "history.jsonl", "summary.json", "report.md", "timeline.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    summary = json.loads((tmp_path / "summary.json").read_text())
    req = summary["requests"]
    assert req["submitted"] == req["completed"] + req["failed"] > 10
    assert req["failed"] == 0
    assert set(summary["routes"]) == {"prfaas", "local"}
    assert summary["scale"] == {"time": 20.0, "bytes": 2000.0}
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        assert set(summary[key]) == {"mean", "std", "min", "max", "p50", "p90", "p99"}
    assert all(c["ok"] for c in summary["checks"])
    records = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    for r in records:
        assert r["kv_wire_bytes_sent"] == r["kv_wire_bytes_received"] == r["kv_wire_bytes_expected"]
        assert r["arrival"] <= r["prefill_start"] <= r["prefill_end"] <= r["first_token"]
        assert r["first_token"] <= r["last_token"]
        assert r["tokens_out"] == r["output_tokens"] == 64
        assert r["cross_dc"] == (r["route"] == "prfaas")
    assert "check nothing_lost: ok" in out


def test_ctrl_c_stops_cleanly_and_keeps_what_was_recorded(tmp_path: Path) -> None:
    proc = _cli("run", str(TINY), "--out", str(tmp_path), "--quiet", "--duration", "2000")
    deadline = time.monotonic() + 60
    # wait until the load is running: the router's first records appear in the progress
    while time.monotonic() < deadline and not (tmp_path / "logs" / "router.log").exists():
        time.sleep(0.2)
    time.sleep(4)
    named = subprocess.run(
        ["pgrep", "^testbed-(router|prefill|decode)$"], capture_output=True, text=True
    ).stdout.split()
    children = [p for p in named if int(p) in descendants(proc.pid)]  # forked by its zygote
    assert len(children) == 4  # 1 PrfaaS + 1 PD-P + 1 PD-D + router
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["interrupted"] is True
    req = summary["requests"]
    assert req["submitted"] > 0
    assert req["submitted"] == req["completed"] + req["failed"]
    records = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert len(records) == req["submitted"]
    assert all(r["status"] == "completed" or r["failure_reason"] for r in records)
    # no service process is left behind
    assert [p for p in children if Path(f"/proc/{p}").exists()] == []


async def test_openai_client_streams_a_completion(tmp_path: Path) -> None:
    openai = pytest.importorskip("openai", reason="openai is in the dev extra")
    scenario = load_scenario(TINY)
    opts = RunOptions(out_dir=tmp_path, progress=False)
    run = _Run(prepare_run(scenario, opts), opts)
    await run.start()
    try:
        assert run.router is not None
        client = openai.AsyncOpenAI(base_url=f"{run.router.url}/v1", api_key="unused")
        stream = await client.completions.create(
            model="internal-1t-hybrid", prompt="hello " * 4000, max_tokens=12, stream=True
        )
        text, finish = "", None
        async for chunk in stream:
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        words = codec().filler  # the emulated engine's whole-word tokens (router.text)
        assert text == "".join(words[:12]) and len(codec().encode(text)) == 12
        assert finish == "length"
        plain = await client.completions.create(
            model="internal-1t-hybrid", prompt="hi", max_tokens=3
        )
        assert plain.choices[0].text == "".join(words[:3])
        assert plain.usage is not None and plain.usage.completion_tokens == 3
    finally:
        await run.shutdown()
    assert os.path.exists(tmp_path / "logs" / "router.log")
    await asyncio.sleep(0)


async def test_progress_reports_phases_in_real_world_units(tmp_path: Path) -> None:
    """#17 item 7: start-up apart from the run, then the load in real-world seconds, then the
    results; the last running report accounts for every request."""
    from testbed.scenario.plan import Progress
    from testbed.scenario.runner import run_scenario

    scenario = load_scenario(TINY)
    opts = RunOptions(out_dir=tmp_path, progress=True)
    rp = prepare_run(scenario, opts)
    seen: list[Progress] = []
    result = await run_scenario(rp, opts, seen.append)
    phases = [p.phase for p in seen]
    assert phases[0] == "starting" and seen[0].services == 4  # 1 PrfaaS + 1 PD-P + 1 PD-D + router
    assert phases[-1] == "results"
    assert "running" in phases
    order = {"starting": 0, "running": 1, "draining": 2, "results": 3}
    assert [order[p] for p in phases] == sorted(order[p] for p in phases)  # never goes back
    workload = [p.workload_s for p in seen if p.phase in ("running", "draining")]
    assert workload == sorted(workload)
    assert workload[0] >= 0 and workload[-1] == pytest.approx(rp.duration_s)
    last = seen[-1]
    assert last.done == last.submitted == result.summary["requests"]["submitted"]
    assert last.planned == len(rp.requests)
