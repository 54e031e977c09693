"""The one clock (testbed/clock.py): what it converts, and that nothing else converts by the scale.

A virtual-time substrate replaces the live clock; that only works if no component computes with
`time_scale` itself. The scan below reads every module of the package and fails on arithmetic
with the time scale (or a name or attribute assigned from it) outside testbed/clock.py, and on
any read of `time_scale` not listed in ALLOWED_READS with its reason.
"""

from __future__ import annotations

import ast
import asyncio
import time
from pathlib import Path

import pytest

from testbed.clock import LiveClock, Scale

PACKAGE = Path(__file__).resolve().parents[1] / "testbed"
CLOCK = PACKAGE / "clock.py"

ALLOWED_READS: dict[str, str] = {
    "scenario/runner.py": "hands the scenario's scale to each service in its spec",
    "engine/torch/pacing.py": "reports the scale the steps were paced at",
    "engine/torch/verify.py": "builds verify-model's clock from its option (0: no pacing)",
    "cli/verify.py": "passes --time-scale to verify-model",
    "cli/run.py": "prints the scale in the run header",
    "cli/up.py": "passes --time-scale to the standing deployment and prints it, with a warning",
    "scenario/standing.py": "replaces the scenario's time_scale (testbed up runs at 1 by default)",
    "config/deployment.py": "ScaleConfig.resolved copies the byte_scale next to a new time_scale",
    "engine/torch/live.py": "resolves time_scale: auto and compares a requested one with the "
    "largest the calibration allows",
    "scenario/scorecard_router.py": "writes the router rows' scale (always 1) into the card",
}
"""Modules that read `time_scale` without computing with it, and why."""


def test_live_clock_reads_waits_and_converts() -> None:
    clock = LiveClock(time.monotonic(), time_scale=10.0)
    assert clock.wall(20.0) == pytest.approx(2.0)
    assert clock.real(0.5) == pytest.approx(5.0)
    assert clock.at(clock.epoch + 3.0) == pytest.approx(30.0)
    assert clock.mono(30.0) == pytest.approx(clock.epoch + 3.0)
    assert 0.0 <= clock.now() < 10.0
    before = clock.now()
    asyncio.run(clock.sleep(1.0))  # 0.1 wall seconds
    assert clock.now() - before >= 1.0
    later = clock.rebased()
    assert later.time_scale == 10.0 and later.epoch >= clock.epoch
    assert clock.wall_until(clock.now() - 5) < 0 < clock.wall_until(clock.now() + 5)
    with pytest.raises(ValueError, match="time_scale"):
        LiveClock(time_scale=0)


def test_scale_converts_rates_and_bytes() -> None:
    scale = Scale(time_scale=10.0, byte_scale=1000.0)
    assert scale.wire_rate(12.5e9) == pytest.approx(12.5e7)
    assert scale.real_rate(12.5e7) == pytest.approx(12.5e9)
    assert scale.real_bytes(scale.wire_bytes(4096.0)) == pytest.approx(4096.0)
    assert scale.to_json() == {"time": 10.0, "bytes": 1000.0}


def _mentions(node: ast.AST, aliases: set[str]) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and (sub.attr == "time_scale" or sub.attr in aliases):
            return True
        if isinstance(sub, ast.Name) and (sub.id == "time_scale" or sub.id in aliases):
            return True
    return False


def _target_names(target: ast.AST) -> set[str]:
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, ast.Attribute):
        return {target.attr}
    if isinstance(target, ast.Tuple):
        return set().union(*(_target_names(t) for t in target.elts))
    return set()


def scale_violations(source: str) -> tuple[list[int], list[int]]:
    """(lines computing with the time scale, lines reading it) of one module's source."""
    tree = ast.parse(source)
    aliases: set[str] = set()

    def is_scale(value: ast.AST) -> bool:  # the scale itself, or a copy of it
        if isinstance(value, ast.Attribute):
            return value.attr == "time_scale" or value.attr in aliases
        return isinstance(value, ast.Name) and (value.id == "time_scale" or value.id in aliases)

    for _ in range(3):  # aliases of aliases (k = spec.time_scale; self.k = k)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Assign):
                continue
            pairs: list[tuple[ast.AST, ast.AST]] = [(t, node.value) for t in node.targets]
            for t in node.targets:  # state, k = s, spec.time_scale
                if isinstance(t, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs += list(zip(t.elts, node.value.elts, strict=False))
            for target, value in pairs:
                if is_scale(value):
                    aliases |= _target_names(target)
    aliases.discard("time_scale")
    computing, reading = [], []
    for node in ast.walk(tree):
        scaled = isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult | ast.Div)
        if scaled and (_mentions(node.left, aliases) or _mentions(node.right, aliases)):
            computing.append(node.lineno)
        if isinstance(node, ast.AugAssign) and _mentions(node.value, aliases):
            computing.append(node.lineno)
        is_read = isinstance(node, ast.Attribute | ast.Name) and isinstance(node.ctx, ast.Load)
        name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
        if is_read and name == "time_scale":
            reading.append(node.lineno)
    return sorted(set(computing)), sorted(set(reading))


def test_the_scan_catches_a_hand_conversion() -> None:
    computing, _ = scale_violations("k = spec.time_scale\nx = 3 / k\n")
    assert computing == [2]
    source = "class A:\n def f(s):\n  s.k = s.spec.time_scale\n  y = 2 * s.k\n"
    computing, _ = scale_violations(source)
    assert computing == [4]
    computing, reading = scale_violations("d = clock.wall(5)\n")
    assert computing == reading == []


def test_only_the_clock_module_converts_by_the_time_scale() -> None:
    computing: list[str] = []
    reading: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == CLOCK:
            continue
        rel = path.relative_to(PACKAGE).as_posix()
        comp, read = scale_violations(path.read_text())
        computing += [f"{rel}:{line}" for line in comp]
        if rel not in ALLOWED_READS:
            reading += [f"{rel}:{line}" for line in read]
    assert computing == [], "convert with testbed.clock instead"
    assert reading == [], "read the scale through testbed.clock, or list the module with why"
