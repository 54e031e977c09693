"""The nemesis: a scenario's fault timeline, played against a live run (Jepsen's vocabulary).

A scenario lists faults (`nemesis:` in its YAML), each with a real-world start `at` and an
optional duration `for`. Before anything runs, `plan_faults` turns them into a fixed timeline:
times in real-world seconds and the exact instances each process fault hits (a group target such
as `local-decode` picks `count` instances with a generator seeded from the scenario seed and the
fault's index), so the same seed always gives the same faults. `NemesisPlayer` then plays that
timeline on the run's clock (testbed.clock) alongside the load, and records a history event of
kind "fault" for every phase of every fault: `{"action", "phase": "start" | "end", "target",
"index", "at"}` plus what the action changed (and `error` if the substrate or the link refused,
which never stops the run).

One file per action under `actions/` (the model of its scenario entry and its `Fault`),
registered in `ACTIONS`: adding a fault type is one file (docs/extending.md). A link fault speaks
link verbs (`verbs`: delay, bandwidth, partition, timeout, reset, slow close, slicing, data
limit), never an emulator's API, and declares the ones it uses; a substrate whose link cannot
play one refuses the scenario before the run (`refuse_unplayable`).

- bandwidth: set the shared cap of the cross-datacenter link; restore it at the end.
- latency: add `rtt` / 2 of delay (+- `jitter`) on both directions of every link proxy.
- partition: `mode: disable` closes the link proxies (connections reset, new ones refused);
  `mode: timeout` black-holes data instead and closes a connection after `timeout` of quiet.
- reset_peer: every connection through the link is reset `timeout` after data starts flowing
  (TCP RST in the middle of a transfer), for connections picked with probability `toxicity`.
- slow_close: connection closes through the link are held for `delay`.
- kill: SIGKILL the target instances; with `for`, start them again (same id, same ports) at
  the end. pause: SIGSTOP, SIGCONT at the end. restart: kill and start again at once.
- burst: nothing to do live: its extra arrivals are generated at prepare time by
  `burst_requests`; the player only records the window.

Modules: `event` (the entry's base model), `plan` (targets, extra arrivals, fit to the run),
`fault` (Fault, what it may touch, the registry), `verbs` (the link verbs and `LinkControl`),
`link` and `process` (the two kinds of target; `link` also refuses what a link cannot play),
`player`.
"""

from __future__ import annotations

from testbed.nemesis.event import BaseLoad, NemesisEvent
from testbed.nemesis.fault import (
    ACTIONS,
    Fault,
    LinkControl,
    NemesisContext,
    Processes,
    nemesis_union,
)
from testbed.nemesis.link import LinkEvent, LinkFault, refuse_unplayable, unplayable
from testbed.nemesis.plan import (
    PlannedFault,
    Timeline,
    burst_requests,
    check_timeline_fits,
    plan_faults,
)
from testbed.nemesis.player import NemesisPlayer, stop_player
from testbed.nemesis.process import NEMESIS_TARGET_GROUPS, ProcessEvent, ProcessFault, instance_ids
from testbed.nemesis.verbs import LINK_VERBS, LinkVerbs

__all__ = [
    "ACTIONS",
    "LINK_VERBS",
    "NEMESIS_TARGET_GROUPS",
    "BaseLoad",
    "Fault",
    "LinkControl",
    "LinkEvent",
    "LinkFault",
    "LinkVerbs",
    "NemesisContext",
    "NemesisEvent",
    "NemesisPlayer",
    "PlannedFault",
    "ProcessEvent",
    "ProcessFault",
    "Processes",
    "Timeline",
    "burst_requests",
    "check_timeline_fits",
    "instance_ids",
    "nemesis_union",
    "plan_faults",
    "refuse_unplayable",
    "stop_player",
    "unplayable",
]
