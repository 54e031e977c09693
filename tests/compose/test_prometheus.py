"""A Prometheus server beside a compose deployment (issue #17 item 3's last part).

The live test (marker `compose`) stands the tiny deployment up on the compose substrate with
`prometheus=True`, sends a few requests, and asks Prometheus's HTTP API: every target (the
router and each worker's /metrics) is up, and a query for the vLLM-named counters returns
samples from them. The rest checks, without Docker, what is generated for Prometheus and that
`testbed up --prometheus` reaches the standing deployment (or is refused off compose).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from testbed.cli import main
from testbed.errors import UserError
from testbed.scenario.plan import RunOptions, RunPlan, RunResult, prepare_run
from testbed.scenario.schema import load_scenario
from testbed.scenario.standing import Endpoints, at_time_scale, stand_up
from testbed.services.pd import DECODE_PREFIX, PREFILL_PREFIX
from testbed.substrate.compose.prometheus import (
    CONFIG_DIR,
    PrometheusServer,
    prometheus_config,
    scrape_targets,
)

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "tiny.yaml"


# ------------------------------------------------------------------ without Docker


def test_targets_cover_every_metrics_path_with_its_labels(tmp_path: Path) -> None:
    docs = scrape_targets(
        [("router", "router", "local", 4001), ("local-pd-0", "pd", "local", 4003),
         ("prfaas-prefill-0", "prefill", "prfaas", 4002)]
    )  # fmt: skip
    got = {(d["labels"]["service"], d["labels"]["role"], d["labels"]["__metrics_path__"],
            d["targets"][0]) for d in docs}  # fmt: skip
    assert got == {
        ("router", "router", "/metrics", "127.0.0.1:4001"),
        ("prfaas-prefill-0", "prefill", "/metrics", "127.0.0.1:4002"),
        ("local-pd-0", "prefill", f"{PREFILL_PREFIX}/metrics", "127.0.0.1:4003"),
        ("local-pd-0", "decode", f"{DECODE_PREFIX}/metrics", "127.0.0.1:4003"),
    }
    conf = prometheus_config(0.5)
    assert conf["global"]["scrape_interval"] == "500ms"
    (job,) = conf["scrape_configs"]
    assert job["file_sd_configs"][0]["files"] == [f"{CONFIG_DIR}/targets.json"]
    # a restarted service on another port replaces its target instead of adding one
    server = PrometheusServer(tmp_path / "prometheus")
    server.set_target("router", "router", "local", 4001)
    server.set_target("router", "router", "local", 4009)
    written = json.loads((tmp_path / "prometheus" / "targets.json").read_text())
    assert [d["targets"] for d in written] == [["127.0.0.1:4009"]]
    yaml.safe_dump(conf)  # serialisable as prometheus.yml


def test_up_prometheus_flag_reaches_the_standing_deployment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import testbed.cli.up as cli_up

    seen: list[bool] = []

    async def fake(rp: RunPlan, opts: RunOptions, *, on_ready: Any, prometheus: bool,
                   **_kw: Any) -> RunResult:  # fmt: skip
        seen.append(prometheus)
        ep = Endpoints("http://r/v1", "http://r", None, {}, prometheus="http://127.0.0.1:9")
        on_ready(ep)
        return RunResult(opts.out_dir, [], [], {}, [])

    monkeypatch.setattr(cli_up, "stand_up", fake)
    monkeypatch.setattr(cli_up, "to_text", lambda summary: "summary")
    argv = ["up", str(TINY), "--out", str(tmp_path / "o"), "--substrate", "compose"]
    assert main([*argv, "--prometheus"]) == 0
    assert main(argv) == 0
    assert seen == [True, False]
    assert "Prometheus:       http://127.0.0.1:9" in capsys.readouterr().out
    # off compose it is refused before anything starts
    assert main(["up", str(TINY), "--prometheus"]) == 2
    assert "--prometheus needs --substrate compose" in capsys.readouterr().err
    assert seen == [True, False]


async def test_stand_up_refuses_prometheus_off_compose(tmp_path: Path) -> None:
    opts = RunOptions(out_dir=tmp_path / "out", progress=False)
    rp = at_time_scale(prepare_run(load_scenario(TINY), opts), 1.0)
    with pytest.raises(UserError, match="compose substrate"):
        await stand_up(rp, opts, prometheus=True)


# ------------------------------------------------------------------ live, on Docker


def _docker_available() -> bool:
    if shutil.which("docker") is None:
        return False
    probe = subprocess.run(["docker", "info"], capture_output=True, timeout=60)
    return probe.returncode == 0


async def _api(session: aiohttp.ClientSession, url: str, **params: str) -> Any:
    async with session.get(url, params=params) as resp:
        doc = await resp.json()
    assert doc["status"] == "success", doc
    return doc["data"]


async def _until(check: Any, what: str, timeout_s: float = 90.0) -> Any:
    """Poll `check()` until it returns something truthy (bounded)."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(1.0)
    pytest.fail(f"{what} within {timeout_s:.0f}s; last answer: {last}")


