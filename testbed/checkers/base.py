"""What a scenario checker is: a config model, one function, and the registry that holds them.

A checker is one function `(config, run) -> CheckResult` registered with the pydantic model of
its `checkers:` entry by the `@checker(Model)` decorator, one file each in this package (the
built-in invariants, testbed.checkers.invariants, are called the same way). The
model narrows `check` to its `Literal[...]` names (the tag of the scenario's union; one model may
answer to several, as ttft/tpot/e2e do) and may say, through `problems`, what makes it
unanswerable for a given timeline and duration, which `checkers_fit` refuses before the run.

Every module of this package is imported the first time `CHECKERS` is read, so a new checker is
one new file (docs/extending.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Generic, Protocol, TypeVar

from pydantic import AfterValidator

from testbed.checkers.result import CheckResult
from testbed.config import StrictModel, literal_values, tagged_union
from testbed.metrics.records import HistoryEvent, RequestRecord
from testbed.nemesis import ACTIONS, NemesisEvent
from testbed.registry import Registry

__all__ = [
    "CHECKERS",
    "ActionName",
    "CheckInput",
    "Checker",
    "CheckerConfig",
    "TokenReference",
    "checker",
    "checker_union",
    "fault_problems",
]


class TokenReference(Protocol):
    """Single-process generation of a live `engine: torch` run's prompts, which `token_exact`
    compares the run's tokens with (testbed.engine.torch.reference.TorchReference)."""

    def prepare(self) -> None:
        """Build the model; ImportError (its message a one-line hint) without torch."""
        ...

    def prompt_digest(self, request_id: str, n_tokens: int) -> str:
        """Digest of the prompt the router drew for this request (to confirm the rebuild)."""
        ...

    def generate(self, request_id: str, n_tokens: int, n_out: int) -> list[int]:
        """Greedy token ids for this request's prompt, in one process."""
        ...


@dataclass(frozen=True)
class CheckInput:
    """What a run offers every checker, the built-in invariants included: its records and
    history, and how many requests it submitted; `reference` for the torch engine's
    `token_exact`; the submitted ids, the load generator's planned count (None: not counted) and
    the byte scale for the invariants (testbed.checkers.invariants)."""

    records: Sequence[RequestRecord]
    history: Sequence[HistoryEvent]
    submitted: int
    reference: TokenReference | None = None
    submitted_ids: Sequence[str] = ()
    planned: int | None = None
    byte_scale: float = 1.0


def _known_action(name: str) -> str:
    if name not in ACTIONS:
        raise ValueError(f"unknown nemesis action {name!r}; known: {', '.join(ACTIONS)}")
    return name


ActionName = Annotated[str, AfterValidator(_known_action)]
"""A field naming a nemesis action (`fault: partition`, `during: bandwidth`)."""


class CheckerConfig(StrictModel):
    """A checker beyond the built-in invariants (which always run): one `checkers:` entry.

    A check with nothing to judge is vacuous (testbed.checkers.result), not passed.
    """

    check: str
    """Narrowed by every checker's model to its `Literal[...]` names: the union's tag."""

    def applies(self, run: CheckInput) -> bool:
        """Whether this check has a verdict to give for `run` (an invariant about the load
        generator's count needs one); True by default."""
        return True

    def problems(self, nemesis: Sequence[NemesisEvent], duration_s: float) -> list[str]:
        """Why this check could only be vacuous, or fail for a reason unrelated to the service,
        in a run of this timeline and duration (each a phrase after "checkers.<i> (<check>)");
        none by default."""
        return []


def fault_problems(
    action: str | None, nemesis: Sequence[NemesisEvent], *, must_end: bool = False
) -> list[str]:
    """A check about `action` faults needs the timeline to have one (that ends, if `must_end`)."""
    if action is None:
        return []
    events = [ev for ev in nemesis if ev.action == action]
    if not events:
        return [f"is about a {action!r} fault, and the nemesis timeline has none"]
    if must_end and all(ev.end is None for ev in events):
        return [f"needs a {action!r} fault that ends (one with 'for'); none does"]
    return []


C = TypeVar("C", bound=CheckerConfig)
CheckFn = Callable[[C, CheckInput], CheckResult]


@dataclass(frozen=True)
class Checker(Generic[C]):
    """A registered checker: the model of its entries and the function that judges a run."""

    config: type[C]
    run: Callable[[C, CheckInput], CheckResult]

    @property
    def names(self) -> tuple[str, ...]:
        return literal_values(self.config, "check")

    def __repr__(self) -> str:
        return f"checker {self.run.__module__}.{self.run.__qualname__}"


def _check_checker(entry: Checker[Any]) -> None:
    if not (isinstance(entry.config, type) and issubclass(entry.config, CheckerConfig)):
        raise TypeError(f"{entry!r}: its config must derive from CheckerConfig")
    if not callable(entry.run):
        raise TypeError(f"{entry!r}: not callable")


CHECKERS: Registry[Checker[Any]] = Registry(
    "check", "testbed.checkers", names=lambda entry: entry.names, check=_check_checker
)
"""Every scenario checker by check name; `@checker(Model)` in a module of this package."""


def checker(config: type[C]) -> Callable[[CheckFn[C]], CheckFn[C]]:
    """Register the decorated function as the checker of `config`'s entries."""

    def add(run: CheckFn[C]) -> CheckFn[C]:
        CHECKERS.register(Checker(config, run))
        return run

    return add


def checker_union() -> Any:
    """The type of one `checkers:` entry: the registered models, tagged by `check`."""
    return tagged_union([entry.config for entry in CHECKERS.entries()], "check")
