"""The dispatch constants the live router and the sim share.

`services.router.dispatch` (the live router) and `sim.dispatch` (the sim's) follow the same
rules: so many attempts per request, a health poll every so often, a wait for an instance to
come back, a wait for a decode instance to register. They live here, in a module that imports
nothing, so the sim reads them without importing the live router (which pulls in aiohttp and the
whole serving stack: about a CPU second of start-up that a simulated run never uses).
"""

from __future__ import annotations

from typing import Final

__all__ = ["HEALTH_INTERVAL_S", "MAX_ATTEMPTS", "NO_ROUTE_WAIT_S", "REGISTER_TIMEOUT_S"]

MAX_ATTEMPTS: Final = 3
"""Dispatch attempts per request before it fails with every attempt's reason."""
HEALTH_INTERVAL_S: Final = 0.5
"""Wall seconds between the router's health checks of an instance it took out of rotation."""
NO_ROUTE_WAIT_S: Final = 10.0
"""Wall seconds a request waits for an instance to come back when none can take it."""
REGISTER_TIMEOUT_S: Final = 10.0
"""Wall seconds the router waits for a decode instance to register a request (or a pull) before
it gives the attempt up: registering is one HTTP round trip, so only a paused or wedged
instance takes that long."""
