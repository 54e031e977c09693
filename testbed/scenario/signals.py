"""The signals that end a live run (`testbed run`) or a standing deployment (`testbed up`)
cleanly, and the one way both install their handler.

The first SIGINT, SIGTERM or SIGHUP calls the caller's `on_stop` (stop submitting or serving,
fail or drain what is in flight, then write every file); a second one raises KeyboardInterrupt
so that a user who insists is not kept waiting for the drain. The handlers stay installed until
the block ends, so a signal while the results are written counts as the second.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator

__all__ = ["STOP_SIGNALS", "stop_signals"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Signals that end a run early but cleanly: stop submitting, fail in-flight, write everything."""


@contextlib.contextmanager
def stop_signals(on_stop: Callable[[int], None]) -> Iterator[None]:
    """Within the block, the first stop signal calls `on_stop(signum)` on the running loop and
    the next raises KeyboardInterrupt. Where the loop cannot take signal handlers (not the main
    thread, Windows) nothing is installed."""
    loop = asyncio.get_running_loop()
    seen = False

    def handler(sig: int) -> None:
        nonlocal seen
        if seen:  # a second signal: stop waiting for anything
            raise KeyboardInterrupt
        seen = True
        on_stop(sig)

    installed = []
    for sig in STOP_SIGNALS:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, handler, int(sig))
            installed.append(sig)
    try:
        yield
    finally:
        for sig in installed:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
