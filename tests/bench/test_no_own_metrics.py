"""bench/ defines no window metric or threshold grid of its own (issue #37).

The steady window, the completion rate, the TTFT percentile over a window
(testbed.metrics.window, re-exported by testbed.experiment) and the hindsight threshold grid
(testbed.scenario.hindsight.default_thresholds) each exist once; a bench script imports them.
An AST scan of bench/*.py finds the shapes a copy takes:

- steady window: a division by the literal 6 (`duration / 6`, "skip the first sixth");
- completion rate: a function named like one, `bisect` over records' `last_token`, or a
  chained comparison on a `.last_token` (`after <= r.last_token < until`);
- P90 over a window: a chained comparison on an `.arrival` (`lo <= r.arrival < hi`, the window
  filter), or numpy's percentile (`np.percentile`, `np.quantile`) called with the literal 90
  (testbed.metrics.window.percentile is the one to call);
- threshold grid: a name containing THRESHOLD bound to a literal list or tuple of numbers, or
  such a literal (or a name bound to one, whatever it is called) given as a `thresholds=`
  keyword (best_fixed's) or as the values of a `policy.threshold` axis.

Each planted form is shown to be found (`test_each_planted_copy_is_found`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
PERCENTILE_CALLS = {"percentile", "quantile", "nanpercentile", "nanquantile"}
NUMPY = {"np", "numpy"}


def _is_number(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, int | float)


def _numbers(node: ast.AST) -> bool:
    """A literal list or tuple of two or more numbers."""
    return (
        isinstance(node, ast.Tuple | ast.List)
        and len(node.elts) >= 2
        and all(_is_number(e) for e in node.elts)
    )


def _grids_given(tree: ast.AST) -> list[str]:
    """Threshold grids handed to a search: a literal of numbers (or a name bound to one) as a
    `thresholds=` keyword or as the values of a dict key naming a threshold (a Grid axis)."""
    named = {
        t.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and _numbers(node.value)
        for t in node.targets
        if isinstance(t, ast.Name)
    }

    def literal(v: ast.AST) -> bool:
        return _numbers(v) or (isinstance(v, ast.Name) and v.id in named)

    found: list[str] = []
    for node in ast.walk(tree):
        given: list[tuple[str, ast.AST]] = []
        if isinstance(node, ast.Call):
            given = [(k.arg, k.value) for k in node.keywords if k.arg]
        elif isinstance(node, ast.Dict):
            given = [
                (k.value, v)
                for k, v in zip(node.keys, node.values, strict=True)
                if isinstance(k, ast.Constant) and isinstance(k.value, str)
            ]
        for key, value in given:
            if "threshold" in key.lower() and literal(value):
                found.append(f"{node.lineno}: a threshold grid ({key}={ast.unparse(value)})")
    return found


def _copies(source: str) -> list[str]:
    """What in `source` is a window metric or a threshold grid of its own, one line each."""
    tree = ast.parse(source)
    found: list[str] = _grids_given(tree)
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Div)
            and isinstance(node.right, ast.Constant)
            and node.right.value == 6
        ):
            found.append(f"{line}: steady window (a division by 6)")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (
            "completion_rate" in node.name or "steady_window" in node.name
        ):
            found.append(f"{line}: {node.name} defined")
        elif isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            args = [*node.args, *(k.value for k in node.keywords)]
            numpy_call = isinstance(fn, ast.Attribute) and ast.unparse(fn.value) in NUMPY
            if (
                numpy_call
                and name in PERCENTILE_CALLS
                and any(isinstance(a, ast.Constant) and a.value in (90, 0.9) for a in args)
            ):
                found.append(f"{line}: a P90 of its own ({name})")
            if name.startswith("bisect") and "last_token" in ast.unparse(node):
                found.append(f"{line}: completion rate (bisect over last_token)")
        elif (
            isinstance(node, ast.Compare)
            and len(node.ops) == 2
            and any(
                isinstance(c, ast.Attribute) and c.attr in ("arrival", "last_token")
                for c in node.comparators
            )
        ):
            found.append(f"{line}: a window over records ({ast.unparse(node)})")
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            value = node.value
            if any("THRESHOLD" in n.upper() for n in names) and _numbers(value):
                found.append(f"{line}: a threshold grid ({', '.join(names)})")
    return found


@pytest.mark.parametrize("script", sorted(BENCH.glob("*.py")), ids=lambda p: p.name)
def test_bench_defines_no_window_metric_or_threshold_grid(script: Path) -> None:
    found = _copies(script.read_text())
    assert not found, f"{script.name}: use testbed.experiment / testbed.scenario.hindsight:\n" + (
        "\n".join(found)
    )


PLANTED = {
    "steady": "lo, hi = duration / 6, duration\n",
    "rate": "def completion_rate(records, lo, hi):\n    return 0.0\n",
    "bisect": "n = bisect.bisect_right(sorted(r.last_token for r in rs), hi)\n",
    "window": "vals = [r.ttft for r in records if lo <= r.arrival < hi]\n",
    "ends": "done = sum(1 for r in recs if after <= r.last_token < until)\n",
    "p90": "p = float(np.percentile(vals, 90))\n",
    "grid": "THRESHOLDS = (2_000, 5_000, 10_000)\n",
    "grid-passed": "best_fixed(sc, [1], 'goodput', thresholds=[10_000, 20_000])\n",
    "grid-named": "T = (10_000, 20_000)\nbest_fixed(sc, [1], 'goodput', thresholds=T)\n",
    "grid-axis": "g = Grid.of('paper', axes={'policy.threshold': (10_000, 20_000)})\n",
}


@pytest.mark.parametrize("form", sorted(PLANTED))
def test_each_planted_copy_is_found(form: str) -> None:
    assert _copies(PLANTED[form]), form


def test_the_window_module_itself_would_be_found() -> None:
    """The scan is not vacuous: the one real definition, planted in bench/, is a copy."""
    window = Path(__file__).resolve().parents[2] / "testbed" / "metrics" / "window.py"
    assert _copies(window.read_text())
