"""Child processes die with the runner that started them.

The local substrate starts every service (and the link emulator) in its own session, so a
Ctrl-C at the terminal reaches only the runner, which then stops them in order. But a runner that
is killed outright (SIGKILL, an OOM kill, a crash of the interpreter) cannot stop anything, and
its services used to live on under PID 1, holding ports and CPU. So each child asks the kernel to
kill it when its parent dies (Linux `prctl(PR_SET_PDEATHSIG)`), and checks that the parent it was
started by is still its parent (the runner may have died between fork and prctl).

SIGKILL, not SIGTERM: a service the nemesis paused (SIGSTOP) would never act on a SIGTERM, and
a service has nothing of the run's to save; the runner writes every result.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

__all__ = ["PARENT_PID_ENV", "arm_death_with", "child_env", "die_with_parent", "set_name"]

PARENT_PID_ENV = "TESTBED_PARENT_PID"
"""Set by the runner in a child's environment: the pid the child must outlive no longer than."""

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """An environment for a child process that should die with this process."""
    return {**(os.environ if env is None else env), PARENT_PID_ENV: str(os.getpid())}


def die_with_parent() -> bool:
    """Arrange to be killed when the parent named in the environment dies; True if armed.

    Does nothing outside Linux or when the variable is absent (a service started by hand).
    """
    expected = os.environ.pop(PARENT_PID_ENV, None)  # not inherited by our own children
    if expected is None or not sys.platform.startswith("linux"):
        return False
    return arm_death_with(int(expected))


def arm_death_with(parent: int) -> bool:
    """Be killed when `parent`, this process's parent, dies (a child forked by the service
    zygote arms it itself: testbed.services.zygote); True if armed."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        return False
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGKILL)
    return True


def set_name(name: str) -> None:
    """Name this process as `ps`, `top` and `pgrep` show it (Linux's 15-byte command name): a
    service forked by the zygote would otherwise show as the zygote."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
