"""The record of one request's life, and the events of a run's history.

Every number a report shows is derived from these records and events, so they carry everything:
the route, the instances, the lengths, each lifecycle timestamp and the KV bytes moved. Times are
real-world seconds since the start of the run (emulated seconds x time_scale) and byte counts are
real-world bytes (wire bytes x byte_scale) unless a field name says `wire`.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from testbed.metrics.files import Journal, write_jsonl_atomic

Status = Literal["completed", "failed"]
Route = Literal["prfaas", "local"]

__all__ = [
    "HistoryEvent",
    "JournaledHistory",
    "RequestRecord",
    "TokenTimer",
    "read_jsonl",
    "write_jsonl",
]


@dataclass(slots=True)
class RequestRecord:
    """One request's record (requests.jsonl). Slotted: a 10K-GPU simulated hour keeps a million
    of them, 0.6 KB each with slots against 1.9 KB with a __dict__ (bench/sim_scale.py)."""

    id: str
    input_tokens: int
    output_tokens: int
    """Requested output length."""
    arrival: float
    status: Status = "failed"
    failure_reason: str | None = None
    route: Route | None = None
    prefill_instance: str | None = None
    decode_instance: str | None = None
    cached_tokens: int = 0
    """Prefix the prefill reused from its cluster's pool (including a pulled prefix)."""
    cached_local: int = 0
    """Cached prefix the global KVCache manager found in the local PD cluster (tokens)."""
    cached_prfaas: int = 0
    """Cached prefix the global KVCache manager found in the PrfaaS cluster (tokens)."""
    pull_tokens: int = 0
    """Prefix tokens the route asked to move across the link before prefill (0: no pull)."""
    pull_status: str | None = None
    """"ok", "failed: <reason>" or "skipped: <reason>" when a pull was asked for."""
    pull_wire_bytes: int = 0
    """Wire bytes of prefix pulls that crossed the link (also of a failed pull)."""
    pull_s: float | None = None
    """Real-world seconds the pull took (it delays the prefill)."""
    tokens_out: int = 0
    """Tokens actually streamed back to the client."""
    prefill_start: float | None = None
    prefill_end: float | None = None
    transfer_start: float | None = None
    transfer_end: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    kv_wire_bytes_expected: int = 0
    """Sum over layers of S_kv(uncached length) / byte_scale, as the engine emits it."""
    kv_wire_bytes_sent: int = 0
    kv_wire_bytes_received: int = 0
    kv_verified: bool = False
    """Decode admitted the request only after every KV frame's checksum was verified."""
    cross_dc: bool = False
    """Whether the KV crossed the inter-datacenter link."""
    retries: int = 0
    threshold_tokens: float | None = None
    """The threshold the policy applied to this request, if any."""
    prompt_digest: str | None = None
    """engine: torch: digest of the prompt token ids the router sent (engine.torch.live)."""
    output_ids: list[int] | None = None
    """engine: torch: the generated token ids (first from prefill, the rest from decode), so
    the token_exact checker can compare them with a single-process generation."""
    token_chunks: int = 0
    """Chunks the router streamed to the client (a chunk holds every token that came at once)."""
    itl_min: float | None = None
    """Shortest inter-token gap the router saw (real-world seconds; `TokenTimer`)."""
    itl_max: float | None = None
    """Longest inter-token gap the router saw (real-world seconds)."""
    itl_std: float | None = None
    """Standard deviation of the inter-token gaps (real-world seconds); their mean is `itl`."""
    decided_by: str | None = None
    """Who chose the route of the last attempt: "policy", or "fallback" when the policy failed
    (an exception, a timeout, an impossible route; testbed.policy.decider). None: never routed."""
    fallback_reason: str | None = None
    """Why the fallback decided ("late: ...", "queued: ...", "unknown-instance: ...")."""
    decision_wall_s: float | None = None
    """Ask-to-route: wall seconds the last routing decision took (HTTP round trip and any wait
    for a free lane included). None on the sim, whose records stay the same for the same seed:
    its `decisions` history event summarises them instead."""
    decision_answer_s: float | None = None
    """Send-to-answer: wall seconds from sending the last decision's request to reading the last
    byte of its answer (an HTTP policy's answer read in time). None when nothing was sent or no
    answer came in time, for a Python policy, and on the sim; not written when None."""

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def e2e(self) -> float | None:
        return None if self.last_token is None else self.last_token - self.arrival

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first."""
        if self.first_token is None or self.last_token is None or self.tokens_out < 2:
            return None
        return (self.last_token - self.first_token) / (self.tokens_out - 1)

    @property
    def itl(self) -> float | None:
        """Mean inter-token latency: AIPerf's and vLLM's per-request ITL, which is `tpot`."""
        return self.tpot

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON object (what dataclasses.asdict gives, field by field: its
        deep copy cost more than the rest of a 10,000-request simulation). The fields are read
        by one `attrgetter` and paired in C: a comprehension's getattr per field cost as much
        as the rest of writing the record."""
        doc = dict(zip(_RECORD_FIELDS, _read_fields(self), strict=True))
        for name in _SPARSE_FIELDS:  # later fields: a built-in policy's records stay the same
            if doc[name] is None:
                del doc[name]
        if self.output_ids is not None:
            doc["output_ids"] = list(self.output_ids)
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> RequestRecord:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in doc.items() if k in names})


