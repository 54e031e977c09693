"""Suite-wide collection rules.

The tiny-model tests (tests/engine/test_torch_model.py, test_torch_remote.py,
test_torch_batched.py and tests/scenario/test_torch_live.py) import torch at module level and
raise ImportError without it, on purpose: under `make test`, which installs the `model` extra, a
missing torch must fail loudly. But pytest deselects by marker only after it has imported a
module, so `make test-fast` and `make chaos` (which run `-m "... not model"` from a venv without
torch) used to stop at collection with three errors. When torch is missing *and* the marker
expression leaves the `model` tests out, those files are not collected at all; in every other
case they are, and fail at import as before. The Ray test (tests/sim/test_sweep_ray.py, marker
`ray`, the `ray` extra that `make test` installs) needs no rule: it imports Ray when it runs.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

NEEDS_TORCH = frozenset(
    {"test_torch_model.py", "test_torch_remote.py", "test_torch_live.py", "test_torch_batched.py"}
)
"""Test modules that import torch at module level (every test in them is marked `model`)."""
NEEDS = {name: ("torch", "model") for name in NEEDS_TORCH}
"""Test module -> (the package it imports at module level, the marker all its tests carry)."""


def installed(package: str) -> bool:
    """Whether `import package` can work. An import hook that refuses it outright (as the
    project's collect-without-torch check does) counts as not installed, like a venv without it."""
    try:
        return importlib.util.find_spec(package) is not None
    except ImportError:
        return False


def torch_installed() -> bool:
    return installed("torch")


def marker_selected(markexpr: str, marker: str = "model") -> bool:
    """Whether a `-m` expression can select a test that carries only `marker`.

    Uses pytest's own expression grammar; an empty expression selects everything.
    """
    if not markexpr.strip():
        return True
    from _pytest.mark.expression import Expression

    def matcher(name: str, /, **_kwargs: object) -> bool:
        return name == marker

    return bool(Expression.compile(markexpr).evaluate(matcher))


def model_tests_selected(markexpr: str) -> bool:
    return marker_selected(markexpr, "model")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    need = NEEDS.get(collection_path.name)
    if need is None:
        return None
    package, marker = need
    if installed(package):
        return None
    if marker_selected(config.getoption("markexpr") or "", marker):
        return None  # collect it: the ImportError names the missing extra
    return True
