"""The scenario library: the YAML files shipped inside the package (testbed/library/, which the
repository also shows as scenarios/), found from any working directory.

`testbed run burst` and `testbed scenarios` work wherever the user stands, including from an
installed wheel, so the library travels as package data rather than as a path relative to the
project root.
"""

from __future__ import annotations

from pathlib import Path

from testbed.errors import UserError

__all__ = ["LIBRARY_DIR", "library_scenarios", "resolve_scenario"]

LIBRARY_DIR = Path(__file__).resolve().parents[1] / "library"


def library_scenarios() -> list[Path]:
    """Every scenario file of the library, by name."""
    return sorted(LIBRARY_DIR.glob("*.yaml"))


def resolve_scenario(arg: str) -> Path:
    """A scenario argument as a file: an existing path as given, else a library name ("burst",
    or "burst.yaml"). A name that is neither says which names exist."""
    path = Path(arg)
    if path.exists() or path.parent != Path("."):
        return path  # a path the user typed; the loader reports it if it cannot be read
    stem = path.name.removesuffix(".yaml").removesuffix(".yml")
    candidate = LIBRARY_DIR / f"{stem}.yaml"
    if candidate.is_file():
        return candidate
    names = ", ".join(p.stem for p in library_scenarios())
    raise UserError(f"{arg}: no such file, and no library scenario of that name; library: {names}")
