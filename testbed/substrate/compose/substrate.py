"""ComposeSubstrate: each instance a container in its datacenter's network; faults through the
Docker API (kill, pause, restart, network disconnect) and the link container (partition, tc).

The standing topology (networks, link container) is testbed.substrate.compose.topology's and
comes up on the first service or link; the instances' containers are started here through the
Docker API into the same networks, and added to the rendered compose file.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.config import LinkConfig, ScaleConfig
from testbed.errors import UserError
from testbed.link.client import LinkClient
from testbed.link.deployment import LinkSetup, add_link_proxies
from testbed.services.spec import InstanceInfo, ServiceSpec
from testbed.substrate.base import ServiceHandle
from testbed.substrate.compose.images import IMAGE, LABEL, Log, docker_client, ensure_images
from testbed.substrate.compose.images import log_stderr as _log
from testbed.substrate.compose.kernel import ComposeKernel
from testbed.substrate.compose.prometheus import (
    PrometheusServer,
    ensure_prometheus_image,
    prometheus_wanted,
)
from testbed.substrate.compose.service_doc import service_doc
from testbed.substrate.compose.topology import (
    CTL_PROXY_PORT0,
    FIRST_HOST,
    HTTP_PORT,
    KV_PORT,
    KV_PROXY_PORT0,
    OWNER_LABEL,
    READY_TIMEOUT_S,
    RUN_LABEL,
    SERVICE_LABEL,
    Topology,
    cgroup_parent,
    compose_command,
    ctl_ip,
    host_ip,
    host_port,
    owner_tag,
    reap_orphans,
)

__all__ = ["ComposeSubstrate"]


@dataclass
class _Instance:
    spec: ServiceSpec
    """The spec the container runs (container addresses and fixed ports)."""
    container: Any
    ip: str
    host_port: int = 0
    ctl_ip: str = ""
    ready_lines: int = 0


class ComposeSubstrate:
    """Services as containers in per-datacenter networks joined only by the link container."""

    name = "compose"

    def __init__(
        self,
        log_dir: Path | None,
        *,
        image: str = IMAGE,
        log: Log = _log,
        prometheus: bool | None = None,
    ) -> None:
        self.log_dir = log_dir
        out_dir = log_dir.parent if log_dir is not None else Path(tempfile.mkdtemp())
        self.out_dir = out_dir.resolve()
        self.log = log
        self.topology = Topology(self.out_dir, log_dir, image=image, log=log)
        self.image = image
        self.instances: dict[str, _Instance] = {}
        self.link: LinkSetup | None = None
        self._next_host = {"prfaas": FIRST_HOST, "local": FIRST_HOST}
        self._kv_proxies: dict[str, int] = {}
        self._ctl_proxies: dict[str, int] = {}
        self._lock = asyncio.Lock()
        self._up = False
        self._stopped = False
        want = prometheus_wanted() if prometheus is None else prometheus
        self.prometheus: PrometheusServer | None = (
            PrometheusServer(self.out_dir / "prometheus", log=log) if want else None
        )
        """A Prometheus server scraping every service (prometheus.py), when asked for."""

    def enable_prometheus(self) -> None:
        """Add the Prometheus server (before the first service starts)."""
        if self._up:
            raise RuntimeError("enable_prometheus must come before the first service")
        if self.prometheus is None:
            self.prometheus = PrometheusServer(self.out_dir / "prometheus", log=self.log)

    @property
    def prometheus_url(self) -> str | None:
        """Prometheus's web and API address (on 127.0.0.1), once it is up."""
        return self.prometheus.url if self.prometheus is not None else None

    @property
    def project(self) -> str:
        """The run's compose project: every Docker object of the run is labelled with it."""
        return self.topology.project

    @property
    def networks(self) -> dict[str, str]:
        """Datacenter name (and 'ctl') -> Docker network name."""
        return self.topology.networks

    @property
    def link_container(self) -> Any:
        return self.topology.link_container

    @property
    def client(self) -> Any:
        return self.topology.client

    def _link_api(self) -> LinkClient:
        assert self.topology.link_api is not None
        return self.topology.link_api

    async def _ensure_up(self) -> None:
        async with self._lock:
            if self._up:
                return
            if self._stopped:
                raise UserError("the compose substrate was stopped")
            self.topology.client = await asyncio.to_thread(docker_client)
            self.topology.compose = await asyncio.to_thread(compose_command)
            await asyncio.to_thread(reap_orphans, log=self.log)
            await asyncio.to_thread(ensure_images, log=self.log)
            if self.prometheus is not None:
                await asyncio.to_thread(ensure_prometheus_image, log=self.log)
            self.topology.note("images current")
            self._up = True  # from here on stop_all has something to clean up
            await self.topology.up()
            if self.prometheus is not None:
                await self._start_prometheus(self.prometheus)

    async def _start_prometheus(self, server: PrometheusServer) -> None:
        labels = {LABEL: "1", RUN_LABEL: self.project, OWNER_LABEL: owner_tag()}
        labels[SERVICE_LABEL] = "prometheus"
        await asyncio.to_thread(server.start, self.client, labels, cgroup_parent())
        await server.wait_ready()
        self.topology.note(f"prometheus at {server.url}")
        self.log(f"Prometheus at {server.url} (scraping every service's /metrics)")

    def _scraped(self, inst: _Instance) -> None:
        if self.prometheus is not None:
            spec = inst.spec
            self.prometheus.set_target(spec.id, spec.role, spec.cluster, inst.host_port)

    # ------------------------------------------------------------------ services

    def _container_name(self, sid: str) -> str:
        return f"{self.project}-{sid}"

    def _alloc_ip(self, cluster: str) -> str:
        n = self._next_host[cluster]
        if n > 250:
            raise UserError(f"more than {250 - FIRST_HOST} instances in datacenter {cluster}")
        self._next_host[cluster] = n + 1
        return host_ip(self.topology.subnets[cluster], n)

    async def _router_spec(self, spec: ServiceSpec) -> list[InstanceInfo]:
        """The router's instance table with container addresses; PrfaaS via the link."""
        link_api = self._link_api()
        link_ips = self.topology.link_ips
        by_id = {i.spec.id: i for i in self.instances.values()}
        rewritten = []
        for info in spec.instances:
            inst = by_id.get(info.id)
            if inst is None:
                raise UserError(f"router instance {info.id} was not started by this substrate")
            if info.cluster == spec.cluster:
                url = f"http://{inst.ip}:{HTTP_PORT}"
            else:  # the other datacenter: through a control proxy in the link container
                port = self._ctl_proxies.get(info.id)
                if port is None:
                    port = CTL_PROXY_PORT0 + len(self._ctl_proxies)
                    await link_api.create_proxy(
                        f"ctl-{info.id}",
                        upstream=f"{inst.ip}:{HTTP_PORT}",
                        listen=f"{link_ips[spec.cluster]}:{port}",
                    )
                    self._ctl_proxies[info.id] = port
                url = f"http://{link_ips[spec.cluster]}:{port}"
            rewritten.append(info.model_copy(update={"url": url}))
        return rewritten

    def _create(self, spec: ServiceSpec, ip: str) -> Any:
        errors = importlib.import_module("docker.errors")
        name = self._container_name(spec.id)
        with contextlib.suppress(errors.NotFound):  # a leftover of a crashed run
            self.client.containers.get(name).remove(force=True)
        net = self.networks[spec.cluster]
        container = self.client.containers.create(
            self.image,
            ["python", "-m", "testbed.services.host", spec.model_dump_json()],
            name=name,
            labels={
                LABEL: "1",
                RUN_LABEL: self.project,
                OWNER_LABEL: owner_tag(),
                SERVICE_LABEL: spec.id,
            },
            init=True,
            detach=True,
            environment={"PYTHONUNBUFFERED": "1"},
            ports={f"{HTTP_PORT}/tcp": ("127.0.0.1", None)},
            network=net,
            networking_config={net: self.client.api.create_endpoint_config(ipv4_address=ip)},
            cgroup_parent=cgroup_parent(),
            # No Docker healthcheck here (the rendered file has one): each check is a runc exec,
            # which costs CPU the emulation needs; READY on stdout and the router's /health
            # watch cover readiness and liveness.
        )
        self.client.networks.get(self.networks["ctl"]).connect(container)
        container.start()
        return container

    async def _wait_ready(self, inst: _Instance) -> None:
        """Wait for one more READY line than before; then read the published HTTP port."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:  # bounded by READY_TIMEOUT_S
            logs = await asyncio.to_thread(inst.container.logs, stdout=True, stderr=False)
            n = logs.count(b"READY ")
            if n > inst.ready_lines:
                inst.ready_lines = n
                break
            await asyncio.to_thread(inst.container.reload)
            if inst.container.status in ("exited", "dead") or time.monotonic() > deadline:
                err = await asyncio.to_thread(inst.container.logs, stdout=False, tail=20)
                raise UserError(
                    f"service {inst.spec.id} did not start in its container "
                    f"({inst.container.status}):\n{err.decode(errors='replace')}"
                )
            await asyncio.sleep(0.2)
        await asyncio.to_thread(inst.container.reload)
        inst.host_port = host_port(inst.container, HTTP_PORT)
        inst.ctl_ip = ctl_ip(inst.container, self.networks["ctl"])

    def _handle(self, inst: _Instance) -> ServiceHandle:
        kv = (inst.ip, KV_PORT) if inst.spec.role in ("decode", "pd") else None
        if self.topology.direct:
            url = f"http://{inst.ctl_ip}:{HTTP_PORT}"
        else:
            url = f"http://127.0.0.1:{inst.host_port}"
        return ServiceHandle(
            inst.spec,
            url,
            kv,
            inst.container.name,
            {"ip": inst.ip, "container": inst.container.name},
        )

    async def warm(self, roles: list[str], link: LinkConfig | None, seed: int) -> None:
        """Nothing to start ahead: a container starts when its spec is known."""

    async def start_service(self, spec: ServiceSpec) -> ServiceHandle:
        await self._ensure_up()
        async with self._lock:  # addresses and the rendered file are shared
            ip = self._alloc_ip(spec.cluster)
            update: dict[str, Any] = {"host": "0.0.0.0", "port": HTTP_PORT, "kv_port": KV_PORT}
            if spec.role == "router":
                update["instances"] = await self._router_spec(spec)
            inner = spec.model_copy(update=update)
        t = time.monotonic()
        container = await asyncio.to_thread(self._create, inner, ip)
        created = time.monotonic() - t
        inst = _Instance(inner, container, ip)
        self.instances[spec.id] = inst
        async with self._lock:
            self.topology.services[spec.id] = service_doc(inner, ip)
            self.topology.render()
        await self._wait_ready(inst)
        self._scraped(inst)
        self.topology.note(
            f"{spec.id} at {ip}: created in {created:.1f}s, ready after {time.monotonic() - t:.1f}s"
        )
        return self._handle(inst)

    async def start_link(
        self,
        link: LinkConfig,
        scale: ScaleConfig,
        upstreams: dict[str, tuple[str, int]],
        *,
        enabled: bool,
        seed: int,
    ) -> LinkSetup:
        """KV proxies in the link container, shaped as one link (see testbed.link.deployment)."""
        await self._ensure_up()
        link_api = self._link_api()
        if link.toxiproxy is not None:
            raise UserError(
                "link.toxiproxy is not supported on the compose substrate: "
                "the link container is the emulator"
            )
        setup = LinkSetup(dict(upstreams), scale, link.bandwidth)
        self.link = setup
        if not enabled:
            return setup
        await link_api.reset(seed=seed)
        self.topology.set_seed(seed)
        setup.client = LinkClient(link_api.url)
        if link.shaper == "tc":  # the kernel caps the link for the whole run (kernel.py)
            kernel = ComposeKernel(self.topology)
            await kernel.set_rate(setup.to_wire(link.bandwidth))
            setup.kernel = kernel
        listen_ip = self.topology.link_ips["prfaas"]

        def listen_for(decode_id: str) -> str:
            self._kv_proxies[decode_id] = KV_PROXY_PORT0 + len(self._kv_proxies)
            return f"{listen_ip}:{self._kv_proxies[decode_id]}"

        await add_link_proxies(setup, link, upstreams, listen_for)
        return setup

    # ------------------------------------------------------------------ faults

    def _inst(self, handle: ServiceHandle) -> _Instance:
        return self.instances[handle.spec.id]

    async def kill(self, handle: ServiceHandle) -> None:
        c = self._inst(handle).container

        def kill() -> None:
            c.reload()
            if c.status == "paused":
                c.unpause()
            if c.status in ("running", "paused", "restarting"):
                with contextlib.suppress(Exception):
                    c.kill()
            c.wait(timeout=30)

        await asyncio.to_thread(kill)

    async def exited(self, handle: ServiceHandle) -> str | None:
        """How the service's container stopped ("exit code 137", "killed by the OOM killer"),
        or None while it runs or is paused (a standing deployment watches its services)."""
        c = self._inst(handle).container
        try:
            await asyncio.to_thread(c.reload)
        except Exception as exc:  # removed from outside: as dead as a killed one
            return f"container gone ({type(exc).__name__})"
        state = c.attrs.get("State", {})
        if state.get("Status") not in ("exited", "dead"):
            return None
        if state.get("OOMKilled"):
            return "killed by the OOM killer"
        return f"exit code {state.get('ExitCode')}"

    async def pause(self, handle: ServiceHandle) -> None:
        await asyncio.to_thread(self._inst(handle).container.pause)

    async def resume(self, handle: ServiceHandle) -> None:
        await asyncio.to_thread(self._inst(handle).container.unpause)

    async def restart(self, handle: ServiceHandle) -> ServiceHandle:
        """The same container: same id, addresses and ports inside the networks."""
        inst = self._inst(handle)
        await self.kill(handle)
        await asyncio.to_thread(inst.container.start)
        await self._wait_ready(inst)
        self._scraped(inst)  # its published port may have changed
        return self._handle(inst)

    async def disconnect(self, handle: ServiceHandle, network: str | None = None) -> None:
        """Take an instance off its datacenter network (or `network`: 'prfaas', 'local', 'ctl')."""
        inst = self._inst(handle)
        net = self.networks[network or inst.spec.cluster]
        await asyncio.to_thread(
            self.client.networks.get(net).disconnect, inst.container, force=True
        )

    async def connect(self, handle: ServiceHandle, network: str | None = None) -> None:
        inst = self._inst(handle)
        dc = network or inst.spec.cluster
        ip = inst.ip if dc == inst.spec.cluster else None
        await asyncio.to_thread(
            self.client.networks.get(self.networks[dc]).connect, inst.container, ipv4_address=ip
        )

    async def partition(self, *, mode: str = "disconnect") -> None:
        """Cut the datacenters apart: `disconnect` takes the link container off the prfaas
        network (packets are dropped, connections stall); `proxies` disables every proxy of
        the link (connections are closed at once)."""
        if mode == "disconnect":
            await self.topology.detach_link()
        elif mode == "proxies":
            link_api = self._link_api()
            for name in await link_api.proxies():
                await link_api.disable(name)
        else:
            raise ValueError(f"unknown partition mode {mode!r}")

    async def heal(self) -> None:
        """Undo `partition` (either mode); idempotent."""
        await self.topology.attach_link()
        link_api = self._link_api()
        for name, proxy in (await link_api.proxies()).items():
            if not proxy.get("enabled", True):
                await link_api.enable(name)

    async def shape_link(self, rate_bytes_per_s: float | None, *, qdisc: str = "tbf") -> str:
        """Kernel shaping inside the link container (NET_ADMIN): caps what leaves it toward the
        local datacenter with tbf or htb; `None` removes it. Returns `tc qdisc show`."""
        return await self.topology.tc(rate_bytes_per_s, qdisc)

    # ------------------------------------------------------------------ teardown

    async def _save_logs(self) -> None:
        if self.log_dir is None:
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)

        def save() -> None:
            for sid, inst in self.instances.items():
                with contextlib.suppress(Exception):
                    err = inst.container.logs(stdout=False, stderr=True)
                    (self.log_dir / f"{sid}.log").write_bytes(err)  # type: ignore[operator]
            if self.link_container is not None:
                with contextlib.suppress(Exception):
                    (self.log_dir / "link.log").write_bytes(  # type: ignore[operator]
                        self.link_container.logs(stdout=True, stderr=True)
                    )
            if self.prometheus is not None:
                self.prometheus.save_log(self.log_dir / "prometheus.log")  # type: ignore[operator]

        await asyncio.to_thread(save)

    async def stop_all(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        async with self._lock:
            if not self._up:
                return
        self.topology.note("stopping")
        await self._save_logs()
        link_api = self.topology.link_api
        if link_api is not None:  # the link's proxies and toxics as they ended
            with contextlib.suppress(Exception):
                state = await link_api.proxies()
                (self.out_dir / "link.json").write_text(json.dumps(state, indent=1) + "\n")
        for client in (self.link.client if self.link else None, link_api):
            if client is not None:
                await client.close()

        def remove(c: Any) -> None:
            with contextlib.suppress(Exception):
                c.remove(force=True, v=True)

        await asyncio.gather(
            *(asyncio.to_thread(remove, i.container) for i in self.instances.values())
        )
        if self.prometheus is not None:
            await asyncio.to_thread(self.prometheus.remove)
        await self.topology.teardown()
        self.topology.note("stopped")
