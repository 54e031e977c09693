"""An instance as a service of the compose substrate's rendered file (profile `deployment`):
what a person standing the deployment up by hand with `docker compose` gets. The run itself
starts its containers through the Docker API (testbed.substrate.compose.substrate)."""

from __future__ import annotations

from typing import Any

from testbed.services.spec import ServiceSpec
from testbed.substrate.compose.images import LABEL
from testbed.substrate.compose.topology import HTTP_PORT, OWNER_LABEL, RUN_LABEL, SERVICE_LABEL

__all__ = ["service_doc"]


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


def service_doc(spec: ServiceSpec, ip: str) -> dict[str, Any]:
    """An instance as a service of the rendered file (profile `deployment`, for a stand-up by
    hand; the run itself starts its containers through the Docker API)."""
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
