"""Substrates are registry entries with facts (testbed.substrates): the command line's choices
come from the registry, and no module outside it compares a substrate's name."""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.cli import build_parser
from testbed.errors import UserError
from testbed.substrate import SUBSTRATES, make_substrate
from testbed.substrates import (
    SubstrateFacts,
    added_substrate,
    register_substrate,
    runs_in_virtual_time,
    substrate_facts,
    substrate_names,
    substrates_with,
)

PACKAGE = Path(__file__).resolve().parents[2] / "testbed"
REGISTRY = PACKAGE / "substrates.py"


def _names_a_substrate(node: ast.expr) -> bool:
    """`substrate`, `opts.substrate`, `summary.get("substrate")`, `summary["substrate"]`."""
    if isinstance(node, ast.Name):
        return "substrate" in node.id.lower()
    if isinstance(node, ast.Attribute):
        return "substrate" in node.attr.lower()
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        args = node.args[:1]
        return node.func.attr == "get" and any(
            isinstance(a, ast.Constant) and a.value == "substrate" for a in args
        )
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "substrate"
    return False


def _is_names(node: ast.expr) -> bool:
    """A string literal, or a tuple, list or set of them."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return bool(node.elts) and all(_is_names(e) for e in node.elts)
    return False


def name_comparisons(source: str, filename: str) -> Iterator[str]:
    """`file:line: text` of each comparison of a substrate with a name (==, !=, in, not in,
    either side), the lookups a fact of testbed.substrates replaces."""
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        for left, right in itertools.pairwise(sides):
            if (_names_a_substrate(left) and _is_names(right)) or (
                _names_a_substrate(right) and _is_names(left)
            ):
                yield f"{filename}:{node.lineno}: {ast.unparse(node)}"


def test_no_module_outside_the_registry_compares_a_substrate_by_name() -> None:
    found = [
        hit
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != REGISTRY
        for hit in name_comparisons(path.read_text(), str(path.relative_to(PACKAGE.parent)))
    ]
    assert not found, "ask a fact of testbed.substrates instead:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "snippet",
    [
        'if opts.substrate == "sim":\n    pass\n',
        'ok = "local" != args.substrate\n',
        'live = substrate in ("local", "compose")\n',
        'sim = summary.get("substrate") == "sim"\n',
        'x = summary["substrate"] not in {"sim"}\n',
    ],
)
def test_the_scan_finds_a_planted_comparison(snippet: str) -> None:
    """The scan above is not vacuous: each way of comparing a name is found, file:line."""
    source = "import os\n\n" + snippet
    (hit,) = name_comparisons(source, "testbed/planted.py")
    assert hit.startswith("testbed/planted.py:3: ")


def test_passing_a_name_or_a_cluster_is_not_a_comparison() -> None:
    source = 'run(substrate="sim")\nif cluster == "local":\n    pass\nx = name in SUBSTRATES\n'
    assert list(name_comparisons(source, "x.py")) == []


def test_the_substrates_are_the_registry_s_entries() -> None:
    assert substrate_names()[:3] == ("local", "compose", "sim")
    assert SUBSTRATES == substrates_with(lambda s: s.services is not None) == ("local", "compose")
    assert substrates_with(lambda s: s.virtual_time) == ("sim",)
    assert runs_in_virtual_time("sim") and not runs_in_virtual_time("local")
    assert not runs_in_virtual_time(None) and not runs_in_virtual_time("from-the-future")


def test_an_unknown_substrate_is_one_line_naming_them_all() -> None:
    with pytest.raises(UserError) as err:
        substrate_facts("nowhere")
    assert str(err.value) == (
        "substrate 'nowhere' is not available; use one of local, compose, sim"
    )


def test_the_sim_starts_no_services(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="starts no services; use one of local, compose"):
        make_substrate("sim", tmp_path)


def test_a_new_entry_is_a_choice_of_testbed_run() -> None:
    toy = SubstrateFacts(
        name="toy", description="a test's toy", services="testbed.substrate.local:LocalSubstrate"
    )
    with added_substrate(toy):
        args = build_parser().parse_args(["run", "burst", "--substrate", "toy"])
        assert args.substrate == "toy" and substrate_facts("toy").outside_policies
        with pytest.raises(SystemExit):  # not a standing one: `testbed up` does not offer it
            build_parser().parse_args(["up", "burst", "--substrate", "toy"])
    standing = SubstrateFacts("toy-up", "x", services="m:C", standing=True)
    with added_substrate(standing):
        assert build_parser().parse_args(["up", "burst", "--substrate", "toy-up"]).substrate
    assert "toy" not in substrate_names()


def test_an_entry_makes_services_or_simulates_never_both() -> None:
    both = SubstrateFacts("both", "x", services="a:B", simulate="c:d")
    with pytest.raises(ValueError, match="exactly one of services and simulate"):
        register_substrate(both)
