"""What a fault does: `Fault` (start, end) against the small part of a run it may touch, and the
registry of actions.

A fault touches a run only through `NemesisContext`: the link (`LinkControl`: the link verbs of
testbed.nemesis.verbs, each fault declaring the ones it uses in `verbs`) and the processes
(`Processes`: kill, pause, resume, restart a service by the substrate's handle). The runner's run
state provides it; a test provides a fake; nothing here imports a substrate or the runner.

`ACTIONS` maps an action's name to its Fault class, whose `config` is the pydantic model of its
scenario entry. Every module of testbed/nemesis/actions/ is imported the first time the registry
is read, and each registers its fault with `@ACTIONS.register`, so a new action is one file
(docs/extending.md); the scenario's `nemesis:` union is `nemesis_union()`.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import MutableMapping
from typing import Any, ClassVar, Generic, Protocol, TypeVar, cast

from testbed.clock import Clock
from testbed.config import literal_values, tagged_union
from testbed.nemesis.event import NemesisEvent
from testbed.nemesis.plan import PlannedFault
from testbed.nemesis.verbs import LINK_VERBS, LinkControl
from testbed.registry import Registry

__all__ = [
    "ACTIONS",
    "Fault",
    "LinkControl",
    "NemesisContext",
    "Processes",
    "nemesis_union",
]


class Processes(Protocol):
    """What process faults ask of the substrate. Handles are the substrate's own, opaque here:
    a fault takes one from `NemesisContext.services` and hands it back."""

    async def kill(self, handle: Any, /) -> None: ...

    async def pause(self, handle: Any, /) -> None: ...

    async def resume(self, handle: Any, /) -> None: ...

    async def restart(self, handle: Any, /) -> Any:
        """Start the instance again with the same identity; returns its new handle."""
        ...


class NemesisContext(Protocol):
    """What a fault may touch: the runner's run state provides all of it."""

    @property
    def substrate(self) -> Processes: ...

    @property
    def services(self) -> MutableMapping[str, Any]:
        """Handle of every running instance by id; a restart replaces the entry."""
        ...

    @property
    def link(self) -> LinkControl | None: ...

    @property
    def clock(self) -> Clock:
        """The run's clock (real-world time; the link converts its verbs' durations itself)."""
        ...


E = TypeVar("E", bound=NemesisEvent)


class Fault(ABC, Generic[E]):
    """One fault of the timeline: `start` injects it, `end` undoes it (if it has a duration).

    Both return what they changed, which goes into the "fault" history event. `config` is the
    model of the action's scenario entry; `self.event` is the entry, typed as that model.
    """

    config: ClassVar[type[NemesisEvent]]
    verbs: ClassVar[frozenset[str]] = frozenset()
    """The link verbs (testbed.nemesis.verbs) the fault may use: a substrate whose link cannot
    play one of them refuses the scenario before the run. None for a fault that leaves the link
    alone."""

    @classmethod
    def verbs_for(cls, event: NemesisEvent) -> frozenset[str]:
        """The verbs this entry uses (`verbs`, unless the entry's fields pick among them)."""
        return cls.verbs

    def __init__(self, planned: PlannedFault) -> None:
        if not isinstance(planned.event, self.config):
            raise TypeError(
                f"{type(self).__name__} plays {self.config.__name__} entries, "
                f"not {type(planned.event).__name__}"
            )
        self.planned = planned
        self.event = cast(E, planned.event)

    @property
    def action(self) -> str:
        return self.planned.action

    @abstractmethod
    async def start(self, ctx: NemesisContext) -> dict[str, Any]: ...

    async def end(self, ctx: NemesisContext) -> dict[str, Any]:
        return {}


def _action_names(fault: type[Fault[Any]]) -> tuple[str, ...]:
    return literal_values(fault.config, "action")


def _check_fault(fault: type[Fault[Any]]) -> None:
    label = f"fault class {fault.__module__}.{fault.__qualname__}"
    if not (isinstance(fault, type) and issubclass(fault, Fault)):
        raise TypeError(f"{label}: must derive from testbed.nemesis.Fault")
    config = getattr(fault, "config", None)
    if not (isinstance(config, type) and issubclass(config, NemesisEvent)):
        raise TypeError(f"{label}: 'config' must be a NemesisEvent model")
    if len(literal_values(config, "action")) != 1:
        raise TypeError(f"{label}: {config.__name__}.action must be Literal['<one name>']")
    unknown = sorted(set(fault.verbs) - LINK_VERBS)
    if unknown:
        raise TypeError(f"{label}: unknown link verbs {unknown}; known: {sorted(LINK_VERBS)}")
    if hasattr(fault, "apply") and not fault.verbs:  # a LinkFault (testbed.nemesis.link)
        raise TypeError(
            f"{label}: declares no link verbs; say which it uses, e.g. "
            "verbs = frozenset({'delay'}), so a substrate that cannot play them refuses it"
        )
    if inspect.isabstract(fault):
        raise TypeError(f"{label}: implements no start(ctx)")


ACTIONS: Registry[type[Fault[Any]]] = Registry(
    "nemesis action", "testbed.nemesis.actions", names=_action_names, check=_check_fault
)
"""Every fault class by action name; `@ACTIONS.register` in a module of nemesis/actions/."""


def nemesis_union() -> Any:
    """The type of one `nemesis:` entry: the registered actions' models, tagged by `action`."""
    return tagged_union([fault.config for fault in ACTIONS.entries()], "action")
