"""Run one service process: serve its aiohttp app, announce the bound ports, stop on SIGTERM.

The parent learns the ports from one JSON line on stdout ("READY {...}"), so services can bind
port 0 and never race each other for ports.

The local substrate does not start this module once per service: it forks each service from
a zygote that imported every role's app once (testbed.services.zygote), whose child runs `run`
below, exactly what this entry point runs. Compose's containers, and anyone starting a service
by hand, use the entry point.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import NoReturn

from aiohttp import web
from pydantic import TypeAdapter

from testbed.config.profiles import ProfileFile, register_profile
from testbed.lifeline import die_with_parent
from testbed.services.spec import ServiceSpec
from testbed.serving import DEFAULT_LIMITS, ServingLimits, start_http

__all__ = ["app_factory", "load_spec", "main", "run", "serve"]

SERVICE_LIMITS = dataclasses.replace(DEFAULT_LIMITS, handler_cancellation=True)
"""The services' server limits: handler cancellation on, so a peer that closes its connection
cancels its handler and the work for a departed client (a queued prefill, a decode slot) stops
instead of running on (testbed.services.prefill_queue.run_job)."""

SHUTDOWN_S = 1.0
"""Seconds a stopping service lets open requests finish before cancelling them. The runner
stops services only once it has what it needs from them (or is giving up), so a long wait only
delays the run's end and, past the runner's grace, turns a clean exit into a SIGKILL."""

AppFactory = Callable[[ServiceSpec], Awaitable[tuple[web.Application, dict[str, int]]]]


async def serve(
    spec: ServiceSpec, factory: AppFactory, limits: ServingLimits = SERVICE_LIMITS
) -> None:
    app, extra_ports = await factory(spec)
    # testbed.serving: connection cap and request read deadlines (slow or stuck clients)
    http = await start_http(
        app,
        host=spec.host,
        port=spec.port,
        limits=limits,
        backlog=1024,
        name=spec.role,
        shutdown_timeout=SHUTDOWN_S,
    )
    port = http.port
    print("READY " + json.dumps({"http": port, **extra_ports}), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await http.close()


def app_factory(role: str) -> AppFactory:
    """The app of a role; prefill and decode pick their engine from the spec
    (services.engines)."""
    if role == "router":
        from testbed.services.router import create_app as router_app

        return router_app
    if role == "pd":
        from testbed.services.pd import create_app as pd_app

        return pd_app
    if role == "prefill":
        from testbed.services.prefill import create_app as prefill_app

        return prefill_app
    from testbed.services.decode import create_app as decode_app

    return decode_app


def load_spec(text: str) -> ServiceSpec:
    """The service's spec, with the scenario's own profiles registered before anything looks a
    model or hardware up by name: the profiles first, since validating the rest of the spec
    (the router's scheduler section names the deployment's model and hardware) looks them up."""
    raw = json.loads(text)
    docs = raw.get("profiles") if isinstance(raw, dict) else None
    for doc in TypeAdapter(list[ProfileFile]).validate_python(docs or []):
        register_profile(doc)
    return ServiceSpec.model_validate(raw)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m testbed.services.host SPEC_JSON", file=sys.stderr)
        return 2
    spec = load_spec(args[0])
    die_with_parent()  # started by a runner: never outlive it (testbed.lifeline)
    run(spec)


def run(spec: ServiceSpec) -> NoReturn:
    """Serve `spec` until SIGTERM or SIGINT, then leave (`_exit_now`)."""
    try:
        import uvloop

        runner: Callable[..., object] = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        runner = asyncio.run
    with contextlib.suppress(KeyboardInterrupt):
        runner(serve(spec, app_factory(spec.role)))
    _exit_now()


def _exit_now() -> NoReturn:
    """Exit without the interpreter's teardown. Freeing a service's heap object by object took
    0.9 s of every worker's stop in burst's short run (the stop itself: 10 ms), paid at the end of
    every run; a service has nothing left to write (the runner writes the results), so its
    streams are flushed and it leaves. Coverage, when it measures this process, is saved first."""
    cov = sys.modules.get("coverage")
    current = getattr(getattr(cov, "Coverage", None), "current", None)
    if current is not None and (measuring := current()) is not None:
        measuring.stop()
        measuring.save()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
