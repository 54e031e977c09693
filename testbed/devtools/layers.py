"""The import layers of the package, checked: `python -m testbed.devtools.layers`.

Each top-level module or package of `testbed` sits in one layer; a module may import from its own
layer and the ones below it, never from above, and the import graph between modules has no cycle.
Type-only imports (under `if TYPE_CHECKING:`) count: a dependency a type checker needs is a
dependency a reader has to hold in their head, and a cycle through one is still a cycle.

Why these layers: what a run *is* (units, the clock, configuration, profiles) sits below what a
run *does* (engines, the scheduler, services), which sits below where it runs (substrates) and
how a run is put together (scenario), with the command line on top. A virtual-time substrate or
an outside scheduler plugs in at its own layer without dragging the rest along.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LAYERS", "Violation", "check", "main"]

LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "errors",
        "units",
        "clock",
        "lifeline",
        "serving",
        "devtools",
        "registry",
        "substrates",
        "frozen",
    ),
    ("profiles", "transfer"),
    ("config",),
    ("workload", "planner", "planner_grid", "policy", "kvcache"),
    ("metrics", "checkers", "nemesis"),
    ("engine", "link", "scheduler", "dispatch"),
    ("services",),
    ("substrate", "sim"),
    ("scenario", "verify"),
    ("experiment",),
    ("cli",),
)
"""Lowest first: the top-level names under testbed/ (modules or packages) of each layer."""

PACKAGE = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Violation:
    module: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line}: {self.message}"


def _layer_of(top: str, layers: Sequence[Sequence[str]]) -> int | None:
    for i, names in enumerate(layers):
        if top in names:
            return i
    return None


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.AST, module: str, is_package: bool) -> Iterable[tuple[str, int]]:
    """Every `testbed...` module imported (absolute or relative), with its line."""
    base = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "testbed" or alias.name.startswith("testbed."):
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[: len(base) - node.level + 1]
                target = ".".join(anchor + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "testbed" or target.startswith("testbed."):
                yield target, node.lineno
                for alias in node.names:  # `from testbed.x import y` may name a module y
                    yield f"{target}.{alias.name}", node.lineno


def check(root: Path = PACKAGE, layers: Sequence[Sequence[str]] = LAYERS) -> list[Violation]:
    """Upward imports, modules in no layer, and import cycles under `root` (the package)."""
    files = sorted(root.rglob("*.py"))
    modules = {_module_name(p, root): p for p in files}
    graph: dict[str, dict[str, int]] = {}
    out: list[Violation] = []
    for name, path in modules.items():
        parts = name.split(".")
        if len(parts) < 2:
            continue  # testbed/__init__.py
        top = parts[1]
        mine = _layer_of(top, layers)
        if mine is None:
            out.append(Violation(name, 1, f"testbed.{top} is in no layer (add it to LAYERS)"))
            continue
        tree = ast.parse(path.read_text(), str(path))
        edges = graph.setdefault(name, {})
        for target, line in _imports(tree, name, path.name == "__init__.py"):
            if target not in modules:
                continue  # `from testbed.x import some_function`
            tparts = target.split(".")
            if len(tparts) < 2 or target == name:
                continue
            theirs = _layer_of(tparts[1], layers)
            if theirs is not None and theirs > mine:
                out.append(
                    Violation(
                        name,
                        line,
                        f"imports {target} (layer {theirs}: {', '.join(layers[theirs])}) "
                        f"from layer {mine} ({', '.join(layers[mine])})",
                    )
                )
            edges.setdefault(target, line)
    out += _cycles(graph)
    return out


def _cycles(graph: dict[str, dict[str, int]]) -> list[Violation]:
    """One violation per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        work = [(v, iter(sorted(graph.get(v, {}))))]
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            advanced = False
            for w in it:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, {})))))
                    advanced = True
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    out = []
    for comp in found:
        first = comp[0]
        nxt = next(t for t in graph[first] if t in comp)
        out.append(
            Violation(first, graph[first][nxt], "import cycle: " + " -> ".join([*comp, comp[0]]))
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.devtools.layers",
        description="Check that testbed's modules import only downward and without cycles.",
    )
    parser.add_argument("root", nargs="?", type=Path, default=PACKAGE, help="package directory")
    args = parser.parse_args(argv)
    violations = check(args.root)
    for v in violations:
        print(v, file=sys.stderr)
    if violations:
        print(f"layers: {len(violations)} violation(s); see LAYERS in {__file__}", file=sys.stderr)
        return 1
    print(f"layers: ok ({len(LAYERS)} layers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
