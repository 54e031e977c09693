"""The two drivers of the dispatch rules, played the same event sequence (issue #34, phase i).

The live router (`services.router.dispatch.RouterState`) and the sim's dispatcher
(`sim.dispatch.SimDispatcher`) each drive a request's attempts: retries, exclusions, failure
reasons, the no-route wait, the cache plan, the record. A `Case` names one small deployment's
requests and the faults that hit them, in words both sides can play by their own means:

- live (live_side.py): `ScriptedWorkers` stands where `services.router.workers.HttpWorkers`
  stands and answers as the real workers would (the same exception names: a refused connection
  is a ClientConnectorError, a killed worker's broken stream a ServerDisconnectedError);
- sim (sim_side.py): the faults go through the sim's own surfaces: the nemesis's process control
  (`SimProcesses`: kill, pause, restart, which tells the dispatcher `lost_instance`), its link
  control (`SimLinkControl.partition`) and the router's health book (`SimCluster.mark_down`).

`differences` compares the records field for field (`COMPARED`); `EXCLUDED` lists every other
record field with the reason it cannot agree. A transport's own words for a broken transfer
(what follows "kv transfer:") are an input to the rules, not a rule: the live fake says what the
sim's link model says, so what is compared is what the dispatcher does with them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from testbed.metrics.records import RequestRecord

# ---------------------------------------------------------------------- the deployment

PX = "prfaas-prefill-0"
PL0, PL1 = "local-prefill-0", "local-prefill-1"
D0, D1 = "local-decode-0", "local-decode-1"
"""Instance ids as the sim names them (sim/run.py), used on both sides."""
PREFILLS = ((PX, "prfaas"), (PL0, "local"), (PL1, "local"))
DECODES = (D0, D1)
THRESHOLD = 1000.0
"""The static threshold: a longer (uncached) prompt prefills on PrfaaS."""
MODEL = "internal-1t-hybrid"
HARDWARE = {"prfaas": "h200x8", "local": "h20x8"}
CACHE_BYTES: dict[Any, float] = {"prfaas": 64e9, "local": 64e9}
TPOT_SLO_S = 0.025
LINK_BYTES_PER_S = 100e9 / 8
LINK_RTT_S = 0.01

PARTITIONED_MIDWAY = "kv transfer: connection reset (link partitioned)"
PARTITIONED = "kv transfer: receiver unreachable (link partitioned)"
"""The sim link model's words (sim/link.py) for a transfer the partition broke or refused."""

REQUEST_BOUND_S = 600.0
"""Virtual (or, for a real-loop case, wall) seconds a request may take: a hang is the bug."""

# ---------------------------------------------------------------------- the event sequences


@dataclass(frozen=True)
class Req:
    id: str
    input_tokens: int
    output_tokens: int = 8
    hash_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Killed:
    """The instance's process is dead when `req` arrives: connections to it are refused."""

    instance: str
    req: str = "r1"


@dataclass(frozen=True)
class OutOfRotation:
    """Dead, and already out of rotation when `req` arrives (an earlier attempt failed on it)."""

    instance: str
    req: str = "r1"


@dataclass(frozen=True)
class Restarted:
    """Dead when `req` arrives; restarted once it has failed an attempt (its health check then
    answers again)."""

    instance: str
    req: str = "r1"


@dataclass(frozen=True)
class Paused:
    """Stopped (SIGSTOP) before `req` arrives: it accepts and never answers."""

    instance: str
    req: str = "r1"


@dataclass(frozen=True)
class KilledInPrefill:
    """Killed while it prefills `req` (the request's first attempt)."""

    instance: str
    req: str = "r1"


@dataclass(frozen=True)
class KilledMidStream:
    """A decode instance killed after it streamed `tokens` of `req`'s output tokens."""

    instance: str
    tokens: int
    req: str = "r1"


