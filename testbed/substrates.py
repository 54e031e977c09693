"""The substrates (where a deployment runs) as registry entries with facts.

Every substrate is one `SubstrateFacts` entry here: its name, what it supports (real bytes on a
wire, the kernel's tc shaper, the torch engine, outside policies, external routers, standing a
deployment up, Prometheus, hindsight sweeps and scorecards, virtual time) and how to make it
(the dotted path of its services class, imported only when a run asks for it, so a sim run
never loads aiohttp or the Docker SDK). Everything else asks a fact (`substrate_facts(name).
external_router`), never compares a substrate's name: a new substrate is a package plus one
entry (docs/extending.md, "A new substrate"), and nothing else lists the substrates.

The module sits in the lowest import layer (testbed.devtools.layers), beside testbed.registry,
so the metrics (a report of a virtual-time run) and the engines read the same facts as the
command line; it imports nothing of the testbed but its errors.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from testbed.errors import UserError

__all__ = [
    "SubstrateFacts",
    "added_substrate",
    "load_attr",
    "register_substrate",
    "runs_in_virtual_time",
    "substrate_facts",
    "substrate_names",
    "substrates_with",
]

KernelShaper = Literal["netns", "container"]
"""Where a substrate runs the kernel's (tc) shaper: `netns`, a veth between the run's network
namespaces on this host (testbed.link.netns_link); `container`, in the link container."""


@dataclass(frozen=True)
class SubstrateFacts:
    """One substrate: its name, what it supports, and how to make it."""

    name: str
    description: str
    """A few words for `--substrate` help: where the deployment runs."""
    services: str | None
    """`module:Class` of its testbed.substrate.base.Substrate, made by `make_substrate` (None:
    it runs no services, the run is simulated by `simulate`)."""
    simulate: str | None = None
    """`module:function` that runs a prepared scenario in one process (a virtual-time substrate:
    testbed.scenario.sim_run.run_sim), None for one that starts services."""
    preflight: str | None = None
    link_verbs: str | None = None
    """`module:attr` of the testbed.nemesis.LinkVerbs its link plays, checked against the
    scenario's faults while the run is planned (one line naming the fault and the verb); None:
    every verb (the link emulator), checked again when the faults are played."""
    """`module:function(deployment_name, deployment)` raising one line for a deployment it
    cannot run, called while the run is planned (the sim: a real model, tc shaping)."""
    virtual_time: bool = False
    """Time is virtual: latencies are modelled, wall-clock figures mean nothing about the
    deployment (a report leaves them out)."""
    wire_bytes: bool = True
    """KV bytes really cross sockets (scaled by byte_scale); False: transfers are modelled."""
    kernel_shaper: KernelShaper | None = None
    """Where `link.shaper: tc` shapes the link; None: it cannot (the emulator only)."""
    torch_engine: bool = False
    """It runs `engine: torch` (a real tiny model; the images of others carry no torch)."""
    outside_policies: bool = True
    """A policy from outside the package (module:Class, an entry point) can run there."""
    external_router: bool = False
    """An external router (vllm-router, SGLang's) can stand in front of its fleet."""
    standing: bool = False
    """`testbed up` can stand a deployment up on it for outside clients."""
    prometheus: bool = False
    """`testbed up --prometheus` can add a Prometheus server beside it."""
    hindsight: bool = False
    """Cheap enough to sweep a grid of fixed settings (`testbed hindsight`, a scorecard's
    hindsight row)."""
    scorecard: bool = False
    """`testbed scorecard` runs on it (a live one plays each scenario's short version)."""


_ENTRIES: dict[str, SubstrateFacts] = {}


def register_substrate(facts: SubstrateFacts) -> SubstrateFacts:
    """Add a substrate; another entry under a taken name is a ValueError naming it."""
    held = _ENTRIES.get(facts.name)
    if held is not None and held != facts:
        raise ValueError(f"substrate name {facts.name!r} is taken")
    if (facts.services is None) == (facts.simulate is None):
        raise ValueError(f"substrate {facts.name!r}: give exactly one of services and simulate")
    _ENTRIES[facts.name] = facts
    return facts


@contextmanager
def added_substrate(facts: SubstrateFacts) -> Iterator[SubstrateFacts]:
    """`facts` registered inside the block only (a test's toy substrate)."""
    register_substrate(facts)
    try:
        yield facts
    finally:
        del _ENTRIES[facts.name]


def substrate_names() -> tuple[str, ...]:
    """Every substrate, in the order registered (local, compose, sim, then any added)."""
    return tuple(_ENTRIES)


def substrates_with(fact: Callable[[SubstrateFacts], bool]) -> tuple[str, ...]:
    """The substrates for which `fact(entry)` holds, e.g. `lambda s: s.standing`."""
    return tuple(name for name, facts in _ENTRIES.items() if fact(facts))


def substrate_facts(name: str) -> SubstrateFacts:
    """The entry `name`, or one line (UserError) naming the substrates there are."""
    facts = _ENTRIES.get(name)
    if facts is None:
        raise UserError(
            f"substrate {name!r} is not available; use one of {', '.join(substrate_names())}"
        )
    return facts


def runs_in_virtual_time(name: object) -> bool:
    """Whether a run's recorded substrate (a summary's `substrate`, maybe absent or from a newer
    testbed) is a virtual-time one; an unknown name is taken as live."""
    facts = _ENTRIES.get(name) if isinstance(name, str) else None
    return facts is not None and facts.virtual_time


def load_attr(path: str) -> Any:
    """The attribute a `module:attr` fact names, its module imported now (not before)."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


register_substrate(
    SubstrateFacts(
        name="local",
        description="processes on this machine",
        services="testbed.substrate.local:LocalSubstrate",
        kernel_shaper="netns",
        torch_engine=True,
        external_router=True,
        standing=True,
        scorecard=True,
    )
)
register_substrate(
    SubstrateFacts(
        name="compose",
        description="Docker Compose containers",
        services="testbed.substrate.compose:ComposeSubstrate",
        kernel_shaper="container",
        outside_policies=False,  # the images carry only the testbed's own policies
        standing=True,
        prometheus=True,
    )
)
register_substrate(
    SubstrateFacts(
        name="sim",
        description="one process in virtual time",
        services=None,
        simulate="testbed.scenario.sim_run:run_sim",
        preflight="testbed.sim:refuse_unmodelled",
        link_verbs="testbed.sim.nemesis:SIM_LINK",
        virtual_time=True,
        wire_bytes=False,
        hindsight=True,
        scorecard=True,
    )
)
