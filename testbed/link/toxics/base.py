"""The one interface every toxic implements, and the wrapper that names it on a proxy.

A toxic is a small class: its type name, its attributes (with types and limits, checked before
anything changes) and `pipe(stub)`, a coroutine that moves chunks from `stub.recv()` to
`stub.send()` for one direction of one connection, exactly like a Toxiproxy toxic's Pipe. Adding
a fault type means adding one module under testbed/link/toxics/ and one line in the registry.

Attributes use Toxiproxy's units (milliseconds, KB/s with 1 KB = 1000 bytes, bytes,
microseconds for slicer delay) so any Toxiproxy client can drive them unchanged.
"""

from __future__ import annotations

import abc
import asyncio
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from testbed.link.errors import ApiError, bad_request, show

if TYPE_CHECKING:
    from testbed.link.pipeline import Stub

__all__ = ["STREAMS", "Attr", "Toxic", "ToxicWrapper", "directions_of"]

# Toxiproxy's two streams, plus "both" (extension): one toxic applied to each direction.
STREAMS = ("upstream", "downstream", "both")


def directions_of(stream: str) -> tuple[str, ...]:
    return ("upstream", "downstream") if stream == "both" else (stream,)


@dataclass(frozen=True)
class Attr:
    """A toxic attribute: JSON kind ("int", "float", "bool", "str", "list"), default, limits."""

    name: str
    kind: str
    default: Any
    doc: str
    minimum: float | None = None
    positive: bool = False


# Integers fit Go's int64, as in Toxiproxy (the API's JSON decoder already refuses larger ones;
# this also covers callers in Python and integral floats such as 1e300).
INT_MAX = 2**63 - 1

_KIND_WORDS = {
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "str": "a string",
    "list": "a list",
}


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _coerce(type_name: str, attr: Attr, value: object) -> object:
    """Check one attribute value against its spec; the error names the toxic and attribute."""
    where = f"attribute {attr.name!r} of a {type_name} toxic"
    ok: object
    if attr.kind == "int":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad_request(f"{where} must be {_KIND_WORDS['int']}, got {_json_type(value)}")
        if isinstance(value, float):
            if not (math.isfinite(value) and value.is_integer()):
                raise bad_request(f"{where} must be an integer, got {show(value)}")
            value = int(value)
        if abs(value) > INT_MAX:
            raise bad_request(f"{where} is out of range (it must fit in 64 bits)")
        ok = value
    elif attr.kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad_request(f"{where} must be {_KIND_WORDS['float']}, got {_json_type(value)}")
        try:
            finite = math.isfinite(value)
        except OverflowError:  # an int too large for a float
            finite = False
        if not finite:
            raise bad_request(f"{where} must be a finite number")
        ok = value
    elif attr.kind == "bool":
        if not isinstance(value, bool):
            raise bad_request(f"{where} must be true or false, got {_json_type(value)}")
        ok = value
    elif attr.kind == "str":
        if not isinstance(value, str):
            raise bad_request(f"{where} must be a string, got {_json_type(value)}")
        ok = value
    elif attr.kind == "list":
        if not isinstance(value, list):
            raise bad_request(f"{where} must be a list, got {_json_type(value)}")
        ok = value
    else:  # pragma: no cover - a programming error in a toxic's spec
        raise AssertionError(attr.kind)
    if isinstance(ok, int | float) and not isinstance(ok, bool):
        if attr.positive and ok <= 0:
            raise bad_request(f"{where} must be greater than 0, got {show(ok)}")
        if attr.minimum is not None and ok < attr.minimum:
            raise bad_request(f"{where} must be at least {attr.minimum:g}, got {show(ok)}")
    return ok


class Toxic(abc.ABC):
    """A fault applied to one direction of every connection of a proxy.

    Instances are immutable configurations: an update builds a new instance and the running
    stages are pointed at it. Per-connection state lives on the stub (`new_state`); state shared
    by all connections of a proxy (extension toxics) is handed over in `activate`.
    """

    type_name: ClassVar[str]
    attrs: ClassVar[tuple[Attr, ...]]
    # Toxiproxy's CleanupToxic: removing the toxic closes the connections it was holding.
    closes_on_removal: ClassVar[bool] = False
    # Attribute updates reach running stages without interrupting them.
    live_update: ClassVar[bool] = False
    # Not part of Toxiproxy (documented as an extension in docs/link.md).
    extension: ClassVar[bool] = False
    # State shared by every proxy of one emulator (set before `activate`); extension toxics
    # that span proxies (a link_bandwidth `group`) keep theirs here.
    shared: dict[Any, Any] | None = None

    def __init__(self, values: Mapping[str, Any]) -> None:
        self.values: dict[str, Any] = dict(values)
        self.configure()

    @classmethod
    def from_attributes(cls, raw: object, base: Mapping[str, Any] | None = None) -> Toxic:
        """Validate JSON attributes, on top of `base` (an update) or the defaults (a create)."""
        return cls(cls.validate(raw, base))

    @classmethod
    async def build(cls, raw: object, base: Mapping[str, Any] | None = None) -> Toxic:
        """from_attributes for the API: a toxic that needs I/O to configure (a file to read)
        overrides this to do it without blocking the event loop."""
        return cls.from_attributes(raw, base)

    @classmethod
    def validate(cls, raw: object, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The attribute values `raw` (JSON) gives, on top of `base` or the defaults."""
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise bad_request(f"attributes must be an object, got {_json_type(raw)}")
        known = {a.name: a for a in cls.attrs}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise bad_request(
                f"unknown attribute(s) {', '.join(map(repr, unknown))} for a {cls.type_name} "
                f"toxic; known: {', '.join(known) or 'none'}"
            )
        values = dict(base) if base is not None else {a.name: a.default for a in cls.attrs}
        for name, value in raw.items():
            values[name] = _coerce(cls.type_name, known[name], value)
        return values

    def configure(self) -> None:  # noqa: B027 - optional hook
        """Read `self.values` into typed fields; raise ApiError(400) on inconsistent values."""

    def attributes_json(self) -> dict[str, Any]:
        return dict(self.values)

    def new_state(self) -> Any:
        """Per-connection state (Toxiproxy's StatefulToxic); kept across updates."""
        return None

    def activate(  # noqa: B027 - optional hook
        self, loop: asyncio.AbstractEventLoop, previous: Toxic | None
    ) -> None:
        """Called when this configuration takes effect (`previous` is the one it replaces)."""

    def deactivate(self) -> None:  # noqa: B027 - optional hook
        """Called when this configuration is replaced or removed."""

    @abc.abstractmethod
    async def pipe(self, stub: Stub) -> None:
        """Move chunks from stub.recv() to stub.send() until an End passes or the link closes."""


@dataclass
class ToxicWrapper:
    """A toxic as the API knows it: name, type, stream, toxicity and its attributes."""

    name: str
    type: str
    stream: str
    toxicity: float
    toxic: Toxic

    @property
    def directions(self) -> tuple[str, ...]:
        return directions_of(self.stream)

    def to_json(self) -> dict[str, Any]:
        return {
            "attributes": self.toxic.attributes_json(),
            "name": self.name,
            "type": self.type,
            "stream": self.stream,
            "toxicity": self.toxicity,
        }


def invalid_toxic_type() -> ApiError:
    return ApiError("invalid toxic type", 400)
