"""Start and stop an external router (the scenario's `router:`) in front of the fleet.

A preset knows how to start one router: the module it runs (`python -m MODULE`, never a bare
console script: sglang-router and smg both install an `smg` script), the PD handshake its
workers must speak (services.facade's flavour), the worker lists built from the deployment, and
the flags that keep it on loopback and make it notice a fault within a scenario. The router
binds 127.0.0.1 on a free port (sglang-router binds 0.0.0.0:30000 and its Prometheus
0.0.0.0:29000 by default; vllm-router 127.0.0.1:30000 and 127.0.0.1:29000, which two runs
would share), is ready when it has registered every worker (bounded by `ready_timeout`), and
is stopped with the run (SIGTERM, then SIGKILL), leaving no process.
Errors are one line (UserError: exit 2), with the tail of the router's log.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import aiohttp

from testbed.config.router import ExternalRouterConfig
from testbed.errors import UserError
from testbed.services.router.text import TOKENIZER_DIR
from testbed.services.spec import InstanceInfo

__all__ = [
    "PRESETS",
    "Preset",
    "RouterProcess",
    "free_port",
    "healthy_workers",
    "router_command",
    "start_router",
]

STOP_S = 5.0
"""Wall seconds the router has to exit on SIGTERM before it is killed."""


@dataclass(frozen=True)
class Preset:
    module: str
    package: str
    """The pip requirement of the `routers` extra that provides `module`."""
    flavour: Literal["sglang", "vllm"]
    """The PD handshake it speaks: the workers' router-facing API (ServiceSpec.facade)."""
    health_flags: tuple[str, ...]
    """Flags that make it notice a dead worker within a scenario (its defaults: a 60 s health
    interval, 3 failures)."""


_HEALTH = (
    *("--health-check-interval-secs", "2"),
    *("--health-failure-threshold", "2"),
    *("--health-check-timeout-secs", "2"),
)

