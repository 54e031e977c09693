"""The sweep's cells on a Ray cluster (`testbed sweep --ray ADDRESS`): a sweep over 10K-GPU
deployments outgrows one machine. Each cell is the same `run_cell` call as in the local pool, so
the table is identical. Ray is an optional extra (`pip install 'prfaas-testbed[ray]'`); the
cluster's workers need this package importable (the same virtualenv on a local cluster; a
`runtime_env` or an image with it elsewhere)."""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from testbed.errors import UserError

C = TypeVar("C")

__all__ = ["run_on_ray"]


def run_on_ray(
    todo: Sequence[C], address: str, run_cell: Callable[[C], dict[str, Any]]
) -> list[dict[str, Any]]:
    """`run_cell` of every cell, on the cluster, in order."""
    try:
        import ray
    except ImportError:
        raise UserError(
            "--ray needs Ray: pip install 'prfaas-testbed[ray]' (or run without --ray)"
        ) from None
    _probe(address)
    try:
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    except Exception as exc:  # ConnectionError, ValueError, RuntimeError, by Ray version
        raise UserError(f"--ray {address}: cannot join the cluster: {exc}") from None
    remote = ray.remote(run_cell)
    return list(ray.get([remote.remote(cell) for cell in todo]))


PROBE_TIMEOUT_S = 5.0


def _probe(address: str) -> None:
    """Fail in one line when nothing listens at a host:port address: ray.init waits a minute
    or more for the cluster's GCS there, then exits the process instead of raising."""
    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit():
        return  # "auto", "local" and the like: Ray resolves those itself
    try:
        with socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S):
            pass
    except OSError as exc:
        raise UserError(
            f"--ray {address}: cannot join the cluster: nothing answers at {host}:{port} "
            f"({exc.strerror or exc})"
        ) from None
