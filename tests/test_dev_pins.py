"""pyproject.toml's dev pins admit only versions that can run this suite: tests/link/conftest.py
implements the `pytest_asyncio_loop_factories` hook, which pytest-asyncio added in 1.4 (and
pytest-asyncio 1.4 needs pytest >= 8.4); with 1.3 collection dies with INTERNALERROR."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def _dev_requirements() -> dict[str, Requirement]:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs = (Requirement(r) for r in doc["project"]["optional-dependencies"]["dev"])
    return {r.name: r for r in reqs}


def test_pytest_asyncio_pin_has_the_loop_factories_hook() -> None:
    spec = _dev_requirements()["pytest-asyncio"].specifier
    assert "1.3.0" not in spec, "tests/link/conftest.py needs pytest_asyncio_loop_factories (>=1.4)"
    assert "1.4.0" in spec
    assert "pytest_asyncio_loop_factories" in (ROOT / "tests/link/conftest.py").read_text()


def test_pytest_pin_matches_what_pytest_asyncio_needs() -> None:
    spec = _dev_requirements()["pytest"].specifier
    assert "8.3.5" not in spec
    assert "8.4.0" in spec
