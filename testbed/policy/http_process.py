"""The outside scheduler's process when a scenario owns it (`policy: {kind: http, command:
[...]}`): started before the run, stopped after it, killed, paused and resumed by the scheduler
nemesis actions. Apart from testbed.policy.http (the client), which re-exports it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.parse
from collections.abc import Sequence
from pathlib import Path

__all__ = ["SchedulerProcess"]


class SchedulerProcess:
    """The outside scheduler's process when a scenario owns it (`policy.command`): started
    before the run, its output to files in the results directory, stopped after it. The
    scheduler nemesis actions kill, pause and resume it through here."""

    def __init__(self, command: Sequence[str], url: str, out_dir: Path, cwd: Path | None = None):
        self.command = list(command)
        self.url = url
        self.out_dir = out_dir
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, ready_timeout_s: float = 20.0) -> None:
        """Start it and wait (bounded) until its port accepts connections."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        tag = "" if self.starts == 1 else f".{self.starts}"
        with (
            open(self.out_dir / f"scheduler{tag}.stdout", "wb") as out,
            open(self.out_dir / f"scheduler{tag}.stderr", "wb") as err,
        ):
            self.proc = subprocess.Popen(
                self.command, stdout=out, stderr=err, cwd=self.cwd, start_new_session=True
            )
        parts = urllib.parse.urlsplit(self.url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        deadline = time.monotonic() + ready_timeout_s
        for _ in range(int(ready_timeout_s / 0.05) + 1):
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"scheduler command {self.command!r} exited with {self.proc.returncode} "
                    f"before serving (see {self.out_dir}/scheduler{tag}.stderr)"
                )
            try:
                with socket.create_connection((host, port), timeout=0.2):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"scheduler command {self.command!r}: {host}:{port} not serving "
                           f"within {ready_timeout_s:g}s")  # fmt: skip

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.running:
            assert self.proc is not None
            os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def stop(self, grace_s: float = 5.0) -> None:
        if self.proc is None:
            return
        self.resume()
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.kill()
