"""The standing topology of a compose run: networks, the link container, and their cleanup.

One run is one compose project (`prfaas-NAME-xxxxxx`): an internal network per datacenter on a
free /24 pair of 10.213.0.0/16 picked per run, the `ctl` network for the runner, and the link
container (the link emulator with NET_ADMIN for tc), the only member of both datacenter networks.
They come up with `docker compose` (or `docker-compose`) from compose/docker-compose.yml,
rendered into results/NAME/compose.yml with its .env.

Every object carries the project label and its run's name, and the owner label names the runner
(`host:pid:start`) that made it: `down` removes a run (or all of them), `leftovers` lists what
is left, `reap_orphans` removes the runs whose runner died without cleaning up.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import random
import re
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from testbed.errors import UserError
from testbed.link.client import LinkClient
from testbed.substrate.compose.images import COMPOSE_DIR, LABEL, Log, docker_client, log_stderr

__all__ = [
    "OWNER_LABEL",
    "RUN_LABEL",
    "SERVICE_LABEL",
    "Topology",
    "compose_command",
    "down",
    "leftovers",
    "owner_tag",
    "reap_orphans",
]

RUN_LABEL = "com.prfaas-testbed.run"
SERVICE_LABEL = "com.prfaas-testbed.service"
OWNER_LABEL = "com.prfaas-testbed.owner"
"""`host:pid:start` of the runner that made a run's objects: a later run (or `make down`) removes
the objects of a runner that died without cleaning up (SIGKILL, a crash), see reap_orphans."""

HTTP_PORT = 8000
KV_PORT = 9000
LINK_API_PORT = 8474
KV_PROXY_PORT0 = 10000
CTL_PROXY_PORT0 = 11000
FIRST_HOST = 10
"""Instances get .10, .11, ... of their datacenter's subnet; the link container has .2."""

READY_TIMEOUT_S = 60.0
COMPOSE_TIMEOUT_S = 180.0


