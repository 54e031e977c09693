"""`make test-fast`, `make chaos` and any `-m "not model"` selection collect cleanly without torch
or ray, and `make test` still fails loudly when either is missing (tests/conftest.py). Both are
blocked in a child pytest, so these run the same whether or not this venv has the model and ray
extras."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import model_tests_selected

ROOT = Path(__file__).resolve().parents[1]


def _collect(*args: str) -> subprocess.CompletedProcess[str]:
    return _pytest("--collect-only", *args)


def _pytest(*args: str) -> subprocess.CompletedProcess[str]:
    """pytest in a child with torch and ray blocked, as in a venv without those extras."""
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['ray'] = None\n"
        "import pytest\n"
        f"sys.exit(pytest.main({['-q', '-p', 'no:cacheprovider', *args]!r}))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )


FAST = "not slow and not chaos and not compose and not model and not ray"
CHAOS = "chaos and not model and not routers"


def test_the_makefile_selects_what_these_tests_collect() -> None:
    make = (ROOT / "Makefile").read_text()
    assert f'-m "{FAST}"' in make and f'-m "{CHAOS}"' in make


def test_every_selection_without_model_collects_cleanly() -> None:
    """tests/conftest.py's collection rule depends only on whether `model` tests are selected,
    so every expression that leaves them out (`make test-fast`'s, `make chaos`'s) collects the
    same modules as the widest of them, "not model" (../shared/tools/collect-without-torch):
    one collection shows them all (#31: it was one per expression, the same modules each time)."""
    assert not model_tests_selected(FAST) and not model_tests_selected(CHAOS)
    out = _collect("-m", "not model", "tests")  # as the Makefile targets do: the whole directory
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ERROR collecting" not in out.stdout, out.stdout
    assert "tests collected" in out.stdout


def test_fast_selection_keeps_the_torch_free_guard() -> None:
    out = _collect("-m", FAST, "tests")
    assert out.returncode == 0 and "ERROR collecting" not in out.stdout, out.stdout
    assert "test_torch_optional.py::" in out.stdout


def test_ray_selection_without_ray_fails_loudly() -> None:
    out = _pytest("-m", "ray", "tests/sim/test_sweep_ray.py")  # run, not only collected
    assert out.returncode == 1, out.stdout + out.stderr
    assert "needs the ray extra" in out.stdout, out.stdout


@pytest.mark.parametrize("args", [[], ["-m", "model"]])
def test_model_selection_without_torch_fails_loudly(args: list[str]) -> None:
    out = _collect(*args, "tests/engine/test_torch_model.py")
    assert out.returncode not in (0, 5), out.stdout
    assert "need torch" in out.stdout + out.stderr


def test_marker_expression_reading() -> None:
    assert model_tests_selected("")
    assert model_tests_selected("model")
    assert model_tests_selected("slow or model")
    assert not model_tests_selected("not model")
    assert not model_tests_selected("chaos and not model")
    assert not model_tests_selected("not slow and not chaos and not compose and not model")