PRESETS: dict[str, Preset] = {
    "sglang-router": Preset(
        module="sglang_router.launch_router",
        package="sglang-router==0.3.2",
        flavour="sglang",
        health_flags=_HEALTH,
    ),
    "vllm-router": Preset(
        module="vllm_router.launch_router",
        package="vllm-router==0.1.17",
        flavour="vllm",
        health_flags=_HEALTH,
    ),
}


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the router binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def router_command(
    cfg: ExternalRouterConfig,
    python: str,
    port: int,
    prometheus_port: int,
    prefills: Sequence[tuple[str, int]],
    decodes: Sequence[str],
) -> list[str]:
    """The preset's command line in PD mode. sglang-router: `--prefill URL BOOTSTRAP_PORT` per
    prefill instance (the bootstrap route is on the worker's own HTTP port), `--decode URL` per
    decode instance, the shipped tokenizer. vllm-router: `--prefill URL` (no bootstrap port:
    its decode pulls from the address the prefill answers), `--decode URL`; it needs no
    tokenizer (cache_aware renders on the workers)."""
    preset = PRESETS[cfg.preset]
    cmd = [python, "-m", preset.module, "--host", "127.0.0.1", "--port", str(port),
           "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prometheus_port)]  # fmt: skip
    vllm = preset.flavour == "vllm"
    cmd.append("--vllm-pd-disaggregation" if vllm else "--pd-disaggregation")
    for url, bootstrap in prefills:
        cmd += ["--prefill", url] if vllm else ["--prefill", url, str(bootstrap)]
    for url in decodes:
        cmd += ["--decode", url]
    cmd += ["--policy", cfg.policy]
    if not vllm:
        cmd += ["--tokenizer-path", str(TOKENIZER_DIR)]
    cmd += ["--worker-startup-timeout-secs", str(max(1, int(cfg.ready_timeout))),
            "--worker-startup-check-interval", "1", "--log-level", "warning" if vllm else "warn",
            *preset.health_flags, *cfg.flags]  # fmt: skip
    return cmd


def healthy_workers(doc: Any) -> int | None:
    """Workers a router's `/readiness` counts healthy: sglang-router's `healthy_workers`,
    vllm-router's `prefill.healthy + decode.healthy`."""
    if not isinstance(doc, dict):
        return None
    if isinstance(doc.get("healthy_workers"), int):
        return int(doc["healthy_workers"])
    roles = [doc.get(r) for r in ("prefill", "decode")]
    if all(isinstance(r, dict) and isinstance(r.get("healthy"), int) for r in roles):
        return sum(int(r["healthy"]) for r in roles if isinstance(r, dict))
    return None


def _installed(python: str | None, module: str) -> bool:
    if python is not None:
        return Path(python).exists()  # another venv's: it says so itself if the module is not
    top = module.split(".")[0]
    try:
        return importlib.util.find_spec(top) is not None
    except ImportError:
        return False


class RouterProcess:
    """One running external router."""

    def __init__(self, proc: asyncio.subprocess.Process, url: str, log: Path, name: str) -> None:
        self.proc = proc
        self.url = url
        self.log = log
        self.name = name

    def tail(self, lines: int = 5) -> str:
        try:
            text = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(t.strip() for t in text[-lines:])

    def exited(self) -> str | None:
        """Why the router is gone, if it is."""
        if self.proc.returncode is None:
            return None
        return f"{self.name} exited with code {self.proc.returncode}: {self.tail()}"

    async def wait_ready(self, workers: int, timeout_s: float) -> None:
        """Until the router has registered every worker (its /readiness counts them)."""
        deadline = time.monotonic() + timeout_s
        seen = ""
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
            while time.monotonic() < deadline:
                if (why := self.exited()) is not None:
                    raise UserError(f"router: {why}")
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                    async with session.get(f"{self.url}/readiness") as resp:
                        healthy = healthy_workers(await resp.json(content_type=None))
                        seen = f"{healthy} of {workers} workers healthy"
                        if resp.status == 200 and healthy == workers:
                            return
                await asyncio.sleep(0.2)
        await self.stop()
        raise UserError(
            f"router: {self.name} not ready in {timeout_s:g}s ({seen or 'no answer'}): "
            f"{self.tail()}"
        )

    async def stop(self) -> None:
        if self.proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.terminate()
        try:
            await asyncio.wait_for(self.proc.wait(), STOP_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()


async def start_router(
    cfg: ExternalRouterConfig,
    prefills: Sequence[InstanceInfo],
    decodes: Sequence[InstanceInfo],
    log_dir: Path,
    via: Mapping[str, str] | None = None,
) -> RouterProcess:
    """Start the configured router in front of these instances and wait until it is ready.
    `via`: instance id -> the URL the router is given instead of the instance's own (the link's
    control-path proxy of a PrfaaS prefill); a bootstrap port stays the instance's own, since
    the decode half meets the prefill directly."""
    preset = PRESETS[cfg.preset]
    if not _installed(cfg.python, preset.module):
        raise UserError(
            f"router: {cfg.preset} is not installed (pip install -e '.[routers]', which "
            f"installs {preset.package})"
        )
    python = cfg.python or sys.executable
    port = free_port()
    via = via or {}
    workers = [(via.get(p.id, p.url), int(p.url.rsplit(":", 1)[1])) for p in prefills]
    decode_urls = [via.get(d.id, d.url) for d in decodes]
    cmd = router_command(cfg, python, port, free_port(), workers, decode_urls)
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"router-{cfg.preset}.log"
    with log.open("wb") as out:
        out.write((" ".join(cmd) + "\n").encode())
        out.flush()
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out,
            start_new_session=True,
        )  # fmt: skip
    router = RouterProcess(proc, f"http://127.0.0.1:{port}", log, cfg.preset)
    try:
        await router.wait_ready(len(prefills) + len(decodes), cfg.ready_timeout)
    except BaseException:
        await router.stop()
        raise
    return router
