"""Moved to testbed.dispatch.rules (the dispatch core's constants); kept for the imports that
have not moved yet."""

from testbed.dispatch.rules import (
    HEALTH_INTERVAL_S,
    MAX_ATTEMPTS,
    NO_ROUTE_WAIT_S,
    REGISTER_TIMEOUT_S,
)

__all__ = ["HEALTH_INTERVAL_S", "MAX_ATTEMPTS", "NO_ROUTE_WAIT_S", "REGISTER_TIMEOUT_S"]
