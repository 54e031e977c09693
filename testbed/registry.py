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

`register` is also the seam for entries from outside the package: a test's toy, and for a family
with an entry-point group (policies), plugins: a lookup of an unknown name loads `module:Class`
or the entry point of that name (testbed.plugins). `added` registers one for the length of a
`with` block, which is what a test wants.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

from testbed.errors import UserError

__all__ = ["PluginError", "Registry", "UnknownName", "load_plugin", "plugin_names"]

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
        plugins: str | None = None,
    ) -> None:
        self.family = family
        self.package = package
        self._names = names
        self._check = check
        self.plugins = plugins
        """Entry-point group of outside entries (a name there, or `module:Attr`, loads one)."""
        self._entries: dict[str, T] = {}
        self._plugin_names: set[str] = set()
        self._resolvers: list[Callable[[str], T | None]] = []
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
        entry = self._entries.get(name)
        if entry is not None:
            return entry
        for resolve in self._resolvers:  # names that describe their entry (a policy's URL)
            made = resolve(name)
            if made is not None:
                return self.add_plugin(name, made)
        if self.plugins is not None:
            found = load_plugin(self, name)
            if found is not None:
                return found
        known = ", ".join(sorted({*self._entries, *plugin_names(self)}))
        how = " (or an outside one as module:Class)" if self.plugins else ""
        raise UnknownName(f"unknown {self.family} {name!r}; known: {known}{how}")

    def add_resolver(self, resolve: Callable[[str], T | None]) -> None:
        """Let `resolve(name)` make an entry for a name no module registered (None: not one of
        its names); a module of the package adds one when it is discovered, as the HTTP policy
        does for `http://...` (testbed.policy.http). What it makes is kept as a plugin."""
        if resolve not in self._resolvers:
            self._resolvers.append(resolve)

    def is_plugin(self, name: str) -> bool:
        """Whether `name` was loaded from outside the package (module:Class, an entry point)."""
        self[name]
        return name in self._plugin_names

    def forget_plugins(self) -> None:
        """Drop every outside entry (a test's plugins, when the test is done)."""
        for name in self._plugin_names:
            self._entries.pop(name, None)
        self._plugin_names.clear()

    def add_plugin(self, name: str, entry: T) -> T:
        """Register an outside entry under its own names and under `name`, what the user wrote
        (the run records that spelling; the router looks it up again in its own process)."""
        self.register(entry)
        self._entries[name] = entry
        self._plugin_names.update({name, *self._names(entry)})
        return entry

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


# ------------------------------------------------------------------------------- plugins
# Loading entries from outside the package: `module:Class` and entry points. An engineer's own
# policy lives in their own package: `--policy mypkg.routing:LeastTTFT` imports it by path, and an
# installed package can also declare it under the family's entry-point group
# (`prfaas_testbed.policies`) and be called by the entry point's name. Either way the entry goes
# through the same checks as a built-in one, and anything that stops it from loading (an import
# error, a missing class, a missing method or fact, a name already taken) is one line naming the
# plugin, raised before a run starts.


class PluginError(UserError):
    """An outside entry that cannot be used; the message names it and says why."""


def _entry_points(group: str) -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=group)}


def plugin_names(registry: Registry[Any]) -> list[str]:
    """Names the family's entry-point group offers (not loaded)."""
    return sorted(_entry_points(registry.plugins)) if registry.plugins else []


def load_plugin(registry: Registry[T], name: str) -> T | None:
    """The entry `name` names (`module:Attr`, or an entry point of the registry's group),
    registered; None if `name` is neither."""
    what = f"{registry.family} plugin {name!r}"
    if ":" in name:
        module_name, _, attr = name.partition(":")
        if not module_name or not attr:
            raise PluginError(f"{what}: write it as module:Class")
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # anything the user's module raises while importing
            raise PluginError(f"{what}: cannot import {module_name}: {_one_line(exc)}") from None
        entry = getattr(module, attr, None)
        if entry is None:
            raise PluginError(f"{what}: module {module_name} has no {attr!r}")
    else:
        ep = _entry_points(registry.plugins).get(name) if registry.plugins else None
        if ep is None:
            return None
        try:
            entry = ep.load()
        except Exception as exc:
            raise PluginError(
                f"{what} (entry point {ep.value} of {ep.dist.name if ep.dist else '?'}): "
                f"cannot load: {_one_line(exc)}"
            ) from None
    try:
        return registry.add_plugin(name, entry)
    except (TypeError, ValueError) as exc:
        raise PluginError(f"{what}: {_one_line(exc)}") from None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _label(entry: object) -> str:
    """module.Class for a class or a function, repr() for anything else."""
    name = getattr(entry, "__qualname__", None)
    if isinstance(name, str):
        return f"{getattr(entry, '__module__', '?')}.{name}"
    return repr(entry)
