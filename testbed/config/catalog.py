"""Which fields of a configuration model need a unit: the list docs/scenarios.md shows.

Walking the models rather than keeping the list by hand means a new duration or bandwidth field
appears in the docs' check (tests/config/test_units_strict.py) the day it is added.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, get_args, get_origin

from pydantic import BaseModel

from testbed.config.base import UNIT_KINDS
from testbed.config.suggest import members

__all__ = ["unit_fields"]


def _kind(metadata: list[Any]) -> str | None:
    for m in metadata:
        for validator, kind in UNIT_KINDS:
            if m is validator:
                return kind
    return None


def _walk(tp: Any, prefix: str, seen: frozenset[type]) -> Iterator[tuple[str, str]]:
    for m in members(tp):
        origin = get_origin(m)
        if isinstance(m, type) and issubclass(m, BaseModel):
            if m in seen:
                continue
            for name, f in m.model_fields.items():
                path = f"{prefix}.{f.alias or name}" if prefix else f.alias or name
                kind = _kind(list(f.metadata))
                if kind is None:  # `Duration | None`, or a unit type or a literal ("auto")
                    for alt in get_args(f.annotation):
                        kind = kind or _kind(list(getattr(alt, "__metadata__", ())))
                if kind is not None:
                    yield path, kind
                else:
                    yield from _walk(f.annotation, path, seen | {m})
        elif origin in (list, tuple, set, frozenset):
            for arg in get_args(m)[:1]:
                yield from _walk(arg, f"{prefix}[]", seen)
        elif origin is dict and len(get_args(m)) == 2:
            yield from _walk(get_args(m)[1], f"{prefix}.*", seen)


def unit_fields(model: type[BaseModel]) -> dict[str, str]:
    """Dotted path (`*` for a mapping's keys, `[]` for a list's entries) -> "duration", "size" or
    "bandwidth", for every field of `model` that refuses a bare number in a file."""
    return dict(sorted(_walk(model, "", frozenset())))
