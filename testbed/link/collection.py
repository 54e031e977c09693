"""The toxics of one proxy: validate API input, keep the chain order, apply changes live.

Every change is validated completely before anything is touched, so a rejected call (bad type,
bad attribute, duplicate name) leaves the proxy and its open connections exactly as they were.
Accepted changes reach every open connection at once: a new toxic is appended to each matching
direction, an update is swapped in, a removal drains and unlinks the stage.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterable
from typing import Any

from testbed.link.errors import (
    ApiError,
    bad_request,
    show,
    too_many,
    toxic_exists,
    toxic_not_found,
)
from testbed.link.pipeline import ToxicLink
from testbed.link.toxics import REGISTRY, STREAMS, ToxicWrapper
from testbed.link.toxics.base import invalid_toxic_type

__all__ = ["MAX_TOXICS", "ToxicCollection"]

MAX_TOXICS = 64
"""Toxics one proxy holds at most (Toxiproxy has no cap). Every toxic is a stage on every open
connection of its direction, run on each chunk; a deployment's proxy has three (a shared cap and
latency each way) and the nemeses add one or two at a time."""


def _field(body: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    value = body.get(key, default)
    if value is None:
        return default
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad_request(f"field {key!r} must be a number, got {show(value)}")
        try:
            return float(value)
        except OverflowError:  # an int too large for a float
            raise bad_request(f"field {key!r} is out of range") from None
    if not isinstance(value, kind):
        raise bad_request(f"field {key!r} must be a {kind.__name__}, got {show(value)}")
    return value


def _toxicity(value: float) -> float:
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise bad_request(f"field 'toxicity' must be between 0 and 1, got {show(value)}")
    return value


class ToxicCollection:
    """Toxics of one proxy in creation order (the order they are chained in)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        links: Callable[[], Iterable[ToxicLink]],
        shared: dict[Any, Any] | None = None,
    ) -> None:
        self._loop = loop
        self._links = links
        self._shared = {} if shared is None else shared
        self._toxics: list[ToxicWrapper] = []

    def __iter__(self) -> Any:
        return iter(list(self._toxics))

    def chain(self, direction: str) -> list[ToxicWrapper]:
        return [w for w in self._toxics if direction in w.directions]

    def to_json(self) -> list[dict[str, Any]]:
        # Toxiproxy lists the upstream chain, then the downstream chain.
        order = {"upstream": 0, "downstream": 1, "both": 2}
        return [w.to_json() for w in sorted(self._toxics, key=lambda w: order[w.stream])]

    def get(self, name: str) -> ToxicWrapper:
        for w in self._toxics:
            if w.name == name:
                return w
        raise toxic_not_found()

    # -- changes ---------------------------------------------------------------------------
    async def add(self, body: object) -> ToxicWrapper:
        if not isinstance(body, dict):
            raise bad_request("expected a JSON object for a toxic")
        type_name = _field(body, "type", str, "")
        stream = _field(body, "stream", str, "downstream")
        name = _field(body, "name", str, "")
        toxicity = _field(body, "toxicity", float, 1.0)
        if stream not in STREAMS:
            raise ApiError(
                "stream was invalid, can be either upstream or downstream (or both)", 400
            )
        if not name:
            name = f"{type_name}_{stream}"
        cls = REGISTRY.get(type_name)
        if cls is None:
            raise invalid_toxic_type()
        if any(w.name == name for w in self._toxics):
            raise toxic_exists()
        if len(self._toxics) >= MAX_TOXICS:
            raise too_many("toxics on this proxy", MAX_TOXICS)
        toxic = await cls.build(body.get("attributes"))
        wrapper = ToxicWrapper(name, type_name, stream, _toxicity(toxicity), toxic)
        toxic.shared = self._shared
        toxic.activate(self._loop, None)
        self._toxics.append(wrapper)
        for link in self._links():
            if link.direction in wrapper.directions and not link.done:
                link.add_toxic(wrapper)
        return wrapper

    async def update(self, name: str, body: object) -> ToxicWrapper:
        wrapper = self.get(name)
        if not isinstance(body, dict):
            raise bad_request("expected a JSON object for a toxic")
        toxicity = _toxicity(_field(body, "toxicity", float, wrapper.toxicity))
        old = wrapper.toxic
        new = await type(old).build(body.get("attributes"), base=old.values)
        restart = not (type(old).live_update and toxicity == wrapper.toxicity)
        new.shared = self._shared
        new.activate(self._loop, old)
        old.deactivate()
        wrapper.toxic = new
        wrapper.toxicity = toxicity
        for link in self._links():
            stage = link.find(wrapper)
            if stage is not None:
                stage.update(wrapper, restart)
        return wrapper

    def remove(self, name: str) -> None:
        wrapper = self.get(name)
        self._toxics.remove(wrapper)
        wrapper.toxic.deactivate()
        for link in self._links():
            stage = link.find(wrapper)
            if stage is not None:
                stage.remove()

    def reset(self) -> None:
        for w in list(self._toxics):
            self.remove(w.name)