@pytest.mark.compose
@pytest.mark.timeout(1800)
async def test_prometheus_scrapes_router_and_every_worker(tmp_path: Path) -> None:
    if not _docker_available():
        pytest.skip("no Docker engine here")
    opts = RunOptions(substrate="compose", out_dir=tmp_path / "out", progress=False)
    rp = at_time_scale(prepare_run(load_scenario(TINY), opts), 1.0)
    ready: asyncio.Future[Endpoints] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()
    task = asyncio.create_task(
        stand_up(rp, opts, faults=False, on_ready=ready.set_result, stop=stop, prometheus=True)
    )
    try:
        async with asyncio.timeout(900):  # images may be built first
            ep = await asyncio.shield(ready)
        assert ep.prometheus is not None and ep.prometheus.startswith("http://127.0.0.1:")
        prom = ep.prometheus
        services = {"router", "prfaas-prefill-0", "local-prefill-0", "local-decode-0"}
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            body = {"model": "internal-1t-hybrid", "prompt": "scrape me", "max_tokens": 4}
            for _ in range(3):
                async with session.post(f"{ep.openai_base}/completions", json=body) as resp:
                    assert resp.status == 200, await resp.text()

            async def all_up() -> dict[str, str] | None:
                data = await _api(session, f"{prom}/api/v1/targets")
                health = {t["labels"]["service"]: t["health"] for t in data["activeTargets"]}
                up = set(health) == services and set(health.values()) == {"up"}
                return health if up else None

            health = await _until(all_up, "every target up")
            assert set(health) == services

            async def prompt_tokens() -> list[Any] | None:
                data = await _api(session, f"{prom}/api/v1/query", query="vllm:prompt_tokens_total")
                got = [r for r in data["result"] if float(r["value"][1]) > 0]
                return got or None

            samples = await _until(prompt_tokens, "vllm:prompt_tokens_total samples")
            assert {s["metric"]["job"] for s in samples} == {"testbed"}
            assert "router" in {s["metric"]["service"] for s in samples}
            data = await _api(session, f"{prom}/api/v1/query", query="up")
            assert {r["metric"]["service"] for r in data["result"]} == services
    finally:
        stop.set()
        async with asyncio.timeout(300):
            result = await task
    assert result.exit_code == 0, [c.detail for c in result.checks if not c.ok]
    out = opts.out_dir
    assert (out / "prometheus" / "prometheus.yml").exists()
    assert (out / "logs" / "prometheus.log").stat().st_size > 0
    # the run's teardown removed the Prometheus container with the rest
    left = subprocess.run(
        ["docker", "ps", "-aq", "--filter", "label=com.prfaas-testbed.service=prometheus"],
        capture_output=True, text=True, timeout=60,
    ).stdout.split()  # fmt: skip
    assert not left
    print(f"prometheus targets: {sorted(health.items())}", file=sys.stderr)


def test_images_prometheus_flag_builds_the_prometheus_image(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from testbed.substrate.compose import __main__ as compose_cli

    calls: list[tuple[str, bool]] = []

    def images(*, force: bool) -> str:
        calls.append(("testbed", force))
        return "tag"

    def prometheus(*, force: bool) -> str:
        calls.append(("prometheus", force))
        return "ptag"

    monkeypatch.setattr(compose_cli, "ensure_images", images)
    monkeypatch.setattr(compose_cli, "ensure_prometheus_image", prometheus)
    assert compose_cli.main(["images"]) == 0
    assert calls == [("testbed", False)]
    assert compose_cli.main(["images", "--prometheus", "--force"]) == 0
    assert calls[1:] == [("testbed", True), ("prometheus", True)]
