"""The building blocks of every configuration model: unit-typed fields and the strict base model.

Every quantity a person writes carries its unit ("100Gbps", "25ms", "19.4K"); these field types
turn them into SI floats at the boundary so nothing downstream handles strings. Unknown fields are
errors (a typo must not silently fall back to a default): every model derives from `StrictModel`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from testbed.units import parse_bandwidth, parse_duration, parse_size, parse_tokens

__all__ = [
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


def _non_negative(v: float) -> float:
    if v < 0:
        raise ValueError("must not be negative")
    return v


Bandwidth = Annotated[float, BeforeValidator(parse_bandwidth), AfterValidator(_positive)]
Size = Annotated[float, BeforeValidator(parse_size), AfterValidator(_non_negative)]
Duration = Annotated[float, BeforeValidator(parse_duration), AfterValidator(_non_negative)]
PositiveDuration = Annotated[float, BeforeValidator(parse_duration), AfterValidator(_positive)]
Tokens = Annotated[float, BeforeValidator(parse_tokens), AfterValidator(_positive)]


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
