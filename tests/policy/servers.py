"""Policy services for the tests: the example scheduler (examples/least-ttft) and a toy that
answers whatever a test tells it, each on 127.0.0.1 in a thread of its own (so the blocking
client of the sim and the aiohttp client of the live router can both talk to it)."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aiohttp import web

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "least-ttft"
if str(EXAMPLE) not in sys.path:  # the example is its own package; tests use it from the tree
    sys.path.insert(0, str(EXAMPLE))

START_TIMEOUT_S = 10.0
PROMPT = "timeout=10s"
"""The policy spec's deadline fragment for a service that answers at once, in tests that assert
how each decision was read (by the policy, or a fallback for its status) or that its feedback
post arrived: long enough that neither reads "late" while the fast suite's other xdist worker
holds the second core (seen at 1 s), and a deadline changes only what a stall is read as."""


class Replay:
    """A service that answers every decision with `status` and `body`, after `delay_s`."""

    def __init__(self, status: int = 200, body: str = "{}", delay_s: float = 0.0) -> None:
        self.status, self.body, self.delay_s = status, body, delay_s
        self.seen: list[dict[str, Any]] = []
        self.feedback: list[dict[str, Any]] = []

    async def route(self, request: web.Request) -> web.Response:
        self.seen.append(await request.json())
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return web.Response(status=self.status, text=self.body, content_type="application/json")

    async def on_feedback(self, request: web.Request) -> web.Response:
        self.feedback.append(await request.json())
        return web.json_response({})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/route", self.route)
        app.router.add_post("/feedback", self.on_feedback)
        return app


def example_app(delay_s: float = 0.0) -> web.Application:
    from least_ttft.server import make_app

    return make_app(delay_s)


@contextmanager
def serve(app: web.Application) -> Iterator[str]:
    """Serve `app` on 127.0.0.1 (a free port) in a thread; yields its base URL."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def start() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        box["runner"] = runner
        box["port"] = runner.addresses[0][1]
        ready.set()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        loop.run_forever()

    t = threading.Thread(target=run, name="policy-service", daemon=True)
    t.start()
    if not ready.wait(START_TIMEOUT_S):
        raise RuntimeError("the test's policy service did not start")
    try:
        yield f"http://127.0.0.1:{box['port']}"
    finally:
        fut = asyncio.run_coroutine_threadsafe(box["runner"].cleanup(), loop)
        fut.result(timeout=START_TIMEOUT_S)
        loop.call_soon_threadsafe(loop.stop)
        t.join(timeout=START_TIMEOUT_S)
        loop.close()


def _service_key() -> object:
    from least_ttft.server import SERVICE

    return SERVICE


SERVICE_KEY: Any = _service_key()
"""`app[SERVICE_KEY]` is the example service's state (its mirrors, its decision count)."""
