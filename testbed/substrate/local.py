"""The local substrate: every service is its own OS process on loopback.

A service binds port 0 and announces its ports on one stdout line ("READY {...}"), so many runs
(and tests) can share the machine without port races. Each service's stderr goes to a log file
in the run's output directory, so a crash leaves evidence. The link between the datacenters is
a link emulator in its own process (testbed.substrate.link_process), shaped by
testbed.link.deployment; a partition disables its proxies.

With `link.shaper: tc` the bandwidth is the kernel's instead (testbed.link.netns_link): the
run's two network namespaces and their veth carry every cross-datacenter KV byte (the PrfaaS
senders connect from one side, the emulator's proxies listen on the other), an htb class caps
it, and a partition also drops every packet on the veth. The namespaces are deleted when the
run stops (also after SIGINT/SIGTERM/SIGHUP or an exception; at exit after a crash), and a
killed run's are removed by the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from testbed.config import LinkConfig, ScaleConfig
from testbed.errors import UserError
from testbed.lifeline import child_env
from testbed.link.client import LinkClient
from testbed.link.deployment import LinkSetup, add_link_proxies
from testbed.link.netns_link import NetnsLink
from testbed.link.tc import WIRE_PER_PAYLOAD
from testbed.services.spec import ServiceSpec
from testbed.substrate.base import ServiceHandle
from testbed.substrate.link_process import spawn_emulator, stop_emulator
from testbed.substrate.zygote import ForkedProcess, Zygote

__all__ = ["LocalService", "LocalSubstrate", "start_service", "stop_services"]


Process = asyncio.subprocess.Process | ForkedProcess
"""A service's process: spawned (`python -m testbed.services.host`) or forked by the run's
zygote (testbed.substrate.zygote)."""


@dataclass
class LocalService:
    spec: ServiceSpec
    proc: Process
    ports: dict[str, int] = field(default_factory=dict)
    log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://{self.spec.host}:{self.ports['http']}"

    @property
    def pid(self) -> int:
        return self.proc.pid


async def _spawn(
    args: list[str], log_path: Path | None, *, stdin: int | None = None
) -> asyncio.subprocess.Process:
    """One `python -m testbed.services.host ARGS`, its stderr appended to `log_path`."""
    stderr: int | object = asyncio.subprocess.DEVNULL
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        stderr = log_path.open("ab")  # append: a restarted service keeps its first life's log
    env = child_env({**os.environ, "PYTHONUNBUFFERED": "1"})  # dies with us: testbed.lifeline
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "testbed.services.host",
        *args,
        stdin=stdin,
        stdout=asyncio.subprocess.PIPE,
        stderr=stderr,  # type: ignore[arg-type]
        env=env,
        start_new_session=True,  # a Ctrl-C at the terminal reaches the runner, not the services
    )
    if hasattr(stderr, "close"):
        stderr.close()
    return proc


def ended(code: int | None) -> str | None:
    """A process's return code as a reason ("killed by SIGKILL", "exit code 1"); None: runs."""
    if code is None:
        return None
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


async def start_service(
    spec: ServiceSpec,
    log_dir: Path | None,
    ready_timeout: float = 30.0,
    zygote: Zygote | None = None,
) -> LocalService:
    """Start one service, forked by `zygote` or else spawned as its own interpreter, and wait
    for its READY line."""
    log_path = log_dir / f"{spec.id}.log" if log_dir is not None else None
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
    proc: Process
    if zygote is not None:
        proc = await zygote.spawn(spec.model_dump_json(), log_path)
    else:
        proc = await _spawn([spec.model_dump_json()], log_path)
    svc = LocalService(spec, proc, log_path=log_path)
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(ready_timeout):
            while True:
                line = await proc.stdout.readline()
                if not line:
                    raise UserError(
                        f"service {spec.id} exited during start-up"
                        + (f"; see {log_path}" if log_path else "")
                    )
                if line.startswith(b"READY "):
                    svc.ports = json.loads(line[6:])
                    break
    except TimeoutError:
        await stop_services([svc])
        raise UserError(f"service {spec.id} did not start within {ready_timeout:.0f}s") from None
    return svc


