"""Extensions without central lists (issue #34): three toy entries dropped into a copy of the tree
leave the fast suite green with no hand-edited file changed.

The toys (tests/data/toys/) are a policy with a knob (`toy-split`, its knobs the scenario's
`policy.toy_split`), a slicer fault (`toy_fragment`, refused on the sim) and a checker
(`toy_cross_dc`), each with its examples and its `EVIDENCE` in its own file, and their one test
file. The test copies the tree (not .venv, .git, results or caches) to a temporary directory,
adds the four files, runs the generated references' writer (`make docs`, which every new fault,
checker or policy section needs: docs/reference/ is generated, never edited by hand), checks that
nothing but docs/reference/ changed, and runs the fast suite there. Every property the
registries hold their entries to (tests/test_registry_entries.py), the no-silent-fields rule,
the exact-list tests that used to need edits, the docs' staleness check and the whole fast suite
run over the toys as over the built-ins.

Slow: the inner suite is `make test-fast`'s, on every core as there (pytest-xdist's `-n auto`):
about 190 s on 2 cores, against about 340 s one test at a time (see docs/tests.md).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOYS = ROOT / "tests" / "data" / "toys"

PLACES = {
    "toy_split.py": "testbed/policy/toy_split.py",
    "toy_fragment.py": "testbed/nemesis/actions/toy_fragment.py",
    "toy_cross_dc.py": "testbed/checkers/toy_cross_dc.py",
    "toys_check.py": "tests/test_toys.py",
}
"""Each toy file and where a developer would put it."""

LEFT_OUT = {".venv", ".git", "results", ".mypy_cache", ".ruff_cache", ".pytest_cache",
            ".hypothesis", "__pycache__"}  # fmt: skip
INNER_TIMEOUT_S = 3600


def fast_args() -> list[str]:
    """`make test-fast`'s pytest arguments (its selection, on every core), read from the
    Makefile's `FAST_ARGS` so the two cannot drift apart."""
    for line in (ROOT / "Makefile").read_text().splitlines():
        if line.startswith("FAST_ARGS :="):
            return shlex.split(line.partition(":=")[2])
    raise AssertionError("the Makefile has no `FAST_ARGS :=` line")


def _digests(tree: Path) -> dict[str, str]:
    return {
        str(p.relative_to(tree)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(tree.rglob("*"))
        if p.is_file() and not LEFT_OUT & set(p.relative_to(tree).parts)
    }


@pytest.mark.slow
@pytest.mark.timeout(INNER_TIMEOUT_S + 600)  # the inner suite's own bound, plus the copy
def test_three_toy_entries_leave_the_fast_suite_green(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(
        ROOT, tree, symlinks=True, ignore=lambda _d, names: [n for n in names if n in LEFT_OUT]
    )  # symlinks stay links: scenarios/ is testbed/library/
    for toy, place in PLACES.items():
        assert not (tree / place).exists(), f"{place} exists already"
        shutil.copy(TOYS / toy, tree / place)
    env = {**os.environ, "PYTHONPATH": str(tree)}

    before = _digests(tree)
    docs = subprocess.run(
        [sys.executable, "-m", "testbed.cli.docgen"],
        cwd=tree, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert docs.returncode == 0, docs.stderr
    after = _digests(tree)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert all(c.startswith("docs/reference/") for c in changed), changed
    assert "docs/reference/scenario-file.md" in changed  # the fault's and checker's sections

    suite = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *fast_args()],
        cwd=tree, env=env, capture_output=True, text=True, timeout=INNER_TIMEOUT_S,
    )  # fmt: skip
    tail = "\n".join(suite.stdout.splitlines()[-40:])
    assert suite.returncode == 0, f"the fast suite failed with the toys in place:\n{tail}"
    assert "passed" in tail