_RECORD_FIELDS = tuple(f.name for f in fields(RequestRecord))
_read_fields = operator.attrgetter(*_RECORD_FIELDS)
_SPARSE_FIELDS = ("decision_answer_s",)
"""Fields written only when set, so requests.jsonl of runs that never set them (the sim's, the
built-in policies') is byte for byte what it was before the field existed."""


class TokenTimer:
    """Inter-token gaps of one request as statistics, not timestamps.

    Kept as a running count, mean, M2 (Welford), min and max, so a record stays a few numbers
    however long its output: a simulated hour of a large deployment still fits in memory. A
    chunk of k tokens that came `dt` after the previous chunk counts as k gaps of dt / k (the
    tokens were produced over that interval); the first chunk opens the clock.
    """

    def __init__(self) -> None:
        self.chunks = 0
        self.last: float | None = None
        self.n = 0
        self.mean = 0.0
        self.m2 = 0.0
        self.lo = math.inf
        self.hi = -math.inf

    def add(self, t: float, k: int) -> float | None:
        """k tokens arrived at real-world time t; returns the gap since the previous chunk."""
        self.chunks += 1
        last, self.last = self.last, t
        if last is None or k < 1:
            return None
        dt = t - last
        gap = dt / k
        n = self.n + k
        delta = gap - self.mean
        self.mean += delta * k / n
        self.m2 += delta * delta * self.n * k / n
        self.n = n
        self.lo, self.hi = min(self.lo, gap), max(self.hi, gap)
        return dt

    def write(self, rec: RequestRecord) -> None:
        rec.token_chunks = self.chunks
        if self.n:
            rec.itl_min, rec.itl_max = self.lo, self.hi
            rec.itl_std = math.sqrt(max(0.0, self.m2 / self.n))


@dataclass
class HistoryEvent:
    """One sample or event: `kind` is e.g. "link", "queue", "engine", "policy", "fault"."""

    t: float
    kind: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"t": self.t, "kind": self.kind, **self.data}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> HistoryEvent:
        rest = {k: v for k, v in doc.items() if k not in ("t", "kind")}
        return cls(t=float(doc["t"]), kind=str(doc["kind"]), data=rest)


def write_jsonl(path: Path, docs: Iterable[dict[str, Any]]) -> None:
    """Write a whole JSON-lines file atomically (testbed.metrics.files)."""
    write_jsonl_atomic(path, docs)


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with path.open() as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


class JournaledHistory(list[HistoryEvent]):
    """A run's history, journaled to history.jsonl as it grows (`Journal`), so a killed runner
    leaves every event it had recorded."""

    def __init__(self, journal: Journal | None = None) -> None:
        super().__init__()
        self.journal = journal

    def append(self, event: HistoryEvent) -> None:
        super().append(event)
        if self.journal is not None:
            self.journal.append(event.to_json())
