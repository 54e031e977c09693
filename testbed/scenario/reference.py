"""The scenario file's reference (docs/reference/scenario-file.md), written from the models.

Walking `Scenario` and the models it holds, rather than keeping a table by hand, is what keeps
the reference true: a field added to a config model, a new nemesis action or checker (the
registries build the scenario's unions) appears in it the next time `make docs` runs, and
tests/devtools/test_docgen.py fails until it has. Each field shows its name as written in the
file, its type, the unit it is written with, its default (in that unit) and its description: the
`Field(description=...)` or the attribute docstring under it, the same text a reader of the code
sees.

Tagged unions (`lengths` by `kind`, `nemesis` by `action`, `checkers` by `check`) get one
section each, with the fields every member shares listed once, so an entry's table shows only
what is its own.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import re
import textwrap
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types as at
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from testbed.config.base import UNIT_KINDS
from testbed.config.policy import POLICY_KNOBS
from testbed.scenario.schema import Scenario
from testbed.units import format_bandwidth, format_duration, format_size, parse_tokens

__all__ = ["scenario_reference"]

_UNITS: dict[str, tuple[str, Any]] = {
    "duration": ("`25ms`, `10s`, `2m`", format_duration),
    "size": ("`64KB`, `701.3MiB`", format_size),
    "bandwidth": ("`100Gbps`, `12.5MB/s`", format_bandwidth),
    "tokens": ("`1024`, `19.4K`", lambda v: f"{v:g}"),
}
"""Per kind of quantity: how a person writes one, and how a default (SI) is shown in it."""


def slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading (lower case, punctuation dropped, spaces to
    dashes), so a link written here lands on the section."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _unit_kind(metadata: tuple[Any, ...] | list[Any]) -> str | None:
    for m in metadata:
        for validator, kind in UNIT_KINDS:
            if m is validator:
                return kind
        if getattr(m, "func", None) is parse_tokens:
            return "tokens"
    return None


def _one_line(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


@cache
def _attribute_docs(cls: type) -> dict[str, str]:
    """The docstring under each annotated attribute of a class body (`x: int = 1` then
    `\"\"\"...\"\"\"`): where most fields of the config models say what they mean."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    out: dict[str, str] = {}
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            out[node.target.id] = inspect.cleandoc(after.value.value)
    return out


def _description(model: type[BaseModel], name: str, info: FieldInfo) -> str:
    if info.description:
        return info.description
    for cls in model.__mro__:
        if isinstance(cls, type) and issubclass(cls, BaseModel) and cls is not BaseModel:
            doc = _attribute_docs(cls).get(name)
            if doc:
                return doc
    return ""


def _model_doc(model: type[BaseModel], siblings: tuple[type[BaseModel], ...] = ()) -> str:
    """A model's docstring; for a union member without one that has its module to itself, the
    module's first paragraph (a nemesis action's or a checker's file starts by saying what it
    does)."""
    doc = model.__dict__.get("__doc__")
    if doc:
        return inspect.cleandoc(doc)
    module = inspect.getmodule(model)
    alone = sum(m.__module__ == model.__module__ for m in siblings) == 1
    if alone and module is not None and module.__doc__:
        return inspect.cleandoc(module.__doc__).split("\n\n")[0]
    return ""


@dataclass
class _Union:
    """A tagged union of the file: its members, by the tag field that picks one."""

    name: str
    tag: str
    members: tuple[type[BaseModel], ...]

    @property
    def heading(self) -> str:
        return f"{self.name} (by {self.tag})"


@dataclass
class _Walk:
    """What the type column linked to, in the order first seen: the sections to write."""

    models: list[type[BaseModel]] = field(default_factory=list)
    unions: list[_Union] = field(default_factory=list)
    member_of: dict[type[BaseModel], _Union] = field(default_factory=dict)

    def model(self, m: type[BaseModel]) -> str:
        if m in self.member_of:
            return f"[{m.__name__}](#{slug(_member_heading(self.member_of[m], m))})"
        if m not in self.models:
            self.models.append(m)
        return f"[{m.__name__}](#{slug(m.__name__)})"

    def union(self, name: str, tag: str, members: tuple[type[BaseModel], ...]) -> str:
        u = next((u for u in self.unions if u.members == members), None)
        if u is None:
            u = _Union(name, tag, members)
            self.unions.append(u)
            for m in members:
                self.member_of[m] = u
        return f"one of [{u.heading}](#{slug(u.heading)})"


