"""The runner's side of the service zygote (testbed.services.zygote): start it, ask it for a
service, and follow each forked service as the local substrate follows a process.

One zygote per local substrate, so per run: it imports every role's app once (about 0.9 CPU s)
where each service used to import its own (0.7-0.9 CPU s each, seven in a short run), and lives
until the run stops its services. A forked service is not the runner's child, so the zygote
reports each one's end (`{"exit": PID, "code": C}`) and `ForkedProcess` offers what the
substrate uses of an `asyncio.subprocess.Process`: `pid`, `returncode`, `stdout` (the READY
line), `wait`, `send_signal`, `kill`. If the zygote dies, its services die with it (each armed
its death signal on it) and are reported killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from testbed.errors import UserError
from testbed.lifeline import child_env

__all__ = ["ForkedProcess", "Zygote"]

STOP_S = 5.0
"""Seconds the zygote has to leave once its socket is closed, before it is killed."""


class ForkedProcess:
    """A service the zygote forked."""

    def __init__(self, pid: int, stdout: asyncio.StreamReader) -> None:
        self.pid = pid
        self.stdout = stdout
        self.returncode: int | None = None
        self._ended = asyncio.get_running_loop().create_future()

    def _exit(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self._ended.set_result(code)

    async def wait(self) -> int:
        return int(await asyncio.shield(self._ended))

    def send_signal(self, sig: int) -> None:
        """As asyncio's: ProcessLookupError once the process has ended (its pid may be
        someone else's by then)."""
        if self.returncode is not None:
            raise ProcessLookupError(self.pid)
        os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """One zygote process and the services it forked."""

    def __init__(self, log_path: Path | None = None) -> None:
        """`log_path`: where the zygote's own stderr goes (an import error, say); removed at
        `aclose` if nothing was written."""
        self.log_path = log_path
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = child_env({**os.environ, "PYTHONUNBUFFERED": "1"})  # dies with us: lifeline
        err: Any = subprocess.DEVNULL
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            err = log_path.open("ab")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "testbed.services.zygote"],
                stdin=theirs.fileno(), stdout=subprocess.DEVNULL, stderr=err,
                env=env, start_new_session=True,
            )  # fmt: skip
        finally:
            theirs.close()
            if log_path is not None:
                err.close()
        ours.setblocking(False)
        self.sock = ours
        self._refs = 0
        self._asked: dict[int, asyncio.Future[int]] = {}
        self._procs: dict[int, ForkedProcess] = {}
        self._early: dict[int, int] = {}
        """Exit codes of pids whose spawn has not returned yet."""
        self._reader = asyncio.create_task(self._read())
        self.gone: str | None = None

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                data = await loop.sock_recv(self.sock, 1 << 16)
                if not data:
                    break
                self._handle(json.loads(data))
        except (OSError, ValueError) as exc:
            self.gone = f"zygote: {exc}"
        finally:
            why = f"the service zygote exited (code {self.proc.poll()})"
            self.gone = self.gone or why + (f"; see {self.log_path}" if self.log_path else "")
            for fut in self._asked.values():
                if not fut.done():
                    fut.set_exception(UserError(self.gone))
            for proc in self._procs.values():  # each died with it (its death signal)
                proc._exit(-signal.SIGKILL)

    def _handle(self, doc: dict[str, Any]) -> None:
        if "exit" in doc:
            pid, code = int(doc["exit"]), int(doc["code"])
            proc = self._procs.pop(pid, None)
            if proc is None:
                self._early[pid] = code
            else:
                proc._exit(code)
            return
        fut = self._asked.pop(doc.get("ref", -1), None)
        if fut is None or fut.done():
            return
        if "pid" in doc:
            fut.set_result(int(doc["pid"]))
        else:
            fut.set_exception(UserError(f"zygote: {doc.get('error', doc)}"))

    async def spawn(self, spec_json: str, log_path: Path | None) -> ForkedProcess:
        """Fork a service for `spec_json`, its stderr appended to `log_path`."""
        if self.gone is not None:
            raise UserError(self.gone)
        loop = asyncio.get_running_loop()
        self._refs += 1
        ref = self._refs
        fut: asyncio.Future[int] = loop.create_future()
        self._asked[ref] = fut
        read_fd, write_fd = os.pipe()
        try:
            msg = json.dumps({"ref": ref, "spec": spec_json, "log": str(log_path or "")})
            socket.send_fds(self.sock, [msg.encode()], [write_fd])
        except OSError as exc:
            os.close(read_fd)
            self._asked.pop(ref, None)
            raise UserError(f"zygote: cannot ask for a service: {exc}") from None
        finally:
            os.close(write_fd)
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", 0)
        )
        pid = await fut
        proc = ForkedProcess(pid, reader)
        if pid in self._early:
            proc._exit(self._early.pop(pid))
        else:
            self._procs[pid] = proc
        return proc

    async def aclose(self) -> None:
        """Close the socket (the zygote leaves) and wait for it; killed after STOP_S."""
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        try:
            await asyncio.wait_for(asyncio.to_thread(self.proc.wait), STOP_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await asyncio.to_thread(self.proc.wait)
        if self.log_path is not None:
            with contextlib.suppress(OSError):
                if self.log_path.stat().st_size == 0:
                    self.log_path.unlink()
