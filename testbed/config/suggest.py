"""The closest known field to a misspelt one, for "unknown field 'bandwith'; did you mean
'bandwidth'?".

A typo is the commonest config error there is, and "unknown field" alone sends a person to the
docs to find the spelling. The models already know every field at every place in a file, so the
suggestion follows the error's location down the model's types (nested models, lists, dicts,
optional fields and tagged unions) and compares only with the fields that are valid there.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

__all__ = ["closest_field", "fields_at", "members"]


def members(tp: Any) -> list[Any]:
    """The alternatives of a type, with Annotated and Optional peeled off."""
    origin = get_origin(tp)
    if origin is Annotated:
        return members(get_args(tp)[0])
    if origin is Union or origin is UnionType:
        return [m for a in get_args(tp) for m in members(a) if m is not type(None)]
    return [tp]


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _tag_values(model: type[BaseModel]) -> set[str]:
    """Values of the model's Literal fields: what a tagged union's error locations name it by."""
    out: set[str] = set()
    for f in model.model_fields.values():
        if get_origin(f.annotation) is Literal:
            out.update(str(v) for v in get_args(f.annotation))
    return out


def _step(types: list[Any], part: int | str) -> list[Any]:
    """The types found one location part further down."""
    out: list[Any] = []
    for tp in types:
        for m in members(tp):
            origin = get_origin(m)
            if _is_model(m) and isinstance(part, str):
                field = m.model_fields.get(part)
                if field is None:  # by alias
                    field = next(
                        (f for f in m.model_fields.values() if f.alias == part),
                        None,
                    )
                if field is not None:
                    out.append(field.annotation)
                elif part in _tag_values(m):  # a union member named by its tag
                    out.append(m)
            elif origin in (list, tuple, set, frozenset) and isinstance(part, int):
                out.extend(get_args(m)[:1])
            elif origin is dict:
                args = get_args(m)
                if len(args) == 2:
                    out.append(args[1])
    return out


def fields_at(model: type[BaseModel], loc: Sequence[int | str]) -> set[str]:
    """Every field name (and alias) valid at `loc` (a pydantic error location) in `model`."""
    types: list[Any] = [model]
    for part in loc:
        types = _step(types, part)
        if not types:
            return set()
    names: set[str] = set()
    tagged = [m for tp in types for m in members(tp) if _is_model(m)]
    for m in tagged:
        for name, f in m.model_fields.items():
            names.add(f.alias or name)
    return names


def closest_field(name: str, known: Iterable[str]) -> str | None:
    """The known field `name` was most likely meant to be, if any is close enough."""
    match = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return match[0] if match else None
