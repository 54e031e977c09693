"""testbed/registry.py on a throwaway package: modules are found on the first read (not at
import), in sorted order; a failed discovery is retried; names are unique."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

DRIVER = """
import sys
sys.path.insert(0, sys.argv[1])
from testbed.registry import Registry, UnknownName

names = Registry("widget", "widgets", names=lambda f: (f.__name__.removeprefix("w_"),))
import builtins
builtins.WIDGETS = names  # what the modules register into
import widgets
print("imported before the first read:", sorted(m for m in sys.modules if m.startswith("widgets.")))
try:
    names["zeta"]
except ImportError as exc:
    print("first read:", exc)
print("after the failure:", sorted(m for m in sys.modules if m.startswith("widgets.")))
import pathlib
pathlib.Path(sys.argv[1], "widgets", "broken.py").unlink()
print("names:", list(names))
try:
    names["gamma"]
except UnknownName as exc:
    print("unknown:", exc)
try:
    names.register(names["alpha"])
    names.register(type("w_alpha", (), {}))
except ValueError as exc:
    print("taken:", exc)
"""

MODULE = """
import builtins
@builtins.WIDGETS.register
def w_{name}(): ...
"""


def test_discovery_is_lazy_sorted_retried_and_names_are_unique(tmp_path: Path) -> None:
    pkg = tmp_path / "widgets"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name in ("zeta", "alpha", "mid"):
        (pkg / f"{name}.py").write_text(textwrap.dedent(MODULE.format(name=name)))
    (pkg / "broken.py").write_text("raise ImportError('broken on purpose')\n")
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(DRIVER), str(tmp_path)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "imported before the first read: []"
    assert lines[1] == "first read: broken on purpose"
    # alpha was imported (sorted order) before broken failed; the rest waits for a retry
    assert lines[2] == "after the failure: ['widgets.alpha']"
    assert lines[3] == "names: ['alpha', 'mid', 'zeta']"
    assert lines[4] == "unknown: unknown widget 'gamma'; known: alpha, mid, zeta"
    assert lines[5].startswith("taken: widget name 'alpha' is taken by widgets.alpha.w_alpha;")
