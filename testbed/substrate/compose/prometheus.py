"""A Prometheus server beside a compose run, scraping the router and every worker's /metrics.

Asked for with `testbed up --substrate compose --prometheus` (or TESTBED_PROMETHEUS=1 for any
compose run). The image is Debian's `prometheus` package (compose/prometheus/Dockerfile), built
on the same Debian base as the testbed image and cached the same way (a tag with a hash of its
Dockerfile and base).

The container uses the host's network and listens on 127.0.0.1 only, and it scrapes each
service through the port that service publishes on 127.0.0.1, as the runner itself reaches
them. So it joins none of the run's networks: it is no path between the two datacenters, and
the isolation the topology promises (only the link container is on both) still holds. Its
configuration lives in the results directory (`prometheus/prometheus.yml`, and
`prometheus/targets.json`, a file_sd list rewritten whenever a service starts or restarts,
since a restarted container may publish another port); Prometheus reloads the target list by
itself. The container carries the run's labels, so the run's teardown and `make down` remove it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
import json
import os
import socket
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from testbed.errors import UserError
from testbed.metrics.files import atomic_write
from testbed.services.pd import DECODE_PREFIX, PREFILL_PREFIX
from testbed.substrate.compose.images import (
    BASE_IMAGE,
    BUILD_TIMEOUT_S,
    COMPOSE_DIR,
    LABEL,
    Log,
    build_base_image,
    docker_client,
    log_stderr,
)

__all__ = [
    "PROMETHEUS_IMAGE",
    "PrometheusServer",
    "ensure_prometheus_image",
    "prometheus_wanted",
    "scrape_targets",
]

PROMETHEUS_IMAGE = "prfaas-testbed-prometheus:latest"
DOCKERFILE_DIR = COMPOSE_DIR / "prometheus"
CONFIG_DIR = "/etc/testbed-prometheus"
"""Where the run's prometheus/ directory is mounted (read-only) in the container."""
SCRAPE_INTERVAL_S = 1.0
"""Wall seconds between scrapes: short, since a test or a demo run lasts seconds to minutes."""
READY_TIMEOUT_S = 60.0


def prometheus_wanted() -> bool:
    """TESTBED_PROMETHEUS=1: every compose run gets a Prometheus server."""
    return os.environ.get("TESTBED_PROMETHEUS", "") not in ("", "0")


def ensure_prometheus_image(*, log: Log = log_stderr, force: bool = False) -> str:
    """Build PROMETHEUS_IMAGE unless current; returns its tag.

    The base is the project's own Debian image (built first if missing) unless
    TESTBED_PROMETHEUS_BASE names another (debian:bookworm-slim where a registry is reachable).
    """
    client = docker_client()
    errors = importlib.import_module("docker.errors")
    base = os.environ.get("TESTBED_PROMETHEUS_BASE", BASE_IMAGE)
    if base == BASE_IMAGE:
        try:
            client.images.get(BASE_IMAGE)
        except errors.ImageNotFound:
            build_base_image(client, log)
    try:
        base_id = client.images.get(base).id
    except Exception:
        raise UserError(f"base image {base} is not available (pull or build it)") from None
    digest = hashlib.sha256((DOCKERFILE_DIR / "Dockerfile").read_bytes() + base_id.encode())
    current = f"{PROMETHEUS_IMAGE.split(':')[0]}:src-{digest.hexdigest()[:16]}"
    if not force:
        with contextlib.suppress(errors.ImageNotFound):
            client.images.get(current).tag(PROMETHEUS_IMAGE)
            return PROMETHEUS_IMAGE
    log(f"building {PROMETHEUS_IMAGE} on {base} (Debian's prometheus package)")
    try:
        image, _ = client.images.build(
            path=str(DOCKERFILE_DIR),
            tag=current,
            buildargs={"BASE": base},
            labels={LABEL: "prometheus"},
            rm=True,
            forcerm=True,
            timeout=BUILD_TIMEOUT_S,
        )
    except Exception as exc:
        lines = getattr(exc, "build_log", None) or []
        tail = "".join(str(x.get("stream", x.get("error", ""))) for x in list(lines)[-15:])
        raise UserError(f"building {PROMETHEUS_IMAGE} failed: {exc}\n{tail}") from None
    image.tag(PROMETHEUS_IMAGE)
    return PROMETHEUS_IMAGE


