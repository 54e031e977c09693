"""One registry per family of pluggable pieces (policies, nemesis actions, checkers).

Each family keeps its entries in a `Registry`, a read-only mapping from name to entry. Entries
add themselves: a module of the family's package applies the registry's `register` (a
decorator) to what it defines, and the registry imports every module of that package the first
time it is read. That is what makes adding a policy, a fault or a checker one new file: nothing
else lists the modules or their entries.

Discovery is lazy (the first lookup, not the import of the package) so importing one entry's
module never drags in the others, and a tool that extends the package's search path (a test
that drops a module into a temporary directory) can do so before the registry is first read.
Modules are imported in sorted order and entries listed sorted by name, so the order of names in
a message or a schema is the same on every machine whatever was imported first.

`register` is also the seam for entries from outside the package: a test's toy today, plugin
classes (`module:Class`, entry points) in the next step. `added` registers one for the length of
a `with` block, which is what a test wants.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TypeVar

from testbed.errors import UserError

__all__ = ["Registry", "UnknownName"]

T = TypeVar("T")


class UnknownName(KeyError, UserError):
    """A name no entry of the family has; a KeyError for mapping code, a UserError (one line,
    exit code 2) for the command line."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Registry(Mapping[str, T]):
    """Entries of one family by name (see the module docstring).

    `names(entry)` gives the names an entry answers to (a checker config may take several, as
    `ttft`, `tpot` and `e2e` share one); `check(entry)` raises TypeError or ValueError, with a
    line naming the entry, for one that lacks what the family needs.
    """

    def __init__(
        self,
        family: str,
        package: str,
        names: Callable[[T], Iterable[str]],
        check: Callable[[T], None] | None = None,
    ) -> None:
        self.family = family
        self.package = package
        self._names = names
        self._check = check
        self._entries: dict[str, T] = {}
        self._discovered = False

    # ------------------------------------------------------------------------- registering

    def register(self, entry: T) -> T:
        """Add `entry` under each of its names; usable as a class or function decorator.

        Registering the same entry again is a no-op (a module imported twice); another entry
        under a taken name is a ValueError naming both."""
        if self._check is not None:
            self._check(entry)
        names = tuple(self._names(entry))
        if not names:
            raise ValueError(f"{self.family} {entry!r} has no name")
        for name in names:
            held = self._entries.get(name)
            if held is not None and held is not entry:
                raise ValueError(
                    f"{self.family} name {name!r} is taken by {_label(held)}; "
                    f"{_label(entry)} needs another"
                )
        for name in names:
            self._entries[name] = entry
        return entry

    def unregister(self, entry: T) -> None:
        """Remove every name of `entry` (a test's toy, when the test is done)."""
        for name in [n for n, e in self._entries.items() if e is entry]:
            del self._entries[name]

    @contextmanager
    def added(self, entry: T) -> Iterator[T]:
        """`entry` registered inside the block only."""
        self._discover()
        self.register(entry)
        try:
            yield entry
        finally:
            self.unregister(entry)

    # ------------------------------------------------------------------------------ reading

    def __getitem__(self, name: str) -> T:
        self._discover()
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries))
            raise UnknownName(f"unknown {self.family} {name!r}; known: {known}") from None

    def __iter__(self) -> Iterator[str]:
        self._discover()
        return iter(sorted(self._entries))

    def __len__(self) -> int:
        self._discover()
        return len(self._entries)

    def entries(self) -> list[T]:
        """Each entry once, in the order of its first name."""
        out: list[T] = []
        for name in self:
            entry = self._entries[name]
            if all(entry is not e for e in out):
                out.append(entry)
        return out

    def _discover(self) -> None:
        """Import every module of the package once, so each registers its entries."""
        if self._discovered:
            return
        self._discovered = True  # first: a module that reads the registry does not recurse
        try:
            package = importlib.import_module(self.package)
            found = pkgutil.iter_modules(package.__path__)
            for module in sorted(found, key=lambda m: m.name):
                importlib.import_module(f"{self.package}.{module.name}")
        except BaseException:
            self._discovered = False
            raise


def _label(entry: object) -> str:
    """module.Class for a class or a function, repr() for anything else."""
    name = getattr(entry, "__qualname__", None)
    if isinstance(name, str):
        return f"{getattr(entry, '__module__', '?')}.{name}"
    return repr(entry)
