"""Each dispatch rule is written once in testbed/ (testbed/dispatch/core.py), not once per
driver: the live router and the sim call it. The scan is over the package's source, so a copy
that creeps back into either driver (or anywhere else) fails here, naming where it is."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import testbed

PACKAGE = Path(testbed.__file__).resolve().parent
CORE = PACKAGE / "dispatch" / "core.py"


@functools.cache
def _walk(text: str) -> tuple[ast.AST, ...]:
    return tuple(ast.walk(ast.parse(text)))


def _sources() -> dict[Path, str]:
    return {p: p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}


def _string_sites(sources: dict[Path, str], needle: str, exact: bool = False) -> list[str]:
    """file:line of every string constant (f-string parts included) containing `needle` (or,
    with `exact`, equal to it: a separator, not prose that happens to hold it)."""
    sites = []
    for path, text in sources.items():
        for node in _walk(text):
            is_str = isinstance(node, ast.Constant) and isinstance(node.value, str)
            found = is_str and (node.value == needle if exact else needle in node.value)
            if found and not _is_docstring(node, text):
                sites.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return sites


def _is_docstring(node: ast.Constant, text: str) -> bool:
    line = text.splitlines()[node.lineno - 1].lstrip()
    return line.startswith(('"""', "'''"))


def _attempt_limit_sites(sources: dict[Path, str]) -> list[str]:
    """Where MAX_ATTEMPTS bounds something: compared with, or the count of a range()."""
    sites = []
    for path, text in sources.items():
        for node in _walk(text):
            operands: list[ast.expr] = []
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "range":
                operands = list(node.args)
            if any(_named(o, "MAX_ATTEMPTS") for o in operands):
                sites.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return sites


def _named(node: ast.expr, name: str) -> bool:
    return (isinstance(node, ast.Name) and node.id == name) or (
        isinstance(node, ast.Attribute) and node.attr == name
    )


def test_the_register_timeout_message_is_made_in_one_place() -> None:
    sites = _string_sites(_sources(), "did not register the request within")
    assert [s.split(":")[0] for s in sites] == ["dispatch/core.py"], sites


def test_the_reason_join_is_written_once() -> None:
    sites = _string_sites(_sources(), "; then ", exact=True)
    assert [s.split(":")[0] for s in sites] == ["dispatch/core.py"], sites


def test_the_attempt_limit_is_applied_once() -> None:
    sites = _attempt_limit_sites(_sources())
    assert [s.split(":")[0] for s in sites] == ["dispatch/core.py"], sites


def test_the_scan_finds_a_copy_planted_in_a_driver() -> None:
    """The scans can fail: a driver that joins reasons or counts attempts itself is found."""
    sources = _sources()
    driver = PACKAGE / "sim" / "dispatch.py"
    sources[driver] += (
        "\n\ndef _copy(reasons, attempt):\n"
        "    if attempt >= MAX_ATTEMPTS:\n"
        '        return "; then ".join(reasons)\n'
        '    return f"decode on x: did not register the request within {attempt}s"\n'
    )
    joins = _string_sites(sources, "; then ", exact=True)
    assert "sim/dispatch.py" in {s.split(":")[0] for s in joins}
    assert "sim/dispatch.py" in {s.split(":")[0] for s in _attempt_limit_sites(sources)}
    registers = _string_sites(sources, "did not register the request within")
    assert "sim/dispatch.py" in {s.split(":")[0] for s in registers}
