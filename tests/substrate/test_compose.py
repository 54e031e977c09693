"""The compose substrate: containers as datacenters, the link container as the only path.

Needs a Docker engine and docker-compose (or the `docker compose` plugin). The session builds
the images first when they are missing or stale (the same code as `make images`; cached, about
a second when current).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.runner import _Run
from testbed.scenario.schema import load_scenario
from testbed.services.spec import ServiceSpec

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "tiny.yaml"

pytestmark = [pytest.mark.compose, pytest.mark.timeout(1800)]


def _docker_available() -> bool:
    if shutil.which("docker") is None:
        return False
    probe = subprocess.run(["docker", "info"], capture_output=True, timeout=60)
    return probe.returncode == 0


@pytest.fixture(scope="session")
def images() -> str:
    if not _docker_available():
        pytest.skip("no Docker engine here")
    from testbed.substrate.compose import ensure_images

    t = time.monotonic()
    tag = ensure_images(log=lambda msg: print(f"compose: {msg}", file=sys.stderr))
    print(f"images ready in {time.monotonic() - t:.1f}s", file=sys.stderr)
    return tag


def _spec(role: str, sid: str, cluster: str, **kw: Any) -> ServiceSpec:
    return ServiceSpec(
        role=role,  # type: ignore[arg-type]
        id=sid,
        cluster=cluster,  # type: ignore[arg-type]
        hardware="h200x8" if cluster == "prfaas" else "h20x8",
        time_scale=20,
        byte_scale=2000,
        **kw,
    )


PROBE = """
import json, socket, sys
out = {}
for name, host, port in json.loads(sys.argv[1]):
    try:
        socket.create_connection((host, port), timeout=2).close()
        out[name] = "connected"
    except OSError as exc:
        out[name] = type(exc).__name__
