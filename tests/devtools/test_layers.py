"""The import-layer check (testbed/devtools/layers.py): it passes on the package, and it fails on
a deliberate upward import, a cycle (type-only included) and a module in no layer."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from testbed.devtools.layers import LAYERS, check

ROOT = Path(__file__).resolve().parents[2]


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "testbed"
    for rel, text in {"__init__.py": "", **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def test_the_package_keeps_its_layers() -> None:
    assert [str(v) for v in check()] == []


def test_an_upward_import_is_caught(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "config.py": "from testbed.scenario.runner import run_scenario\n",
            "scenario/__init__.py": "",
            "scenario/runner.py": "def run_scenario(): ...\n",
        },
    )
    (v,) = check(root)
    assert v.module == "testbed.config" and v.line == 1
    assert "imports testbed.scenario.runner" in v.message


def test_a_type_only_cycle_is_caught(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "services/__init__.py": "",
            "services/a.py": "from testbed.services.b import B\n",
            "services/b.py": """
                from typing import TYPE_CHECKING
                if TYPE_CHECKING:
                    from testbed.services.a import A
                class B: ...
            """,
        },
    )
    (v,) = check(root)
    assert "import cycle" in v.message and "testbed.services.a" in v.message


def test_a_relative_import_counts_and_a_stray_module_is_named(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "units.py": "from .cli import main\n",
            "cli.py": "def main(): ...\n",
            "mystery.py": "",
        },
    )
    messages = sorted(v.message for v in check(root))
    assert any("imports testbed.cli" in m for m in messages)
    assert any("testbed.mystery is in no layer" in m for m in messages)


def test_command_line_exit_codes(tmp_path: Path) -> None:
    bad = _package(tmp_path, {"units.py": "import testbed.cli\n", "cli.py": ""})
    run = [sys.executable, "-m", "testbed.devtools.layers"]
    out = subprocess.run([*run, str(bad)], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 1 and "testbed.units:1" in out.stderr
    assert len(LAYERS) >= 5