async def stop_services(services: list[LocalService], grace: float = 5.0) -> None:
    """SIGTERM everything, then SIGKILL what is still alive after `grace` seconds."""
    await _stop_processes([svc.proc for svc in services], grace)


async def _stop_processes(procs: list[Process], grace: float = 5.0) -> None:
    """SIGTERM each, then SIGKILL what is still alive `grace` seconds later: one grace for
    all of them, not one after another."""
    for proc in procs:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    waits = [asyncio.ensure_future(proc.wait()) for proc in procs]
    if waits:
        await asyncio.wait(waits, timeout=grace)
    for proc in procs:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
    await asyncio.gather(*waits)


class LocalSubstrate:
    """Services as child processes of the runner; faults are signals."""

    name = "local"

    def __init__(self, log_dir: Path | None) -> None:
        self.log_dir = log_dir
        self.services: dict[str, LocalService] = {}
        self.link: LinkSetup | None = None
        self.link_proc: asyncio.subprocess.Process | None = None
        """The link emulator this substrate started (none with `link.toxiproxy` or one DC)."""
        self.netns: NetnsLink | None = None
        """The run's namespaces and veth with `link.shaper: tc`."""
        self.zygote: Zygote | None = None
        """The run's service zygote (testbed.services.zygote), started by `warm` or by the
        first service."""
        self._emulator: asyncio.Task[tuple[asyncio.subprocess.Process, str]] | None = None
        """The link emulator started early by `warm`, taken by `start_link`."""

    async def warm(self, roles: list[str], link: LinkConfig | None, seed: int) -> None:
        """Start the run's service zygote, which imports every role's app once while the run
        plans (each service is then a fork: testbed.services.zygote), and the link emulator if
        the run has one this substrate starts."""
        if self.zygote is None:
            self.zygote = Zygote(self._zygote_log())
        if link is not None and link.shaper == "emulator" and link.toxiproxy is None:
            self._emulator = asyncio.create_task(spawn_emulator(seed, self.log_dir))

    def _zygote_log(self) -> Path | None:
        return self.log_dir / "zygote.log" if self.log_dir is not None else None

    async def _drop_warm(self) -> None:
        """The zygote (once every service it forked has ended) and an emulator not taken."""
        if self.zygote is not None:
            zygote, self.zygote = self.zygote, None
            await zygote.aclose()
        if self._emulator is not None:
            task, self._emulator = self._emulator, None
            with contextlib.suppress(Exception):
                proc, _url = await task
                await stop_emulator(proc)

    def _handle(self, svc: LocalService) -> ServiceHandle:
        kv = (svc.spec.host, svc.ports["kv"]) if "kv" in svc.ports else None
        return ServiceHandle(svc.spec, svc.url, kv, svc)

    async def start_service(self, spec: ServiceSpec) -> ServiceHandle:
        if self.zygote is None:
            self.zygote = Zygote(self._zygote_log())
        svc = await start_service(spec, self.log_dir, zygote=self.zygote)
        self.services[spec.id] = svc
        return self._handle(svc)

    async def start_link(
        self,
        link: LinkConfig,
        scale: ScaleConfig,
        upstreams: dict[str, tuple[str, int]],
        *,
        enabled: bool,
        seed: int,
    ) -> LinkSetup:
        """Put the shaped link (testbed.link.deployment) in front of each decode instance's KV
        port: on the emulator at `link.toxiproxy`, or on one this substrate starts; with
        `link.shaper: tc` behind the run's kernel-shaped veth."""
        setup = LinkSetup(dict(upstreams), scale, link.bandwidth)
        self.link = setup
        if not enabled:
            return setup
        listen = "127.0.0.1:0"
        try:
            if link.shaper == "tc":
                if link.toxiproxy is not None:
                    raise UserError(
                        "link.shaper tc needs the emulator this substrate starts (in the run's "
                        "namespaces); drop link.toxiproxy or use shaper: emulator"
                    )
                self.netns = await asyncio.to_thread(
                    NetnsLink.create, setup.to_wire(link.bandwidth)
                )
                setup.kernel = self.netns
                setup.sender_netns = self.netns.sender_netns
                listen = f"{self.netns.listen_host}:0"
            if link.toxiproxy is not None:
                url = f"http://{link.toxiproxy}"
            elif self._emulator is not None and self.netns is None:
                task, self._emulator = self._emulator, None
                self.link_proc, url = await task
            else:
                self.link_proc, url = await spawn_emulator(
                    seed, self.log_dir, listen_netns=self.netns.listen_netns if self.netns else None
                )
            setup.client = LinkClient(url)
            await add_link_proxies(setup, link, upstreams, lambda _decode_id: listen)
        except BaseException:
            await self._close_link()
            raise
        return setup

    async def _close_link(self) -> None:
        if self.link is not None:
            await self.link.aclose()
            self.link = None
        if self.link_proc is not None:
            await stop_emulator(self.link_proc)
            self.link_proc = None
        if self.netns is not None:
            await asyncio.to_thread(self.netns.close)
            self.netns = None

    def _emulated_link(self) -> LinkSetup:
        if self.link is None or not self.link.enabled:
            raise UserError("this run has no link between datacenters to partition or heal")
        return self.link

    async def partition(self) -> None:
        """Cut the datacenters apart: every proxy of the link is disabled, so connections
        through it are closed at once and new ones refused (compose's `mode="proxies"`)."""
        await self._emulated_link().partition()

    async def heal(self) -> None:
        """Undo `partition`; idempotent."""
        await self._emulated_link().heal()

    async def shape_link(self, rate_bytes_per_s: float | None, *, qdisc: str = "tbf") -> str:
        """Set the kernel cap of the run's veth to `rate_bytes_per_s` wire bytes/s (emulated;
        the run's htb class, whatever `qdisc` says); `None` is refused: the run's link is shaped
        by tc from start to end. Needs `link.shaper: tc`."""
        if self.netns is None:
            raise UserError(
                "kernel (tc) link shaping on the local substrate needs `link.shaper: tc` "
                "(or `testbed run --shaper tc`): this run's link is shaped by the emulator"
            )
        if rate_bytes_per_s is None:
            raise UserError("the local substrate's tc link cannot be unshaped during a run")
        await self.netns.set_rate(rate_bytes_per_s / WIRE_PER_PAYLOAD)
        return await asyncio.to_thread(self.netns.pair.show)

    def _proc(self, handle: ServiceHandle) -> LocalService:
        return self.services[handle.spec.id]

    async def kill(self, handle: ServiceHandle) -> None:
        svc = self._proc(handle)
        with contextlib.suppress(ProcessLookupError):
            svc.proc.kill()
        await svc.proc.wait()

    async def exited(self, handle: ServiceHandle) -> str | None:
        """How the service's process ended ("killed by SIGKILL", "exit code 1"), or None while
        it runs (a standing deployment watches its services: scenario.standing)."""
        return ended(self._proc(handle).proc.returncode)

    async def pause(self, handle: ServiceHandle) -> None:
        with contextlib.suppress(ProcessLookupError):
            self._proc(handle).proc.send_signal(signal.SIGSTOP)

    async def resume(self, handle: ServiceHandle) -> None:
        with contextlib.suppress(ProcessLookupError):
            self._proc(handle).proc.send_signal(signal.SIGCONT)

    async def restart(self, handle: ServiceHandle) -> ServiceHandle:
        """Same id and the same ports, so routes through the link and the router stay valid."""
        old = self._proc(handle)
        if old.proc.returncode is None:
            await self.kill(handle)
        spec = old.spec.model_copy(
            update={"port": old.ports["http"], "kv_port": old.ports.get("kv", 0)}
        )
        return await self.start_service(spec)

    async def stop_all(self) -> None:
        for svc in self.services.values():  # a paused process cannot act on SIGTERM
            if svc.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    svc.proc.send_signal(signal.SIGCONT)
        await stop_services(list(self.services.values()))
        await self._drop_warm()
        await self._close_link()