def compose_command() -> list[str]:
    """`docker compose` (the v2 plugin) when present, else `docker-compose` (v1)."""
    if shutil.which("docker"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            probe = subprocess.run(
                ["docker", "compose", "version"], capture_output=True, timeout=30
            )
            if probe.returncode == 0:
                return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise UserError("neither `docker compose` nor `docker-compose` is installed")


# ---------------------------------------------------------------------------------- cleanup


def down(run: str | None = None, *, log: Log = log_stderr) -> dict[str, int]:
    """Remove the containers, networks and volumes of one run (or of every run)."""
    client = docker_client()
    filters = {"label": f"{RUN_LABEL}={run}" if run else LABEL}
    removed = {"containers": 0, "networks": 0, "volumes": 0}
    for c in client.containers.list(all=True, filters=filters):
        with contextlib.suppress(Exception):
            c.remove(force=True, v=True)
            removed["containers"] += 1
    for n in client.networks.list(filters=filters):
        with contextlib.suppress(Exception):
            n.remove()
            removed["networks"] += 1
    for v in client.volumes.list(filters=filters):
        with contextlib.suppress(Exception):
            v.remove(force=True)
            removed["volumes"] += 1
    return removed


def _process_start(pid: int) -> str | None:
    """The kernel's start time of a process (clock ticks since boot), None if it is gone.

    With the pid it names one process for good: a pid reused later has another start time.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else fields[19]


def owner_tag() -> str:
    """This process as the owner of the objects it creates (OWNER_LABEL)."""
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{_process_start(pid)}"


def _owner_alive(tag: str) -> bool:
    """Whether the runner named by an owner tag still runs (runs of other hosts count as alive)."""
    host, _, rest = tag.partition(":")
    pid, _, start = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return True
    return _process_start(int(pid)) == start


def reap_orphans(*, log: Log = log_stderr) -> list[str]:
    """Remove every run whose runner died without cleaning up; returns their names.

    Runs without an owner label (a compose file brought up by hand) are left alone.
    """
    client = docker_client()
    owners: dict[str, str] = {}
    objects = [
        *client.containers.list(all=True, filters={"label": LABEL}),
        *client.networks.list(filters={"label": LABEL}),
    ]
    for obj in objects:
        labels = obj.attrs.get("Labels") or obj.attrs.get("Config", {}).get("Labels") or {}
        run, owner = labels.get(RUN_LABEL), labels.get(OWNER_LABEL)
        if run and owner:
            owners.setdefault(run, owner)
    dead = sorted(run for run, owner in owners.items() if not _owner_alive(owner))
    for run in dead:
        removed = down(run, log=log)
        log(f"removed {run}, left by a runner that died: {removed}")
    return dead


def leftovers(run: str | None = None) -> dict[str, list[str]]:
    """Names of what is left of one run (or of any run): empty lists after `down`."""
    client = docker_client()
    filters = {"label": f"{RUN_LABEL}={run}" if run else LABEL}
    return {
        "containers": [c.name for c in client.containers.list(all=True, filters=filters)],
        "networks": [n.name for n in client.networks.list(filters=filters)],
        "volumes": [v.name for v in client.volumes.list(filters=filters)],
    }


# ---------------------------------------------------------------------------------- topology


def _used_subnets(client: Any) -> list[ipaddress.IPv4Network]:
    nets: list[ipaddress.IPv4Network] = []
    for n in client.networks.list():
        for cfg in (n.attrs.get("IPAM") or {}).get("Config") or []:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                nets.append(ipaddress.IPv4Network(cfg["Subnet"]))
    with contextlib.suppress(OSError):  # the host's own routes
        for line in Path("/proc/net/route").read_text().splitlines()[1:]:
            parts = line.split()
            dest, mask = (int(x, 16).to_bytes(4, "little") for x in (parts[1], parts[7]))
            with contextlib.suppress(ValueError):
                net = ipaddress.IPv4Network(
                    (ipaddress.IPv4Address(dest), bin(int.from_bytes(mask, "big")).count("1"))
                )
                if net.prefixlen > 0:
                    nets.append(net)
    return nets


def _pick_subnets(client: Any, rng: random.Random) -> tuple[str, str]:
    """Two free /24s in 10.213.0.0/16 (private; one per datacenter)."""
    used = _used_subnets(client)
    pairs = list(range(128))
    rng.shuffle(pairs)
    for k in pairs:
        a = ipaddress.IPv4Network(f"10.213.{2 * k}.0/24")
        b = ipaddress.IPv4Network(f"10.213.{2 * k + 1}.0/24")
        if not any(a.overlaps(u) or b.overlaps(u) for u in used):
            return str(a), str(b)
    raise UserError("no free /24 pair left in 10.213.0.0/16 for the datacenter networks")


def host_ip(subnet: str, n: int) -> str:
    return str(ipaddress.IPv4Network(subnet).network_address + n)


def cgroup_parent() -> str | None:
    """Each container's cgroup at the top level, as a process of the local substrate is.

    Under Docker's default parent (/docker) all containers together weigh as much as one host
    process in the CPU scheduler: on a busy host the whole deployment would get one process's
    share, where the local substrate's services get one share each. TESTBED_CGROUP_PARENT
    overrides it (empty: Docker's default).
    """
    return os.environ.get("TESTBED_CGROUP_PARENT", "/") or None


def ctl_ip(container: Any, network: str) -> str:
    return str(container.attrs["NetworkSettings"]["Networks"][network]["IPAddress"])


async def _reachable(host: str, port: int) -> bool:
    try:
        async with asyncio.timeout(2):
            _, writer = await asyncio.open_connection(host, port)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


def host_port(container: Any, port: int) -> int:
    bindings = container.attrs["NetworkSettings"]["Ports"].get(f"{port}/tcp") or []
    for b in bindings:
        if b.get("HostIp") in ("127.0.0.1", "0.0.0.0", ""):
            return int(b["HostPort"])
    raise UserError(f"container {container.name} publishes no port for {port}/tcp")


def _tc_script(mac: str, rate_bytes_per_s: float | None, qdisc: str) -> str:
    """Shell for the link container: shape (or unshape) the interface with `mac`, show it."""
    script = f"dev=$(ip -o link | grep -i '{mac}' | head -1 | cut -d: -f2 | cut -d@ -f1"
    script += " | tr -d ' ');"
    if rate_bytes_per_s is None:
        script += " tc qdisc del dev $dev root 2>/dev/null;"
    else:
        bits = int(rate_bytes_per_s * 8)
        burst = max(int(rate_bytes_per_s / 100), 16_000)
        if qdisc == "tbf":
            script += f" tc qdisc replace dev $dev root tbf rate {bits}bit burst {burst} "
            script += "latency 100ms &&"
        else:
            # htb cannot `replace` itself: a second call (a rate change) keeps the qdisc
            script += " { tc qdisc show dev $dev | grep -q 'htb 1: root' ||"
            script += " tc qdisc replace dev $dev root handle 1: htb default 1; } &&"
            script += f" tc class replace dev $dev parent 1: classid 1:1 htb rate {bits}bit "
            script += f"burst {burst} &&"
    script += " tc qdisc show dev $dev"
    return script


class Topology:
    """The standing part of one run: its networks, the link container and the link's API, and
    the rendered compose file. The instances' containers are the substrate's (ComposeSubstrate);
    their compose services (`services`) go into the rendered file."""

    def __init__(self, out_dir: Path, log_dir: Path | None, *, image: str, log: Log) -> None:
        self.out_dir = out_dir
        self.log_dir = log_dir
        slug = re.sub(r"[^a-z0-9]+", "-", out_dir.name.lower()).strip("-")[:24]
        self.project = f"prfaas-{slug or 'run'}-{secrets.token_hex(3)}"
        self.image = image
        self.log = log
        self.compose_file = out_dir / "compose.yml"
        self.client: Any = None
        self.compose: list[str] = []
        """`docker compose` or `docker-compose` (compose_command)."""
        self.subnets: dict[str, str] = {}
        self.link_ips: dict[str, str] = {}
        self.networks: dict[str, str] = {}
        """Datacenter name (and 'ctl') -> Docker network name."""
        self.link_container: Any = None
        self.link_api: LinkClient | None = None
        self.direct = False
        """The runner reaches containers at their ctl addresses, not through published ports."""
        self.services: dict[str, dict[str, Any]] = {}
        """Instance id -> its compose service (service_doc), for the rendered file."""
        self._seed = 0
        self._template: dict[str, Any] = {}
        self._env: dict[str, str] = {}
        self._t0 = time.monotonic()

    async def up(self) -> None:
        """The networks on a free subnet pair and a healthy link container (`client` and
        `compose` set); another pick when a concurrent run took the subnets meanwhile."""
        rng = random.Random()
        for attempt in range(5):
            prfaas, local = await asyncio.to_thread(_pick_subnets, self.client, rng)
            self.subnets = {"prfaas": prfaas, "local": local}
            self.link_ips = {dc: host_ip(s, 2) for dc, s in self.subnets.items()}
            self._write_compose()
            rc, out = await self.compose_cli("up", "-d", "link")
            if rc == 0:
                break
            await self.compose_cli("down", "-v", "--remove-orphans", "--timeout", "2")
            if "overlap" not in out.lower() or attempt == 4:
                raise UserError(f"{' '.join(self.compose)} up failed:\n{out[-2000:]}")
        await self._find()
        self.note(f"topology up: prfaas {self.subnets['prfaas']}, local {self.subnets['local']}")

    def _write_compose(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        template = yaml.safe_load((COMPOSE_DIR / "docker-compose.yml").read_text())
        template.pop("x-labels", None)
        self._template = template
        self._env = {
            "COMPOSE_PROJECT_NAME": self.project,
            "TESTBED_RUN": self.project,
            "TESTBED_OWNER": owner_tag(),
            "TESTBED_IMAGE": self.image,
            "TESTBED_SEED": str(self._seed),
            "TESTBED_PRFAAS_SUBNET": self.subnets["prfaas"],
            "TESTBED_LOCAL_SUBNET": self.subnets["local"],
            "TESTBED_PRFAAS_LINK_IP": self.link_ips["prfaas"],
            "TESTBED_LOCAL_LINK_IP": self.link_ips["local"],
            "TESTBED_LINK_API_PORT": "",  # empty: Docker picks a free 127.0.0.1 port
        }
        self._write_env()
        self.render()

    def _write_env(self) -> None:
        (self.out_dir / ".env").write_text("".join(f"{k}={v}\n" for k, v in self._env.items()))

    def set_seed(self, seed: int) -> None:
        """The link's seed, in .env too: a stand-up by hand replays the same draws."""
        self._seed = seed
        self._env["TESTBED_SEED"] = str(seed)
        self._write_env()

    def render(self) -> None:
        """Write compose.yml: the template plus every instance started so far."""
        doc = json.loads(json.dumps(self._template))
        for sid, service in self.services.items():
            doc["services"][sid] = service
        header = (
            f"# Rendered by the compose substrate for run {self.project} from\n"
            "# compose/docker-compose.yml (values in .env beside this file). The run starts the\n"
            "# instances itself; to stand the deployment up again by hand after the run:\n"
            f"#   {' '.join(self.compose or ['docker-compose'])} -f compose.yml "
            "--profile deployment up -d\n"
        )
        self.compose_file.write_text(header + yaml.safe_dump(doc, sort_keys=False, width=1000))

    def note(self, text: str) -> None:
        """A timestamped line in logs/compose.log (start-up and fault timings)."""
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            with (self.log_dir / "compose.log").open("a") as f:
                f.write(
                    f"[{time.strftime('%H:%M:%S')} +{time.monotonic() - self._t0:.2f}s] {text}\n"
                )

    async def compose_cli(self, *args: str) -> tuple[int, str]:
        """Run the compose command on the rendered file; (exit code, output), 124 on timeout."""
        cmd = [*self.compose, "-f", str(self.compose_file), "-p", self.project, *args]
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, **self._env},
            cwd=self.out_dir,
        )
        try:
            async with asyncio.timeout(COMPOSE_TIMEOUT_S):
                out, _ = await proc.communicate()
        except TimeoutError:
            proc.kill()
            out, _ = await proc.communicate()
            return 124, out.decode(errors="replace") + "\n(timed out)"
        text = out.decode(errors="replace")
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            self.note(f"$ {' '.join(cmd)}\n{text}")
        return proc.returncode or 0, text

    async def _find(self) -> None:
        def find() -> None:
            for name in ("prfaas", "local", "ctl"):
                nets = self.client.networks.list(
                    filters={
                        "label": [
                            f"{RUN_LABEL}={self.project}",
                            f"com.docker.compose.network={name}",
                        ]
                    }
                )
                if len(nets) != 1:
                    raise UserError(f"compose network {name} of {self.project} not found")
                self.networks[name] = nets[0].name
            found = self.client.containers.list(
                all=True,
                filters={"label": [f"{RUN_LABEL}={self.project}", f"{SERVICE_LABEL}=link"]},
            )
            if len(found) != 1:
                raise UserError(f"the link container of {self.project} was not created")
            self.link_container = found[0]

        await asyncio.to_thread(find)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:  # bounded by READY_TIMEOUT_S
            await asyncio.to_thread(self.link_container.reload)
            state = self.link_container.attrs["State"]
            if state.get("Health", {}).get("Status") == "healthy":
                break
            if state.get("Status") in ("exited", "dead") or time.monotonic() > deadline:
                logs = await asyncio.to_thread(self.link_container.logs, tail=30)
                raise UserError(f"the link container did not become healthy:\n{logs.decode()}")
            await asyncio.sleep(0.3)
        port = host_port(self.link_container, LINK_API_PORT)
        self.link_api = LinkClient(f"http://127.0.0.1:{port}")
        # Where the host routes to the ctl bridge (Linux), talk to containers there: the same
        # ctl network, minus the userland docker-proxy hop (and its CPU) of a published port.
        # TESTBED_COMPOSE_PUBLISHED=1 keeps to the published 127.0.0.1 ports.
        ctl = ctl_ip(self.link_container, self.networks["ctl"])
        if os.environ.get("TESTBED_COMPOSE_PUBLISHED") != "1" and await _reachable(
            ctl, LINK_API_PORT
        ):
            self.direct = True
            self.link_api = LinkClient(f"http://{ctl}:{LINK_API_PORT}")

    async def detach_link(self) -> None:
        """Take the link container off the prfaas network: packets are dropped, connections
        across the link stall."""
        net = self.client.networks.get(self.networks["prfaas"])
        await asyncio.to_thread(net.disconnect, self.link_container, force=True)

    async def attach_link(self) -> None:
        """Undo `detach_link` (same address); idempotent."""
        await asyncio.to_thread(self.link_container.reload)
        attached = self.link_container.attrs["NetworkSettings"]["Networks"]
        if self.networks["prfaas"] not in attached:
            net = self.client.networks.get(self.networks["prfaas"])
            await asyncio.to_thread(
                net.connect, self.link_container, ipv4_address=self.link_ips["prfaas"]
            )

    async def tc(self, rate_bytes_per_s: float | None, qdisc: str) -> str:
        """Shape what leaves the link container toward the local datacenter (tbf or htb);
        `None` removes it. Returns `tc qdisc show` of that interface."""
        await asyncio.to_thread(self.link_container.reload)
        mac = self.link_container.attrs["NetworkSettings"]["Networks"][self.networks["local"]][
            "MacAddress"
        ]
        rc, out = await asyncio.to_thread(
            self.link_container.exec_run,
            ["sh", "-c", _tc_script(mac, rate_bytes_per_s, qdisc)],
            demux=False,
        )
        text = (out or b"").decode(errors="replace")
        if rc != 0:
            raise UserError(f"tc in the link container failed: {text.strip()}")
        return text

    async def teardown(self) -> None:
        """`compose down`, then remove whatever of the run is left (containers, networks)."""
        await self.compose_cli("down", "-v", "--remove-orphans", "--timeout", "3")
        await asyncio.to_thread(down, self.project, log=self.log)
