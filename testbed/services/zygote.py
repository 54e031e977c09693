"""The service zygote: one process that has imported every role's app and forks a service per
request, so a deployment's services start in milliseconds instead of an interpreter each.

Why: a service spends about 0.7-0.9 CPU s importing its role's modules (aiohttp, pydantic,
numpy, the apps) before it binds anything; a short live run stands up seven of them, so on two
cores start-up cost 4-5 s of wall time in every run, and the test suite pays it about seventy
times. Importing once and forking is the classic answer (Android's zygote, multiprocessing's
forkserver, gunicorn's preload); the runner keeps one zygote per process
(testbed.substrate.zygote), so a test session imports the apps once and `testbed run` once
instead of once per service.

Protocol, on a SOCK_SEQPACKET socket given as stdin (one message a datagram, no framing):
- the runner sends `{"ref": N, "spec": SPEC_JSON, "log": PATH or ""}` with one descriptor
  attached, the write end of the pipe the service's stdout goes to (its READY line);
- the zygote forks, answers `{"ref": N, "pid": PID}` (or `{"ref": N, "error": "..."}`) and,
  whenever a child ends, `{"exit": PID, "code": C}` (C as subprocess gives it: negative for a
  signal). It is the children's parent, so it is the one that can reap them and read the code.

The zygote never starts an event loop or a thread (a fork copies only the calling thread, and a
loop's state would be shared by every child): it waits with `selectors`, SIGCHLD waking it
through a pipe. It dies with its runner (testbed.lifeline) and exits when the runner closes the
socket; each child dies with the zygote, so a killed runner leaves no service behind. A child
starts its own session (a Ctrl-C at the terminal reaches the runner only), appends its stderr to
its log, names itself `testbed-ROLE` (as ps and pgrep show it), and runs what `python -m
testbed.services.host SPEC` runs (services.host.run). Scenarios on the torch engine fork too:
torch is imported by the child's app, never here.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import selectors
import signal
import socket
import sys
from typing import Any, NoReturn

from testbed.lifeline import arm_death_with, die_with_parent, set_name

__all__ = ["main"]

ROLES = ("router", "pd", "prefill", "decode")
MAX_MESSAGE = 1 << 20
"""Bytes of one request: a spec is a few KB (a router's with a large deployment, tens)."""


def _send(sock: socket.socket, doc: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the runner is gone: we exit at the next read
        sock.send(json.dumps(doc).encode())


def _child(sock: socket.socket, wake: tuple[int, int], doc: dict[str, Any], out: int) -> NoReturn:
    """In the forked child: become the service `doc` describes."""
    from testbed.services import host

    zygote = os.getppid()
    try:
        sock.close()
        for fd in wake:
            os.close(fd)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        arm_death_with(zygote)
        os.dup2(out, 1)
        os.close(out)
        if doc.get("log"):
            fd = os.open(doc["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.dup2(fd, 2)
            os.close(fd)
        spec = host.load_spec(doc["spec"])
        set_name(f"testbed-{spec.role}")  # ps shows the role, not the zygote's command
    except BaseException as exc:  # reported on stderr: exit code 1
        print(f"zygote: cannot start the service: {exc}", file=sys.stderr, flush=True)
        os._exit(1)
    host.run(spec)


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def serve(sock: socket.socket) -> None:
    """Fork a service per request until the runner closes the socket."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd is written
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ, "request")
    sel.register(wake_r, selectors.EVENT_READ, "child")
    gc.freeze()  # what is here now is shared with every child: keep the collector off it
    while True:
        for key, _ in sel.select():
            if key.data == "child":
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
                _reap(sock)
                continue
            try:
                data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, 1)
            except OSError:
                return
            if not data:
                return
            ref = None
            try:
                doc = json.loads(data)
                ref = doc["ref"]
                if len(fds) != 1:
                    raise ValueError(f"expected one descriptor, got {len(fds)}")
            except (ValueError, KeyError, TypeError) as exc:
                for fd in fds:
                    os.close(fd)
                _send(sock, {"ref": ref, "error": f"bad request: {exc}"})  # its asker fails
                continue
            try:
                pid = os.fork()
            except OSError as exc:
                os.close(fds[0])
                _send(sock, {"ref": ref, "error": f"fork failed: {exc}"})
                continue
            if pid == 0:
                _child(sock, (wake_r, wake_w), doc, fds[0])
            os.close(fds[0])
            _send(sock, {"ref": ref, "pid": pid})
            _reap(sock)  # a child that died at once


def main() -> int:
    die_with_parent()  # the runner named itself in the environment (testbed.lifeline)
    from testbed.services import host

    for role in ROLES:
        host.app_factory(role)  # the imports every child would otherwise pay for
    sock = socket.socket(fileno=os.dup(0))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # a child's stdin is nothing, as a spawned service's is
    os.close(devnull)
    serve(sock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