def _tags(model: type[BaseModel], tag: str) -> list[str]:
    return [str(v) for v in get_args(model.model_fields[tag].annotation)]


def _member_heading(u: _Union, m: type[BaseModel]) -> str:
    return f"{u.tag}: {', '.join(_tags(m, u.tag))}"


def _type(tp: Any, walk: _Walk, name: str) -> str:
    """The type column: what a person may write, with links to the models it holds."""
    origin = get_origin(tp)
    if origin is Annotated:
        base, *meta = get_args(tp)
        kind = _unit_kind(meta)
        if kind is not None:
            return kind
        disc = next((m.discriminator for m in meta if isinstance(m, FieldInfo)), None)
        if isinstance(disc, str):
            return walk.union(name, disc, tuple(get_args(base)))
        return _type(base, walk, name)
    if origin is Literal:
        return " or ".join(f"`{v}`" for v in get_args(tp))
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        text = " or ".join(_type(a, walk, name) for a in args)
        return f"{text} or null" if len(args) < len(get_args(tp)) else text
    if origin in (list, tuple, set, frozenset):
        return "list of " + _type(get_args(tp)[0], walk, name)
    if origin is dict:
        return "map of name to " + _type(get_args(tp)[1], walk, name)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return walk.model(tp)
    return {bool: "bool", int: "integer", float: "number", str: "string"}.get(tp, str(tp))


def _field_kind(info: FieldInfo) -> str | None:
    """The unit kind of a field, also through `Duration | None` and `Tokens | Literal[...]`."""
    kind = _unit_kind(info.metadata)
    for alt in get_args(info.annotation) if kind is None else ():
        kind = kind or _unit_kind(getattr(alt, "__metadata__", ()))
    return kind


def _bounds(info: FieldInfo) -> str:
    marks = (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
    out = []
    for m in info.metadata:
        for attr, sign in marks:
            value = getattr(m, attr, None) if isinstance(m, at.BaseMetadata) else None
            if isinstance(value, int) and value > 2**32 and value.bit_count() == 1:
                out.append(f"{sign} 2^{value.bit_length() - 1}")
            elif isinstance(value, int | float):
                out.append(f"{sign} {value:g}")
        if isinstance(m, at.MinLen):
            out.append(f"at least {m.min_length}")
        if isinstance(m, at.MaxLen):
            out.append(f"at most {m.max_length}")
    return ", ".join(out)


def _value(v: Any, kind: str | None) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float) and kind is not None and v != 0:
        return str(_UNITS[kind][1](float(v)))
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, BaseModel):
        fields = type(v).model_fields
        tags = {k for k, f in fields.items() if get_origin(f.annotation) is Literal
                and len(get_args(f.annotation)) == 1}  # fmt: skip
        changed = [
            k
            for k, f in fields.items()
            if not f.is_required() and getattr(v, k) != f.get_default(call_default_factory=True)
        ]
        said = [f"{k}: {_value(getattr(v, k), None)}" for k in [*sorted(tags), *changed]]
        if not said:
            return "(its defaults)"
        return ", ".join(said) + ("" if changed else " (its defaults)")
    if isinstance(v, list | tuple | dict) and not v:
        return "[]" if not isinstance(v, dict) else "{}"
    if isinstance(v, str):
        return v or '""'
    return str(v)


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "**required**"
    text = _value(info.get_default(call_default_factory=True), _field_kind(info))
    written, _, note = text.partition(" (")
    return text if not written else f"`{written}` ({note}" if note else f"`{written}`"


