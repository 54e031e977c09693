"""The building blocks of every configuration model: unit-typed fields and the strict base model.

Every quantity a person writes carries its unit ("100Gbps", "25ms", "19.4K"); these field types
turn them into SI floats at the boundary so nothing downstream handles strings. Unknown fields are
errors (a typo must not silently fall back to a default): every model derives from `StrictModel`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
)

from testbed.config.limits import MAX_TOKENS
from testbed.units import parse_bandwidth, parse_duration, parse_size, parse_tokens

__all__ = [
    "STRICT_UNITS",
    "UNIT_KINDS",
    "Bandwidth",
    "Duration",
    "PositiveDuration",
    "Size",
    "StrictModel",
    "Tokens",
    "literal_values",
    "tagged_union",
]


def _positive(v: float) -> float:
    if v <= 0:
        raise ValueError("must be greater than zero")
    return v


def _token_count(v: float) -> float:
    if not 0 < v <= MAX_TOKENS:
        raise ValueError(f"must be above 0 and at most {MAX_TOKENS:,} tokens, got {v:g}")
    return v


def _non_negative(v: float) -> float:
    if v < 0:
        raise ValueError("must not be negative")
    return v


STRICT_UNITS = {"strict_units": True}
"""Validation context for what a person wrote (a YAML file): a duration, size or bandwidth must
carry its unit. Python callers validate without it and pass SI numbers, as units.py says."""


def _unitless(value: object) -> bool:
    """A non-zero number with no unit: `rtt: 10` (10 s? 10 ms?) or `bandwidth: 100` (bytes/s?).
    Zero needs no unit; it reads the same in all of them."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return value != 0
    if isinstance(value, str):
        try:
            return float(value) != 0
        except ValueError:
            return False
    return False


def _with_unit(parse: Callable[[object], float], kind: str, example: str) -> Any:
    """`parse`, refusing a bare number when the value comes from a file (STRICT_UNITS)."""

    def validate(value: object, info: ValidationInfo) -> float:
        ctx = info.context
        if isinstance(ctx, dict) and ctx.get("strict_units") and _unitless(value):
            raise ValueError(f"{value!r} has no unit; write the {kind} with one, like {example}")
        return parse(value)

    return BeforeValidator(validate)


_BANDWIDTH = _with_unit(parse_bandwidth, "bandwidth", '"100Gbps" or "12.5MB/s"')
_SIZE = _with_unit(parse_size, "size", '"701.3MiB" or "64KB"')
_DURATION = _with_unit(parse_duration, "duration", '"25ms" or "10s"')

UNIT_KINDS: tuple[tuple[object, str], ...] = (
    (_BANDWIDTH, "bandwidth"),
    (_SIZE, "size"),
    (_DURATION, "duration"),
)
"""Each unit validator and the kind of quantity it reads (testbed.config.catalog lists them)."""

Bandwidth = Annotated[float, _BANDWIDTH, AfterValidator(_positive)]
Size = Annotated[float, _SIZE, AfterValidator(_non_negative)]
Duration = Annotated[float, _DURATION, AfterValidator(_non_negative)]
PositiveDuration = Annotated[float, _DURATION, AfterValidator(_positive)]
Tokens = Annotated[float, BeforeValidator(parse_tokens), AfterValidator(_token_count)]
"""Token counts may stay bare ("1024") or use K/M: a token is its own unit. At most
MAX_TOKENS (testbed.config.limits)."""


class StrictModel(BaseModel):
    """Frozen, and unknown fields are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def literal_values(model: type[BaseModel], field: str) -> tuple[str, ...]:
    """The values a model's `Literal[...]` field admits: the tags it answers to in a union."""
    annotation = model.model_fields[field].annotation
    if get_origin(annotation) is not Literal:
        raise TypeError(f"{model.__qualname__}.{field} must be a Literal[...] (the union's tag)")
    return tuple(str(v) for v in get_args(annotation))


def tagged_union(members: Sequence[type[BaseModel]], tag: str) -> Any:
    """`Annotated[A | B | ..., Field(discriminator=tag)]` from a list of models known only at
    run time (a registry's), as `LengthsConfig` is written out by hand."""
    if not members:
        raise ValueError(f"a union tagged by {tag!r} needs at least one member")
    if len(members) == 1:
        return members[0]
    return Annotated[Union[tuple(members)], Field(discriminator=tag)]  # noqa: UP007
