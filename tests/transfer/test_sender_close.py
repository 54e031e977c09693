"""A KV sender closes even when the cancel reaches its reconnect loop disguised: uvloop's connect
may answer a cancel with an OSError, which the loop took for a refused connection, slept its
backoff and retried forever (a prefill then outlived its SIGTERM until the runner's SIGKILL)."""

from __future__ import annotations

import asyncio

import pytest

from testbed.transfer.sender import slots
from testbed.transfer.sender.api import KVSender

pytestmark = pytest.mark.timeout(30)


async def test_a_cancel_turned_into_an_oserror_still_stops_the_sender(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    connecting = asyncio.Event()

    async def connect_that_hides_its_cancel(*_args: object, **_kw: object) -> object:
        connecting.set()
        try:
            await asyncio.Event().wait()  # a connect that never completes ...
        except asyncio.CancelledError:
            raise OSError(125, "Operation canceled") from None  # ... and hides the cancel
        raise AssertionError("unreachable")

    monkeypatch.setattr(slots.asyncio, "open_connection", connect_that_hides_its_cancel)
    sender = KVSender("127.0.0.1", 9, connections=2, connect_timeout=60)
    await sender.start()
    await asyncio.wait_for(connecting.wait(), 10)
    # before the fix the slots caught the OSError, slept their backoff and connected again:
    # aclose never returned
    await asyncio.wait_for(sender.aclose(flush_timeout=0.0), 10)