def scrape_targets(services: Iterable[tuple[str, str, str, int]]) -> list[dict[str, Any]]:
    """file_sd entries for (service id, role, cluster, published port) tuples: one per /metrics
    (a PD instance serves one per role it can take, services/pd.py)."""
    out: list[dict[str, Any]] = []
    for sid, role, cluster, port in sorted(services):
        paths = (
            [("prefill", f"{PREFILL_PREFIX}/metrics"), ("decode", f"{DECODE_PREFIX}/metrics")]
            if role == "pd"
            else [(role, "/metrics")]
        )
        for path_role, path in paths:
            labels = {"service": sid, "role": path_role, "cluster": cluster}
            out.append(
                {
                    "targets": [f"127.0.0.1:{port}"],
                    "labels": {**labels, "__metrics_path__": path},
                }
            )
    return out


def prometheus_config(scrape_interval_s: float = SCRAPE_INTERVAL_S) -> dict[str, Any]:
    """prometheus.yml: one job over the file_sd target list."""
    interval = f"{max(1, round(scrape_interval_s * 1000))}ms"
    return {
        "global": {"scrape_interval": interval, "scrape_timeout": interval},
        "scrape_configs": [
            {
                "job_name": "testbed",
                "file_sd_configs": [
                    {"files": [f"{CONFIG_DIR}/targets.json"], "refresh_interval": "2s"}
                ],
            }
        ],
    }


def free_port() -> int:
    """A port on 127.0.0.1 free now (TESTBED_PROMETHEUS_PORT fixes one instead)."""
    fixed = os.environ.get("TESTBED_PROMETHEUS_PORT")
    if fixed:
        return int(fixed)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrometheusServer:
    """One run's Prometheus container (see the module docstring)."""

    def __init__(self, config_dir: Path, *, log: Log = log_stderr) -> None:
        self.config_dir = config_dir.resolve()
        self.log = log
        self.port = 0
        self.container: Any = None
        self._targets: dict[str, tuple[str, str, str, int]] = {}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set_target(self, sid: str, role: str, cluster: str, port: int) -> None:
        """A service is up (or restarted on another port): rewrite the target list."""
        self._targets[sid] = (sid, role, cluster, port)
        self.config_dir.mkdir(parents=True, exist_ok=True)
        doc = scrape_targets(self._targets.values())
        atomic_write(self.config_dir / "targets.json", json.dumps(doc, indent=1) + "\n")

    def start(self, client: Any, labels: dict[str, str], cgroup_parent: str | None) -> None:
        """Write the configuration and start the container (blocking; run in a thread)."""
        self.config_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(self.config_dir / "prometheus.yml", yaml.safe_dump(prometheus_config()))
        if not (self.config_dir / "targets.json").exists():
            atomic_write(self.config_dir / "targets.json", "[]\n")
        # the container reads these as user prometheus: readable by all, as a results dir is
        for p in (self.config_dir, *self.config_dir.iterdir()):
            with contextlib.suppress(OSError):
                p.chmod(p.stat().st_mode | (0o555 if p.is_dir() else 0o444))
        self.port = free_port()
        name = f"{labels.get('com.prfaas-testbed.run', 'prfaas')}-prometheus"
        errors = importlib.import_module("docker.errors")
        with contextlib.suppress(errors.NotFound):  # a leftover of a crashed run
            client.containers.get(name).remove(force=True)
        self.container = client.containers.run(
            PROMETHEUS_IMAGE,
            [
                f"--config.file={CONFIG_DIR}/prometheus.yml",
                "--storage.tsdb.path=/prometheus",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1d",
            ],
            name=name,
            labels=labels,
            detach=True,
            network_mode="host",
            volumes={str(self.config_dir): {"bind": CONFIG_DIR, "mode": "ro"}},
            cgroup_parent=cgroup_parent,
        )

    async def wait_ready(self) -> None:
        """Until Prometheus answers /-/ready (bounded by READY_TIMEOUT_S)."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        timeout = aiohttp.ClientTimeout(total=2)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while time.monotonic() < deadline:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.get(f"{self.url}/-/ready") as resp:
                        if resp.status == 200:
                            return
                await asyncio.to_thread(self.container.reload)
                if self.container.status in ("exited", "dead"):
                    break
                await asyncio.sleep(0.3)
        logs = await asyncio.to_thread(self.container.logs, tail=20)
        raise UserError(
            f"Prometheus did not become ready at {self.url}:\n{logs.decode(errors='replace')}"
        )

    def save_log(self, path: Path) -> None:
        if self.container is not None:
            with contextlib.suppress(Exception):
                path.write_bytes(self.container.logs(stdout=True, stderr=True))

    def remove(self) -> None:
        if self.container is not None:
            with contextlib.suppress(Exception):
                self.container.remove(force=True, v=True)