@dataclass(frozen=True)
class LinkCut:
    """The link is partitioned before `req` arrives, or (`midway`) while its KV crosses."""

    req: str = "r1"
    midway: bool = False


@dataclass(frozen=True)
class PrefillError:
    """A prefill in its decode's datacenter answers `req` with an error (its KV send failed).
    The live workers can; the sim has no such event (see test_contract)."""

    instance: str
    error: str
    req: str = "r1"


Fault = (
    Killed | OutOfRotation | Restarted | Paused | KilledInPrefill | KilledMidStream | LinkCut
    | PrefillError
)  # fmt: skip


@dataclass(frozen=True)
class Case:
    name: str
    requests: tuple[Req, ...]
    faults: tuple[Fault, ...] = ()
    policy: str = "prfaas-static"
    waits_for_route: bool = False
    """A request waits for an instance to come back: the live side runs on a real loop."""


def faults_of(case: Case, rid: str) -> list[Fault]:
    return [f for f in case.faults if f.req == rid]


# ---------------------------------------------------------------------- the comparison

COMPARED = (
    "id", "input_tokens", "output_tokens", "status", "failure_reason", "retries", "route",
    "prefill_instance", "decode_instance", "cross_dc", "threshold_tokens", "cached_tokens",
    "cached_local", "cached_prfaas", "pull_tokens", "pull_status", "tokens_out", "kv_verified",
    "kv_wire_bytes_expected", "decided_by", "fallback_reason", "prompt_digest", "output_ids",
)  # fmt: skip
"""What both drivers must agree on: the dispatch rules' outputs."""

_TIMES = "a time: live, the wall clock at time_scale and the fake's own stamps; sim, virtual"
EXCLUDED = {
    "arrival": _TIMES,
    "prefill_start": _TIMES,
    "prefill_end": _TIMES,
    "transfer_start": _TIMES,
    "transfer_end": _TIMES,
    "first_token": _TIMES,
    "last_token": _TIMES,
    "pull_s": _TIMES,
    "kv_wire_bytes_sent": "wire bytes a worker reports: the live fake's numbers, the sim's model",
    "kv_wire_bytes_received": "wire bytes a worker reports: the live fake's, the sim's model",
    "pull_wire_bytes": "wire bytes a worker reports: the live fake's, the sim's model",
    "token_chunks": "the client stream's chunks: live counts what it wrote, the sim has no "
    "client stream (its records leave the inter-token fields empty)",
    "itl_min": "inter-token gaps of the client stream (wall time; none on the sim)",
    "itl_max": "inter-token gaps of the client stream (wall time; none on the sim)",
    "itl_std": "inter-token gaps of the client stream (wall time; none on the sim)",
    "decision_wall_s": "wall seconds of the decision: the sim leaves it out (same records for "
    "the same seed)",
    "decision_answer_s": "wall seconds of a policy service's answer (None for a Python policy)",
}
"""Record fields the drivers differ on by construction, each with why."""


class ContractBroken(AssertionError):
    """The two drivers' records differ on a field both must agree on."""


def differences(live: Sequence[RequestRecord], sim: Sequence[RequestRecord]) -> list[str]:
    """One line per compared field that differs, `request.field: live X != sim Y`."""
    out: list[str] = []
    if [r.id for r in live] != [r.id for r in sim]:
        out.append(f"records: live {[r.id for r in live]} != sim {[r.id for r in sim]}")
    for a, b in zip(live, sim, strict=False):
        for name in COMPARED:
            x, y = getattr(a, name), getattr(b, name)
            if x != y:
                out.append(f"{a.id}.{name}: live {x!r} != sim {y!r}")
    return out


def assert_same(live: Sequence[RequestRecord], sim: Sequence[RequestRecord]) -> None:
    diff = differences(live, sim)
    if diff:
        raise ContractBroken("the drivers disagree:\n" + "\n".join(diff))


def record_fields() -> set[str]:
    return {f.name for f in dataclasses.fields(RequestRecord)}
