"""The outside scheduler a scenario owns (`policy: {kind: http, command: [...], url: ...}`).

Started before the deployment (its stdout/stderr in the results directory, `scheduler.*`) and
stopped after the run. The router does not talk to it directly: a proxy of our own link
emulator (testbed.link) sits between them, so `scheduler-slow` can add latency the way a slow
network or a slow service would, and `scheduler-kill` / `scheduler-pause` act on the process.
The router's policy URL is rewritten to the proxy's address; the records and the report keep
the URL the scenario wrote.

The scheduler nemesis actions reach this through the run's `scheduler` attribute
(testbed/nemesis/actions/scheduler_control.py says what they may call).
"""

from __future__ import annotations

import asyncio
import urllib.parse
from pathlib import Path
from typing import Any

from testbed.errors import UserError
from testbed.link.emulator import LinkEmulator
from testbed.policy.http import HttpSpec, SchedulerProcess, is_http_spec
from testbed.scenario.plan import RunPlan

__all__ = ["OwnedScheduler", "needs_owned_scheduler", "start_owned_scheduler"]

PROXY = "scheduler"
SLOW_TOXIC = "scheduler-slow"


def needs_owned_scheduler(policy_spec: str, command: list[str] | None, actions: list[str]) -> bool:
    """Whether the run starts the scheduler; UserError for scheduler faults without one."""
    faults = sorted({a for a in actions if a.startswith("scheduler-")})
    if command is None:
        if faults:
            raise UserError(
                f"nemesis {', '.join(faults)} needs a scheduler the scenario owns: "
                "policy: {kind: http, url: ..., command: [...]}"
            )
        return False
    if not is_http_spec(policy_spec):
        raise UserError(f"policy.command: the run's policy {policy_spec!r} is not the http one")
    return True


class OwnedScheduler:
    """The process plus the proxy in front of it (see the module docstring)."""

    def __init__(self, policy_spec: str, command: list[str], out_dir: Path) -> None:
        self.spec = HttpSpec.parse(policy_spec)
        self.process = SchedulerProcess(command, self.spec.url, out_dir)
        self.emulator: LinkEmulator | None = None
        self.router_spec = policy_spec
        """The policy name the router gets: the URL through the proxy, same path and settings."""

    async def start(self) -> str:
        await asyncio.to_thread(self.process.start)
        parts = urllib.parse.urlsplit(self.spec.url)
        upstream = f"{parts.hostname}:{parts.port or 80}"
        self.emulator = LinkEmulator()
        made = await self.emulator.create_proxy(
            {"name": PROXY, "listen": "127.0.0.1:0", "upstream": upstream}
        )
        listen = made["listen"]
        proxied = urllib.parse.urlunsplit((parts.scheme, listen, parts.path, parts.query, ""))
        self.router_spec = HttpSpec(
            proxied, self.spec.timeout_s, self.spec.fallback, self.spec.validate
        ).to_spec()
        return self.router_spec

    # ------------------------------------------------------------------ what faults do

    async def kill(self) -> dict[str, Any]:
        pid = self.process.proc.pid if self.process.proc else None
        await asyncio.to_thread(self.process.kill)
        return {"signal": "SIGKILL", "pid": pid}

    async def restart(self) -> dict[str, Any]:
        if self.process.running:
            await asyncio.to_thread(self.process.kill)
        await asyncio.to_thread(self.process.start)
        return {"restarted": True, "pid": self.process.proc.pid if self.process.proc else None}

    async def pause(self) -> dict[str, Any]:
        self.process.pause()
        return {"signal": "SIGSTOP"}

    async def resume(self) -> dict[str, Any]:
        self.process.resume()
        return {"signal": "SIGCONT"}

    async def slow(self, delay_wall_s: float) -> dict[str, Any]:
        """Every answer comes `delay_wall_s` later (a latency toxic on the proxy's answers)."""
        assert self.emulator is not None, "the scheduler has not started"
        await self.emulator.add_toxic(
            PROXY,
            {"name": SLOW_TOXIC, "type": "latency", "stream": "downstream",
             "attributes": {"latency": delay_wall_s * 1e3}},
        )  # fmt: skip
        return {"delay_ms": delay_wall_s * 1e3}

    async def unslow(self) -> dict[str, Any]:
        assert self.emulator is not None, "the scheduler has not started"
        await self.emulator.remove_toxic(PROXY, SLOW_TOXIC)
        return {"delay_ms": 0.0}

    async def stop(self) -> None:
        if self.emulator is not None:
            await self.emulator.close()
            self.emulator = None
        await asyncio.to_thread(self.process.stop)


async def start_owned_scheduler(rp: RunPlan, out_dir: Path) -> OwnedScheduler | None:
    """Start the scheduler the scenario owns, if the run's policy is the scenario's own http
    one with a `command` (first: the router asks it from its first request); None otherwise.
    UserError for scheduler faults in a run that owns no scheduler."""
    policy = rp.scenario.policy
    owned = policy.command if rp.policy == policy.name else None
    if not needs_owned_scheduler(rp.policy, owned, [f.event.action for f in rp.faults]):
        return None
    assert owned is not None
    scheduler = OwnedScheduler(rp.policy, owned, out_dir)
    await scheduler.start()
    return scheduler
