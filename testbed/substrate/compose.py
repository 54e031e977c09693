"""The compose substrate: containers as emulated datacenters.

Topology of one run (project `prfaas-NAME-xxxxxx`):

    host: runner ──127.0.0.1:ports──> ctl network (icc off: host <-> container only)
                                          │
    prfaas network (internal)             │            local network (internal)
      prfaas-prefill-i ──KV──> link :10000+j ──KV──> local-decode-j :9000
                         <──HTTP── link :11000+i <──HTTP── router
                               (link container)           local-prefill-i ──KV──> decode

The link container (the link emulator, `testbed link serve`, with NET_ADMIN for tc) is the
only member of both datacenter networks, so every byte between them crosses its proxies: KV
proxies `xdc-<decode>` carry the shared link cap and the RTT toxics exactly as on the local
substrate; control proxies `ctl-<prefill>` let the router reach PrfaaS prefill instances
(untouched by toxics, as control traffic is on the local substrate). The `ctl` network only
carries the runner's traffic: each container publishes its HTTP port on 127.0.0.1 and
containers cannot talk to each other over it.

The standing topology (networks and link container) comes up with `docker compose` or
`docker-compose` from compose/docker-compose.yml, rendered into results/NAME/compose.yml with
its .env; instances are containers started through the Docker API into the same networks, and
the rendered file lists them too (profile `deployment`) so the deployment can be stood up by
hand. Faults map to the Docker API: kill, pause, restart, network disconnect.

`python -m testbed.substrate.compose images|down` (what `make images` / `make down` run)
builds the images (cached) and removes every container, network and volume of the project.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import importlib
import ipaddress
import json
import os
import platform
import random
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testbed.config import LinkConfig, ScaleConfig
from testbed.errors import UserError
from testbed.link.client import LinkClient
from testbed.link.deployment import LinkSetup, add_link_proxies
from testbed.services.spec import InstanceInfo, ServiceSpec
from testbed.substrate.base import ServiceHandle

__all__ = [
    "IMAGE",
    "LABEL",
    "RUN_LABEL",
    "ComposeSubstrate",
    "compose_command",
    "docker_client",
    "down",
    "ensure_images",
    "main",
]

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_DIR = ROOT / "compose"
CACHE_DIR = COMPOSE_DIR / ".cache"
IMAGE = "prfaas-testbed:latest"
BASE_IMAGE = "prfaas-testbed-base:bookworm"
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
IMAGE_PYTHON = "3.11"
"""Python of the images (Debian bookworm's python3, and python:3.11-slim)."""

LABEL = "com.prfaas-testbed.project"
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
BUILD_TIMEOUT_S = 1800.0

Log = Callable[[str], None]


def _log(msg: str) -> None:
    print(f"compose: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------- docker


def docker_client() -> Any:
    """A Docker SDK client (the `compose` extra, which `make install` installs)."""
    try:
        docker = importlib.import_module("docker")
    except ImportError:
        raise UserError(
            "the compose substrate needs the docker package: "
            "pip install 'prfaas-testbed[compose]' (make install does this)"
        ) from None
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as exc:
        raise UserError(f"cannot reach the Docker engine: {exc}") from None
    return client


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


def _image_labels(client: Any, tag: str) -> dict[str, str] | None:
    errors = importlib.import_module("docker.errors")
    try:
        img = client.images.get(tag)
    except errors.ImageNotFound:
        return None
    return dict(img.labels or {})


# ---------------------------------------------------------------------------------- images


def _build_base(client: Any, log: Log) -> None:
    """A Debian image from Debian packages: mmdebstrap piped into `docker import`."""
    if shutil.which("mmdebstrap") is None:
        if os.geteuid() == 0 and shutil.which("apt-get"):
            log("installing mmdebstrap (apt-get)")
            subprocess.run(
                ["apt-get", "install", "-y", "-q", "mmdebstrap"],
                check=True,
                timeout=600,
                stdout=subprocess.DEVNULL,
            )
        else:
            raise UserError(
                f"building {BASE_IMAGE} needs mmdebstrap (apt-get install mmdebstrap), or "
                "set TESTBED_BASE_IMAGE=python:3.11-slim where a registry is reachable"
            )
    log(f"building {BASE_IMAGE} with mmdebstrap ({DEBIAN_SUITE}; a few minutes)")
    with tempfile.TemporaryDirectory(prefix="prfaas-base-") as tmp:
        tar = Path(tmp) / "base.tar"
        subprocess.run(
            [
                "mmdebstrap",
                "--quiet",
                "--variant=minbase",
                "--include=python3,python3-venv,iproute2,ca-certificates",
                DEBIAN_SUITE,
                str(tar),
                DEBIAN_MIRROR,
            ],
            check=True,
            timeout=BUILD_TIMEOUT_S,
        )
        repo, tag = BASE_IMAGE.split(":")
        client.api.import_image_from_file(
            str(tar), repository=repo, tag=tag, changes=[f'LABEL {LABEL}="base"']
        )


def _requirements() -> list[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return list(data["project"]["dependencies"])


def _wheels(log: Log) -> Path:
    """Dependency wheels for the images' Python, downloaded once per dependency set."""
    reqs = _requirements()
    key = hashlib.sha256(json.dumps([reqs, IMAGE_PYTHON, platform.machine()]).encode())
    dest = CACHE_DIR / f"wheels-{key.hexdigest()[:12]}"
    if (dest / ".complete").exists():
        return dest
    log(f"downloading wheels for Python {IMAGE_PYTHON} from PyPI into {dest}")
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    arch = platform.machine()
    platforms = [f"manylinux_2_{m}_{arch}" for m in range(36, 16, -1)]
    platforms += [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}"]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--dest", str(dest)]
    cmd += ["--only-binary=:all:", "--python-version", IMAGE_PYTHON, "--implementation", "cp"]
    cmd += ["--abi", "cp" + IMAGE_PYTHON.replace(".", "")]
    for p in platforms:
        cmd += ["--platform", p]
    subprocess.run([*cmd, *reqs], check=True, timeout=900)
    (dest / "requirements.txt").write_text("\n".join(reqs) + "\n")
    (dest / ".complete").write_text("")
    return dest


def _source_files() -> list[Path]:
    files = [
        p
        for p in sorted((ROOT / "testbed").rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")
    ]
    return files


def ensure_images(*, log: Log = _log, force: bool = False) -> str:
    """Build the base and testbed images unless they are current; returns the image tag.

    Cached: the testbed image carries a hash of its Dockerfile, wheels, source and base image;
    when the hash matches, this returns in well under a second.
    """
    client = docker_client()
    base = os.environ.get("TESTBED_BASE_IMAGE", BASE_IMAGE)
    if base == BASE_IMAGE and (force or _image_labels(client, BASE_IMAGE) is None):
        _build_base(client, log)
    try:
        base_id = client.images.get(base).id
    except Exception:
        raise UserError(f"base image {base} is not available (pull or build it)") from None
    wheels = _wheels(log)
    sources = _source_files()
    digest = hashlib.sha256()
    digest.update((COMPOSE_DIR / "Dockerfile").read_bytes())
    digest.update(base_id.encode())
    for w in sorted(wheels.iterdir()):
        digest.update(w.name.encode())
    digest.update((wheels / "requirements.txt").read_bytes())
    for f in sources:
        digest.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes())
    source_hash = digest.hexdigest()[:16]
    current = f"{IMAGE.split(':')[0]}:src-{source_hash}"
    if not force and _image_labels(client, current) is not None:
        client.images.get(current).tag(IMAGE)
        return IMAGE
    log(f"building {IMAGE} on {base}")
    ctx = CACHE_DIR / "context"
    shutil.rmtree(ctx, ignore_errors=True)
    (ctx / "src").mkdir(parents=True)
    shutil.copy2(COMPOSE_DIR / "Dockerfile", ctx / "Dockerfile")
    shutil.copytree(wheels, ctx / "wheels", ignore=shutil.ignore_patterns(".complete"))
    for f in sources:
        target = ctx / "src" / f.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, target)
    try:
        image, _ = client.images.build(
            path=str(ctx),
            tag=current,
            buildargs={"BASE": base},
            rm=True,
            forcerm=True,
            timeout=BUILD_TIMEOUT_S,
        )
    except Exception as exc:
        log_lines = getattr(exc, "build_log", None) or []
        tail = "".join(str(x.get("stream", x.get("error", ""))) for x in list(log_lines)[-15:])
        raise UserError(f"building {IMAGE} failed: {exc}\n{tail}") from None
    image.tag(IMAGE)
    # Earlier source builds: untag them (their layers below the source stay cached).
    for old in client.images.list(name=IMAGE.split(":")[0]):
        for tag in old.tags:
            if ":src-" in tag and tag != current:
                with contextlib.suppress(Exception):
                    client.images.remove(tag, noprune=False)
    with contextlib.suppress(Exception):  # the previous `latest`, now untagged
        client.images.prune(filters={"dangling": True, "label": f"{LABEL.rsplit('.', 1)[0]}.image"})
    return IMAGE


def down(run: str | None = None, *, log: Log = _log) -> dict[str, int]:
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


def reap_orphans(*, log: Log = _log) -> list[str]:
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


def _host(subnet: str, n: int) -> str:
    return str(ipaddress.IPv4Network(subnet).network_address + n)


def _healthcheck(port: int) -> dict[str, Any]:
    # bash's /dev/tcp: a TCP connect costs next to nothing, where a Python start-up per check
    # and container would take a noticeable share of a small host's CPU from the emulation.
    return {
        "test": ["CMD", "bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{port}"],
        "interval": "5s",
        "timeout": "3s",
        "retries": 12,
        "start_period": "2s",
    }


@dataclass
class _Instance:
    spec: ServiceSpec
    """The spec the container runs (container addresses and fixed ports)."""
    container: Any
    ip: str
    host_port: int = 0
    ctl_ip: str = ""
    ready_lines: int = 0
    service: dict[str, Any] = field(default_factory=dict)
    """Its compose service, for the rendered file."""


class ComposeSubstrate:
    """Services as containers in per-datacenter networks joined only by the link container."""

    name = "compose"

    def __init__(self, log_dir: Path | None, *, image: str = IMAGE, log: Log = _log) -> None:
        self.log_dir = log_dir
        out_dir = log_dir.parent if log_dir is not None else Path(tempfile.mkdtemp())
        self.out_dir = out_dir.resolve()
        slug = re.sub(r"[^a-z0-9]+", "-", self.out_dir.name.lower()).strip("-")[:24]
        self.project = f"prfaas-{slug or 'run'}-{secrets.token_hex(3)}"
        self.image = image
        self.log = log
        self.compose_file = self.out_dir / "compose.yml"
        self.client: Any = None
        self.instances: dict[str, _Instance] = {}
        self.link: LinkSetup | None = None
        self.link_api: LinkClient | None = None
        self.link_container: Any = None
        self.subnets: dict[str, str] = {}
        self.link_ips: dict[str, str] = {}
        self.networks: dict[str, str] = {}
        """Datacenter name (and 'ctl') -> Docker network name."""
        self._next_host = {"prfaas": FIRST_HOST, "local": FIRST_HOST}
        self._kv_proxies: dict[str, int] = {}
        self._ctl_proxies: dict[str, int] = {}
        self._lock = asyncio.Lock()
        self._up = False
        self._stopped = False
        self._seed = 0
        self._template: dict[str, Any] = {}
        self._env: dict[str, str] = {}
        self._compose: list[str] = []
        self._t0 = time.monotonic()
        self.direct = False
        """The runner reaches containers at their ctl addresses, not through published ports."""

    # ------------------------------------------------------------------ standing topology

    async def _ensure_up(self) -> None:
        async with self._lock:
            if self._up:
                return
            if self._stopped:
                raise UserError("the compose substrate was stopped")
            self.client = await asyncio.to_thread(docker_client)
            self._compose = await asyncio.to_thread(compose_command)
            await asyncio.to_thread(reap_orphans, log=self.log)
            await asyncio.to_thread(ensure_images, log=self.log)
            self._note("images current")
            self._up = True  # from here on stop_all has something to clean up
            rng = random.Random()
            for attempt in range(5):
                prfaas, local = await asyncio.to_thread(_pick_subnets, self.client, rng)
                self.subnets = {"prfaas": prfaas, "local": local}
                self.link_ips = {dc: _host(s, 2) for dc, s in self.subnets.items()}
                self._write_compose()
                rc, out = await self._compose_cli("up", "-d", "link")
                if rc == 0:
                    break
                await self._compose_cli("down", "-v", "--remove-orphans", "--timeout", "2")
                if "overlap" not in out.lower() or attempt == 4:
                    raise UserError(f"{' '.join(self._compose)} up failed:\n{out[-2000:]}")
            await self._find_topology()
            self._note(
                f"topology up: prfaas {self.subnets['prfaas']}, local {self.subnets['local']}"
            )

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
        (self.out_dir / ".env").write_text("".join(f"{k}={v}\n" for k, v in self._env.items()))
        self._render()

    def _render(self) -> None:
        doc = json.loads(json.dumps(self._template))
        for inst in self.instances.values():
            doc["services"][inst.spec.id] = inst.service
        header = (
            f"# Rendered by the compose substrate for run {self.project} from\n"
            "# compose/docker-compose.yml (values in .env beside this file). The run starts the\n"
            "# instances itself; to stand the deployment up again by hand after the run:\n"
            f"#   {' '.join(self._compose or ['docker-compose'])} -f compose.yml "
            "--profile deployment up -d\n"
        )
        self.compose_file.write_text(header + yaml.safe_dump(doc, sort_keys=False, width=1000))

    def _note(self, text: str) -> None:
        """A timestamped line in logs/compose.log (start-up and fault timings)."""
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            with (self.log_dir / "compose.log").open("a") as f:
                f.write(
                    f"[{time.strftime('%H:%M:%S')} +{time.monotonic() - self._t0:.2f}s] {text}\n"
                )

    async def _compose_cli(self, *args: str) -> tuple[int, str]:
        cmd = [*self._compose, "-f", str(self.compose_file), "-p", self.project, *args]
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
            self._note(f"$ {' '.join(cmd)}\n{text}")
        return proc.returncode or 0, text

    async def _find_topology(self) -> None:
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
        port = _host_port(self.link_container, LINK_API_PORT)
        self.link_api = LinkClient(f"http://127.0.0.1:{port}")
        # Where the host routes to the ctl bridge (Linux), talk to containers there: the same
        # ctl network, minus the userland docker-proxy hop (and its CPU) of a published port.
        # TESTBED_COMPOSE_PUBLISHED=1 keeps to the published 127.0.0.1 ports.
        ctl_ip = _ctl_ip(self.link_container, self.networks["ctl"])
        if os.environ.get("TESTBED_COMPOSE_PUBLISHED") != "1" and await _reachable(
            ctl_ip, LINK_API_PORT
        ):
            self.direct = True
            self.link_api = LinkClient(f"http://{ctl_ip}:{LINK_API_PORT}")

    # ------------------------------------------------------------------ services

    def _container_name(self, sid: str) -> str:
        return f"{self.project}-{sid}"

    def _alloc_ip(self, cluster: str) -> str:
        n = self._next_host[cluster]
        if n > 250:
            raise UserError(f"more than {250 - FIRST_HOST} instances in datacenter {cluster}")
        self._next_host[cluster] = n + 1
        return _host(self.subnets[cluster], n)

    async def _router_spec(self, spec: ServiceSpec) -> list[InstanceInfo]:
        """The router's instance table with container addresses; PrfaaS via the link."""
        assert self.link_api is not None
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
                    await self.link_api.create_proxy(
                        f"ctl-{info.id}",
                        upstream=f"{inst.ip}:{HTTP_PORT}",
                        listen=f"{self.link_ips[spec.cluster]}:{port}",
                    )
                    self._ctl_proxies[info.id] = port
                url = f"http://{self.link_ips[spec.cluster]}:{port}"
            rewritten.append(info.model_copy(update={"url": url}))
        return rewritten

    def _service_doc(self, spec: ServiceSpec, ip: str) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "image": "${TESTBED_IMAGE}",
            "command": ["python", "-m", "testbed.services.host", spec.model_dump_json()],
            "init": True,
            "cgroup_parent": "${TESTBED_CGROUP_PARENT-/}",
            "profiles": ["deployment"],
            "labels": {
                LABEL: "1",
                RUN_LABEL: "${TESTBED_RUN}",
                OWNER_LABEL: "${TESTBED_OWNER}",
                SERVICE_LABEL: spec.id,
            },
            "networks": {spec.cluster: {"ipv4_address": ip}, "ctl": {}},
            "ports": [f"127.0.0.1::{HTTP_PORT}"],
            "healthcheck": _healthcheck(HTTP_PORT),
            "depends_on": {"link": {"condition": "service_healthy"}},
        }
        if spec.role == "router":
            for info in spec.instances:
                doc["depends_on"][info.id] = {"condition": "service_healthy"}
        return doc

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
            cgroup_parent=_cgroup_parent(),
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
        inst.host_port = _host_port(inst.container, HTTP_PORT)
        inst.ctl_ip = _ctl_ip(inst.container, self.networks["ctl"])

    def _handle(self, inst: _Instance) -> ServiceHandle:
        kv = (inst.ip, KV_PORT) if inst.spec.role in ("decode", "pd") else None
        if self.direct:
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
        inst = _Instance(inner, container, ip, service=self._service_doc(inner, ip))
        self.instances[spec.id] = inst
        async with self._lock:
            self._render()
        await self._wait_ready(inst)
        self._note(
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
        assert self.link_api is not None
        if link.toxiproxy is not None:
            raise UserError(
                "link.toxiproxy is not supported on the compose substrate: "
                "the link container is the emulator"
            )
        setup = LinkSetup(dict(upstreams), scale, link.bandwidth)
        self.link = setup
        if not enabled:
            return setup
        await self.link_api.reset(seed=seed)
        self._seed = seed
        self._env["TESTBED_SEED"] = str(seed)
        (self.out_dir / ".env").write_text("".join(f"{k}={v}\n" for k, v in self._env.items()))
        setup.client = LinkClient(self.link_api.url)
        listen_ip = self.link_ips["prfaas"]

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
            net = self.client.networks.get(self.networks["prfaas"])
            await asyncio.to_thread(net.disconnect, self.link_container, force=True)
        elif mode == "proxies":
            assert self.link_api is not None
            for name in await self.link_api.proxies():
                await self.link_api.disable(name)
        else:
            raise ValueError(f"unknown partition mode {mode!r}")

    async def heal(self) -> None:
        """Undo `partition` (either mode); idempotent."""
        await asyncio.to_thread(self.link_container.reload)
        attached = self.link_container.attrs["NetworkSettings"]["Networks"]
        if self.networks["prfaas"] not in attached:
            net = self.client.networks.get(self.networks["prfaas"])
            await asyncio.to_thread(
                net.connect, self.link_container, ipv4_address=self.link_ips["prfaas"]
            )
        assert self.link_api is not None
        for name, proxy in (await self.link_api.proxies()).items():
            if not proxy.get("enabled", True):
                await self.link_api.enable(name)

    async def shape_link(self, rate_bytes_per_s: float | None, *, qdisc: str = "tbf") -> str:
        """Kernel shaping inside the link container (NET_ADMIN): caps what leaves it toward the
        local datacenter with tbf or htb; `None` removes it. Returns `tc qdisc show`."""
        await asyncio.to_thread(self.link_container.reload)
        mac = self.link_container.attrs["NetworkSettings"]["Networks"][self.networks["local"]][
            "MacAddress"
        ]
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
                script += " tc qdisc replace dev $dev root handle 1: htb default 1 &&"
                script += f" tc class replace dev $dev parent 1: classid 1:1 htb rate {bits}bit "
                script += f"burst {burst} &&"
        script += " tc qdisc show dev $dev"
        rc, out = await asyncio.to_thread(
            self.link_container.exec_run, ["sh", "-c", script], demux=False
        )
        text = (out or b"").decode(errors="replace")
        if rc != 0:
            raise UserError(f"tc in the link container failed: {text.strip()}")
        return text

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

        await asyncio.to_thread(save)

    async def stop_all(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        async with self._lock:
            if not self._up:
                return
        self._note("stopping")
        await self._save_logs()
        if self.link_api is not None:  # the link's proxies and toxics as they ended
            with contextlib.suppress(Exception):
                state = await self.link_api.proxies()
                (self.out_dir / "link.json").write_text(json.dumps(state, indent=1) + "\n")
        for client in (self.link.client if self.link else None, self.link_api):
            if client is not None:
                await client.close()

        def remove(c: Any) -> None:
            with contextlib.suppress(Exception):
                c.remove(force=True, v=True)

        await asyncio.gather(
            *(asyncio.to_thread(remove, i.container) for i in self.instances.values())
        )
        await self._compose_cli("down", "-v", "--remove-orphans", "--timeout", "3")
        await asyncio.to_thread(down, self.project, log=self.log)
        self._note("stopped")


def _cgroup_parent() -> str | None:
    """Each container's cgroup at the top level, as a process of the local substrate is.

    Under Docker's default parent (/docker) all containers together weigh as much as one host
    process in the CPU scheduler: on a busy host the whole deployment would get one process's
    share, where the local substrate's services get one share each. TESTBED_CGROUP_PARENT
    overrides it (empty: Docker's default).
    """
    return os.environ.get("TESTBED_CGROUP_PARENT", "/") or None


def _ctl_ip(container: Any, network: str) -> str:
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


def _host_port(container: Any, port: int) -> int:
    bindings = container.attrs["NetworkSettings"]["Ports"].get(f"{port}/tcp") or []
    for b in bindings:
        if b.get("HostIp") in ("127.0.0.1", "0.0.0.0", ""):
            return int(b["HostPort"])
    raise UserError(f"container {container.name} publishes no port for {port}/tcp")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.substrate.compose", description="compose substrate images"
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    img = sub.add_parser("images", help="build the base and testbed images (cached)")
    img.add_argument("--force", action="store_true", help="rebuild even when current")
    dn = sub.add_parser("down", help="remove every container, network and volume of the project")
    dn.add_argument("--run", help="only this run (its compose project name)")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "images":
            t = time.monotonic()
            tag = ensure_images(force=args.force)
            print(f"{tag} ready ({time.monotonic() - t:.1f}s)")
        else:
            removed = down(args.run)
            print("removed: " + ", ".join(f"{n} {k}" for k, n in removed.items()))
            left = leftovers(args.run)
            if any(left.values()):
                print(f"still present: {left}", file=sys.stderr)
                return 1
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