def _rows(model: type[BaseModel], walk: _Walk, skip: frozenset[str] = frozenset()) -> list[str]:
    rows = []
    for name, info in model.model_fields.items():
        written = info.alias or name
        if written in skip:
            continue
        kind = _field_kind(info)
        unit = _UNITS[kind][0] if kind is not None else ""
        if isinstance(info.discriminator, str):  # pydantic moves a field's own Field() here
            kind_type = walk.union(written, info.discriminator, get_args(info.annotation))
        else:
            kind_type = _type(info.annotation, walk, written)
        if kind is not None and kind_type == "number":  # the unit's validator is in metadata
            kind_type = kind
        bounds = _bounds(info)
        typ = f"{kind_type} ({bounds})" if bounds else kind_type
        desc = _one_line(_description(model, name, info))
        rows.append(f"| `{written}` | {typ} | {unit} | {_default(info)} | {desc} |")
    return rows


_HEAD = ["| field | type | written as | default | description |", "|---|---|---|---|---|"]


def _table(rows: list[str]) -> list[str]:
    return [*_HEAD, *rows, ""] if rows else ["(no fields of its own)", ""]


def _model_section(model: type[BaseModel], walk: _Walk) -> list[str]:
    doc = _model_doc(model)
    return [f"## {model.__name__}", "", *([doc, ""] if doc else []), *_table(_rows(model, walk))]


def _union_section(u: _Union, walk: _Walk) -> list[str]:
    """One section per union: the fields every member has, once, then each member's own."""
    rows = {m: dict(zip(m.model_fields, _rows(m, walk), strict=True)) for m in u.members}
    first = rows[u.members[0]]
    shared = {n for n, r in first.items() if all(rows[m].get(n) == r for m in u.members)}
    tags = ", ".join(f"`{t}`" for m in u.members for t in _tags(m, u.tag))
    out = [f"## {u.heading}", "", f"`{u.tag}` picks the entry's kind: {tags}.", ""]
    common = [r for n, r in first.items() if n in shared and n != u.tag]
    if common:
        out += ["Fields every entry takes:", "", *_table(common)]
    for m in u.members:
        doc = _model_doc(m, u.members)
        own = [r for n, r in rows[m].items() if n not in shared and n != u.tag]
        out += [f"### {_member_heading(u, m)}", "", *([doc, ""] if doc else []), *_table(own)]
    return out


def _sections(root: type[BaseModel]) -> Iterator[list[str]]:
    walk = _Walk()
    walk.model(root)
    for knobs in POLICY_KNOBS.entries():  # each policy's section of `policy:` (PolicyConfig)
        walk.model(knobs)
    done_models: set[type[BaseModel]] = set()
    done_unions: list[_Union] = []
    while True:
        model = next((m for m in walk.models if m not in done_models), None)
        if model is not None:
            done_models.add(model)
            yield _model_section(model, walk)
            continue
        union = next((u for u in walk.unions if u not in done_unions), None)
        if union is None:
            return
        done_unions.append(union)
        yield _union_section(union, walk)


_INTRO = """\
# The scenario file: reference

<!-- Generated by `make docs` (python -m testbed.cli.docgen) from the pydantic models of
testbed/config/ and testbed/scenario/schema.py and the nemesis and checker registries. Do not edit
by hand: tests/devtools/test_docgen.py fails when this file is stale. -->

Every field of a scenario file, as the loader reads it. How to write a scenario, with examples:
[../scenarios.md](../scenarios.md). Quantities carry their unit ("written as"): a duration, size
or bandwidth without one is an error; token counts may stay bare or use K (1000 tokens). Every
figure is real-world: the run scales it by `scale`. A misspelt field is an error that names the
closest known one.
"""


def scenario_reference() -> str:
    """The Markdown of docs/reference/scenario-file.md."""
    sections = list(_sections(Scenario))
    toc = ["## Contents", ""]
    for lines in sections:
        heading = lines[0].removeprefix("## ")
        toc.append(f"- [{heading}](#{slug(heading)})")
    body = [line for lines in sections for line in lines]
    return "\n".join([_INTRO, *toc, "", *body]).rstrip() + "\n"