print(json.dumps(out))
"""


def _probe(container: Any, targets: list[tuple[str, str, int]]) -> dict[str, str]:
    rc, out = container.exec_run(["python", "-c", PROBE, json.dumps(targets)])
    assert rc == 0, out
    return dict(json.loads(out.decode().strip().splitlines()[-1]))


def _ctl_ip(sub: Any, container: Any) -> str:
    container.reload()
    return str(container.attrs["NetworkSettings"]["Networks"][sub.networks["ctl"]]["IPAddress"])


def test_images_are_cached(images: str) -> None:
    from testbed.substrate.compose import ensure_images

    t = time.monotonic()
    assert ensure_images() == images
    assert time.monotonic() - t < 30


async def test_only_the_link_container_joins_the_datacenters(images: str, tmp_path: Path) -> None:
    from testbed.config import LinkConfig, ScaleConfig
    from testbed.substrate.compose import ComposeSubstrate, leftovers

    sub = ComposeSubstrate(tmp_path / "logs")
    try:
        decode = await sub.start_service(_spec("decode", "local-decode-0", "local"))
        local_prefill = await sub.start_service(_spec("prefill", "local-prefill-0", "local"))
        prfaas = await sub.start_service(_spec("prefill", "prfaas-prefill-0", "prfaas"))
        assert decode.kv_addr is not None
        link = await sub.start_link(
            LinkConfig(),
            ScaleConfig(time_scale=20, byte_scale=2000),
            {"local-decode-0": decode.kv_addr},
            enabled=True,
            seed=1,
        )
        route = link.routes["local-decode-0"]
        d_ip, d_kv = decode.kv_addr
        d_ctl = _ctl_ip(sub, sub.instances["local-decode-0"].container)
        p_ip = sub.instances["prfaas-prefill-0"].ip
        from_prfaas = _probe(
            sub.instances[prfaas.spec.id].container,
            [
                ("decode kv direct", d_ip, d_kv),
                ("decode http direct", d_ip, 8000),
                ("decode over ctl", d_ctl, 8000),
                ("decode kv via link", route[0], route[1]),
            ],
        )
        assert from_prfaas["decode kv via link"] == "connected", from_prfaas
        for key in ("decode kv direct", "decode http direct", "decode over ctl"):
            assert from_prfaas[key] != "connected", from_prfaas
        from_local = _probe(
            sub.instances[local_prefill.spec.id].container,
            [("decode kv", d_ip, d_kv), ("prfaas prefill http", p_ip, 8000)],
        )
        assert from_local["decode kv"] == "connected", from_local  # the probe itself works
        assert from_local["prfaas prefill http"] != "connected", from_local
        # the link container is the one member of both datacenter networks
        sub.link_container.reload()
        nets = set(sub.link_container.attrs["NetworkSettings"]["Networks"])
        assert {sub.networks["prfaas"], sub.networks["local"]} <= nets
        for inst in sub.instances.values():
            inst.container.reload()
            attached = set(inst.container.attrs["NetworkSettings"]["Networks"])
            assert attached == {sub.networks[inst.spec.cluster], sub.networks["ctl"]}
        # the runner's two ways in: published 127.0.0.1 ports, and ctl addresses where routed
        for inst in sub.instances.values():
            for url in (f"http://127.0.0.1:{inst.host_port}", f"http://{inst.ctl_ip}:8000"):
                with urllib.request.urlopen(f"{url}/health", timeout=5) as resp:
                    assert resp.status == 200, url
        # tc inside the link container (NET_ADMIN), as `testbed link tc` does locally
        shown = await sub.shape_link(12.5e6)
        assert "tbf" in shown and "100Mbit" in shown.replace("100000Kbit", "100Mbit"), shown
        assert "tbf" not in await sub.shape_link(None)
    finally:
        await sub.stop_all()
    assert leftovers(sub.project) == {"containers": [], "networks": [], "volumes": []}
    assert (tmp_path / "compose.yml").exists() and (tmp_path / ".env").exists()


def _chaos_scenario(tmp_path: Path) -> Path:
    text = TINY.read_text().replace(
        "prfaas: {hardware: h200x8, instances: 1}", "prfaas: {hardware: h200x8, instances: 2}"
    )
    path = tmp_path / "chaos.yaml"
    path.write_text(text)
    return path


async def test_chaos_kill_prefill_and_partition_loses_nothing(images: str, tmp_path: Path) -> None:
    from testbed.scenario.results import write_results

    scenario = load_scenario(_chaos_scenario(tmp_path))
    opts = RunOptions(
        substrate="compose",
        out_dir=tmp_path / "out",
        progress=False,
        duration_s=240.0,
        drain_timeout_s=90.0,
    )
    rp = prepare_run(scenario, opts)
    run = _Run(rp, opts)
    sub: Any = run.substrate
    faults: list[tuple[float, str]] = []

    async def nemesis() -> None:
        t0 = time.monotonic()

        async def at(t: float) -> None:
            await asyncio.sleep(max(0.0, t0 + t - time.monotonic()))

        victim = run.services["prfaas-prefill-0"]
        await at(2.0)
        await sub.kill(victim)
        faults.append((time.monotonic() - t0, "kill prfaas-prefill-0"))
        await at(4.0)
        await sub.partition()
        faults.append((time.monotonic() - t0, "partition (link off the prfaas network)"))
        await at(7.0)
        await sub.heal()
        faults.append((time.monotonic() - t0, "heal"))
        run.services["prfaas-prefill-0"] = await sub.restart(victim)
        faults.append((time.monotonic() - t0, "restart prfaas-prefill-0"))

    try:
        await run.start()
        task = asyncio.create_task(nemesis())
        await run.drive(lambda progress: None)
        await task
    finally:
        await run.shutdown()
    records = [run.records[i] for i in run.submitted if i in run.records]
    result = write_results(
        rp, opts, run.submitted, records, run.history, run.notes, run.interrupted
    )
    assert [f[1] for f in faults][-1] == "restart prfaas-prefill-0"
    assert len(run.submitted) > 100
    assert len(records) == len(run.submitted)
    for rec in records:
        assert rec.status == "completed" or (rec.status == "failed" and rec.failure_reason), rec
    checks = {c.name: c for c in result.checks}
    assert checks["nothing_lost"].ok, checks["nothing_lost"].detail
    # the faults bit: attempts were retried; PrfaaS served requests before and after them
    assert any(r.retries for r in records) or any(r.status == "failed" for r in records)
    k = scenario.scale.time_scale
    assert any(r.route == "prfaas" and r.status == "completed" for r in records)
    late = [r for r in records if r.arrival > 9.0 * k and r.status == "completed"]
    assert any(r.route == "prfaas" for r in late), "PrfaaS never came back after heal"
    summary = json.loads((opts.out_dir / "summary.json").read_text())
    assert summary["substrate"] == "compose"
    from testbed.substrate.compose import leftovers

    assert leftovers(sub.project) == {"containers": [], "networks": [], "volumes": []}


async def test_make_down_removes_everything(images: str, tmp_path: Path) -> None:
    from testbed.substrate.compose import ComposeSubstrate, leftovers

    sub = ComposeSubstrate(tmp_path / "logs")
    await sub.start_service(_spec("decode", "local-decode-0", "local"))
    left = leftovers(sub.project)
    assert left["containers"] and left["networks"]
    # what `make down` runs; the substrate is abandoned as a crashed runner would leave it
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "testbed.substrate.compose",
        "down",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, out.decode()
    assert leftovers() == {"containers": [], "networks": [], "volumes": []}
    await sub.stop_all()  # idempotent on what is already gone
