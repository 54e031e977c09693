"""The link emulator as a child process of the runner (the local substrate's link).

`testbed link serve --port 0` (started as `python -m testbed.cli.link serve`: the link commands
alone, not the whole CLI's imports) binds any free port and announces its API address on stdout;
the emulator dies with the runner (testbed.lifeline) and logs to link.log in the run's logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from pathlib import Path
from typing import Any

from testbed.errors import UserError
from testbed.lifeline import child_env

__all__ = ["spawn_emulator", "stop_emulator"]

START_TIMEOUT_S = 20.0
STOP_GRACE_S = 5.0


async def spawn_emulator(
    seed: int, log_dir: Path | None, *, listen_netns: str | None = None
) -> tuple[asyncio.subprocess.Process, str]:
    """Start `testbed link serve` seeded with `seed`; returns the process and its API URL.
    With `listen_netns` its proxies listen in that namespace (a kernel-shaped link); the API
    stays on this host's loopback."""
    extra = ["--listen-netns", listen_netns] if listen_netns else []
    stderr: Any = asyncio.subprocess.DEVNULL
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        stderr = (log_dir / "link.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "testbed.cli.link",
        "serve",
        "--port",
        "0",
        "--seed",
        str(seed),
        *extra,
        stdout=asyncio.subprocess.PIPE,
        stderr=stderr,
        start_new_session=True,
        env=child_env(),  # the emulator dies with this process (testbed.lifeline)
    )
    if hasattr(stderr, "close"):
        stderr.close()
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            while line := (await proc.stdout.readline()).decode():
                if "link emulator API on " in line:
                    return proc, line.rsplit(" ", 1)[1].strip()
    except TimeoutError:
        pass
    proc.kill()
    await proc.wait()
    raise UserError("the link emulator did not start; see link.log in the results")


async def stop_emulator(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM, then SIGKILL if it is still alive after a grace period."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        async with asyncio.timeout(STOP_GRACE_S):
            await proc.wait()
    except TimeoutError:
        proc.kill()
        await proc.wait()
