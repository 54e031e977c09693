"""#15 item 5: `testbed sweep --ray ADDRESS` on a real (local) Ray cluster gives the process
pool's table, cell for cell.

The test starts its own Ray head on 127.0.0.1 (`ray start --head --block`, in a session of its
own, stopped by its process group at the end), runs a small grid on it through
`run_grid(ray_address=...)` and the same grid in a local process pool, and compares the rows.
Marked `ray` (pyproject.toml): it needs the `ray` extra, which `make test` installs. Ray is
imported when the test runs, not when the module is collected, so a venv without the extra (after
`make install`) still collects every other test with any marker expression; selecting this one
there fails it, naming the extra. About half a minute here, most of it Ray starting.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed.scenario.library import LIBRARY_DIR
from testbed.scenario.sweep import cells, parse_set, run_grid

pytestmark = pytest.mark.ray

START_TIMEOUT_S = 90.0
STOP_GRACE_S = 5.0
"""How long the head gets to stop on SIGTERM before its process group is killed (#31: it took
the whole 30 s it was given, every time)."""


def _ray() -> Any:
    """The `ray` module; the test fails, naming the extra, where it is not installed."""
    try:
        import ray
    except ImportError as exc:
        pytest.fail(
            f"this test needs the ray extra (pip install -e '.[ray]'; make test installs it): {exc}"
        )
    return ray


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    ray = _ray()
    port = _free_port()
    ray_cli = Path(sys.executable).with_name("ray")
    log = tmp_path_factory.mktemp("ray") / "head.log"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    with log.open("wb") as out:
        head = subprocess.Popen(
            [str(ray_cli), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
             f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
             "--disable-usage-stats"],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _listening(port):
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ray head did not start: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        ray.shutdown()
        os.killpg(head.pid, signal.SIGTERM)
        try:  # `ray start --block` outlived 30 s of SIGTERM in every CI log: a short grace
            head.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(timeout=10)


def test_a_sweep_on_ray_matches_the_process_pool(ray_head: str) -> None:
    grid = cells(
        LIBRARY_DIR / "paper.yaml",
        [
            parse_set("deployments.prfaas-pd.prfaas.instances=2,4"),
            parse_set("deployments.prfaas-pd.link.bandwidth=25Gbps,100Gbps"),
        ],
        saturation=False,
    )
    on_ray = run_grid(grid, ray_address=ray_head)
    in_pool = run_grid(grid, jobs=2)
    assert len(on_ray) == 4
    assert on_ray == in_pool
    assert len({r["throughput_rps"] for r in on_ray}) > 1  # the cells differ: a real grid
