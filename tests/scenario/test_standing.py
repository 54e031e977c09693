"""`testbed up` (issue #17 item 1): a standing deployment serves outside clients at time_scale 1,
streams every token as produced, plays the scenario's faults (or not), records every request
any client sent, writes the usual results when stopped, and leaves nothing running."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from testbed.clock import LiveClock
from testbed.engine.emulated import DecodeBatcher, DecodeSlot
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.schema import load_scenario
from testbed.scenario.standing import Endpoints, at_time_scale, stand_up
from testbed.services.engines.emulated import EmulatedDecode
from testbed.services.spec import ServiceSpec

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "tiny.yaml"


async def _batches(flush_interval: float) -> list[int]:
    """Token counts of each emit of one 40-token request (1 ms steps at time_scale 1)."""
    clock = LiveClock(time_scale=1.0)
    batcher = DecodeBatcher(lambda _b: 0.001, 8, clock, flush_interval)
    emits: list[int] = []
    slot = DecodeSlot("r", 40, emit=lambda k, _t: emits.append(k))
    task = asyncio.create_task(batcher.run())
    batcher.submit(slot)
    async with asyncio.timeout(30):  # bounds a hang, not a speed claim
        await slot.done.wait()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return emits


async def test_flush_interval_zero_streams_every_token_as_produced() -> None:
    assert await _batches(0.0) == [1] * 40
    coalesced = await _batches(0.01)  # 10 ms of 1 ms steps per chunk
    assert sum(coalesced) == 40 and len(coalesced) < 10 and max(coalesced) == 10
    spec = ServiceSpec(role="decode", id="d", flush_interval_s=0.0)
    assert EmulatedDecode(spec, LiveClock.of(spec), 8).batcher.flush_interval == 0.0


def _plan(tmp_path: Path, **update: Any) -> tuple[Any, RunOptions]:
    sc = load_scenario(TINY)
    if update:
        sc = sc.model_copy(update=update)
    opts = RunOptions(out_dir=tmp_path / "out", progress=False, percentiles=(95.0,))
    return at_time_scale(prepare_run(sc, opts), 1.0), opts


@pytest.mark.slow
async def test_standing_deployment_serves_records_and_cleans_up(tmp_path: Path) -> None:
    rp, opts = _plan(tmp_path)
    assert rp.scenario.scale.time_scale == 1.0 and rp.scenario.scale.byte_scale == 2000
    ready: asyncio.Future[Endpoints] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()
    task = asyncio.create_task(
        stand_up(rp, opts, faults=False, on_ready=ready.set_result, stop=stop, drain_s=10)
    )
    async with asyncio.timeout(120):
        ep = await ready
    assert ep.openai_base.endswith("/v1") and ep.link_api is not None
    assert set(ep.metrics) >= {"router", "local-decode-0", "prfaas-prefill-0"}
    async with aiohttp.ClientSession() as session:
        body = {
            "model": "internal-1t-hybrid",
            "prompt": "the link is slow",
            "max_tokens": 12,
            "stream": True,
        }
        async with session.post(f"{ep.openai_base}/completions", json=body) as resp:
            events = [line async for line in resp.content if line.startswith(b"data: {")]
        assert len(events) == 12 + 1  # one event per token (flush_interval_s 0), then the end
        chat = {
            "model": "internal-1t-hybrid",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 3,
        }
        async with session.post(f"{ep.openai_base}/chat/completions", json=chat) as resp:
            assert resp.status == 200
        async with session.get(f"{ep.router}/generate") as resp:
            assert resp.status == 405  # the run's own endpoint stays POST-only
    stop.set()
    async with asyncio.timeout(120):
        result = await task
    assert result.exit_code == 0, [c.detail for c in result.checks if not c.ok]
    out = opts.out_dir
    for name in ("requests.jsonl", "summary.json", "report.md", "timeline.png", "history.jsonl"):
        assert (out / name).stat().st_size > 0, name
    recs = sorted(result.records, key=lambda r: r.arrival)
    assert [r.status for r in recs] == ["completed", "completed"]
    assert recs[0].tokens_out == 12 and recs[0].token_chunks == 12
    assert recs[0].itl_min is not None and recs[0].itl_std is not None
    s = result.summary
    assert s["scale"]["time"] == 1.0 and s["requests"]["submitted"] == 2
    assert "p95" in s["ttft_s"] and s["benchmark"]["total_output_tokens"] == 15
    assert s["metadata"]["seed"] == rp.scenario.seed
    assert s["duration_s"] > 0 and not s["faults"]
    # every process is gone: the router and the link API refuse connections
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        for url in (ep.router, ep.link_api):
            with pytest.raises(aiohttp.ClientConnectionError):
                async with session.get(f"{url}/health" if url == ep.router else url):
                    pass


@pytest.mark.slow
async def test_faults_play_against_a_standing_deployment_unless_told_not_to(
    tmp_path: Path,
) -> None:
    nemesis = [{"action": "bandwidth", "at": "1s", "for": "2s", "bandwidth": "10Gbps"}]
    sc = load_scenario(TINY)
    sc = type(sc).model_validate({**sc.model_dump(mode="json"), "nemesis": nemesis})
    for faults in (True, False):
        opts = RunOptions(out_dir=tmp_path / str(faults), progress=False)
        rp = at_time_scale(prepare_run(sc, opts), 1.0)
        assert len(rp.faults) == 1
        stop = asyncio.Event()
        ready = asyncio.Event()
        task = asyncio.create_task(
            stand_up(rp, opts, faults=faults, on_ready=lambda _e, r=ready: r.set(), stop=stop)
        )
        async with asyncio.timeout(120):
            await ready.wait()
        await asyncio.sleep(4.0)  # the fault's window (1 s to 3 s) has passed
        stop.set()
        async with asyncio.timeout(120):
            result = await task
        kinds = [f.get("action") for f in result.summary["faults"]]
        assert ("bandwidth" in kinds) is faults, kinds


@pytest.mark.slow
def test_testbed_up_stops_on_sigint_and_writes_results(tmp_path: Path) -> None:
    out = tmp_path / "up"
    cmd = [sys.executable, "-m", "testbed.cli", "up", str(TINY), "--out", str(out), "--no-faults"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    banner = []
    for _ in range(40):  # bounded: the banner is a handful of lines
        line = proc.stdout.readline()
        banner.append(line)
        if not line or line.startswith("serving at"):
            break
    text = "".join(banner)
    assert "OpenAI base URL:" in text and "/v1" in text and "metrics router:" in text
    assert "link API:" in text and "time_scale 1;" in text
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "requests: 0 submitted" in rest
    assert (out / "summary.json").exists() and (out / "report.md").exists()


def test_time_scale_flag_warns_that_client_times_are_scaled(tmp_path: Path) -> None:
    from testbed.cli import build_parser

    args = build_parser().parse_args(["up", str(TINY), "--time-scale", "5", "--no-faults"])
    assert args.time_scale == 5.0 and args.no_faults
    rp, _ = _plan(tmp_path)
    assert at_time_scale(rp, 5.0).scenario.scale.time_scale == 5.0
    proc = subprocess.run(
        [sys.executable, "-m", "testbed.cli", "up", str(TINY), "--time-scale", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "greater than zero" in proc.stderr
