"""The decision protocol `prfaas-policy/1`: the JSON a router sends an outside scheduler and
what it accepts back (docs/policy-protocol.md; JSON Schemas in schemas/).

One decision is `POST <url>` with the request view and the snapshot; the answer is a route
(200), "no route yet" (503: the router waits, as for a built-in policy's LookupError), or
"resync" (409: the service lost the base of a delta; the router sends the whole snapshot).
The snapshot is compact (an instance is one array in `INSTANCE_COLUMNS` order) and a delta:
only instances whose row changed since the last snapshot this router sent, plus the ids that
left, so what one decision costs on the wire follows what changed, not the deployment's size.
The cost curves (knots) go only with a full snapshot: they do not change during a run.

Everything here is plain data and pure functions (no I/O), so the Python form and the HTTP
form of a policy can be checked against the same test vectors (testbed/data/policy-vectors/), and a
service written in Python can reuse `SnapshotMirror` to keep its copy of the deployment.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from testbed.policy.base import CostModel, InstanceLoad, LinkView, RequestView, Route, Snapshot

__all__ = [
    "FEEDBACK_PATH",
    "INSTANCE_COLUMNS",
    "PROTOCOL",
    "DeltaEncoder",
    "Outcome",
    "ProtocolError",
    "Resync",
    "SnapshotMirror",
    "decode_instance",
    "decode_request",
    "decode_route",
    "encode_feedback",
    "encode_instance",
    "encode_request",
    "encode_route",
    "snapshot_from_doc",
]

PROTOCOL = "prfaas-policy/1"
FEEDBACK_PATH = "/feedback"
"""Outcomes go to this path on the decision URL's host (fire-and-forget)."""
INSTANCE_COLUMNS = (
    "id",
    "cluster",
    "role",
    "outstanding",
    "outstanding_work",
    "queue_wait_s",
    "state",
    "hardware",
)
"""The order of an instance row; the schema (schemas/decision-request.json) fixes it too."""

_CLUSTERS = ("prfaas", "local")
_ROLES = ("prefill", "decode")


class ProtocolError(ValueError):
    """An answer that is not a route of this protocol; the message is the fallback reason."""


class Resync(Exception):
    """A delta whose base the receiver does not hold (the service answers 409)."""


# ------------------------------------------------------------------------------ encoding


def _num(x: float) -> float | int:
    """Integers stay integers on the wire (shorter, and what a reader expects for counts)."""
    if isinstance(x, int):
        return x
    return int(x) if math.isfinite(x) and x == int(x) else float(x)


def encode_instance(i: InstanceLoad) -> list[Any]:
    """One instance as a compact row (INSTANCE_COLUMNS order)."""
    return [
        i.id,
        i.cluster,
        i.role,
        i.outstanding,
        _num(i.outstanding_work),
        _num(getattr(i, "queue_wait_s", 0.0)),
        getattr(i, "state", "ok"),
        getattr(i, "hardware", None),
    ]


def encode_request(view: RequestView) -> dict[str, Any]:
    return {
        "id": view.id,
        "input_tokens": view.input_tokens,
        "output_tokens": view.output_tokens,
        "cached_local": view.cached_local,
        "cached_prfaas": view.cached_prfaas,
        "kv_bytes": _num(getattr(view, "kv_bytes", 0.0)),
    }


def _link_doc(snapshot: Snapshot) -> dict[str, Any] | None:
    link = getattr(snapshot, "link", None)
    if link is None:
        return None
    return {
        k: getattr(link, k, None)
        for k in ("bandwidth_bps", "in_flight_bytes", "delivered_bps", "rtt_s", "scarce")
    }


def _knots(xy: Any) -> list[list[float]]:
    xs, ys = xy
    return [[float(x) for x in xs], [float(y) for y in ys]]


def _costs_doc(snapshot: Snapshot) -> dict[str, Any] | None:
    costs = getattr(snapshot, "costs", None)
    if costs is None:
        return None
    try:
        return {
            "prefill_knots": {c: _knots(v) for c, v in dict(costs.prefill_knots).items()},
            "kv_knots": _knots(costs.kv_knots),
            "kv_state_bytes": float(getattr(costs, "kv_state_bytes", 0.0)),
        }
    except (AttributeError, TypeError, ValueError):
        return None


@dataclass
class _Sent:
    """What the service holds once it acknowledges a snapshot."""

    doc_version: int
    book_version: int | None
    """The snapshot's own `version` when it came from a load book (changed_since works)."""
    rows: dict[str, InstanceLoad] | None
    """Per instance, for snapshots without a book (hand-made): the delta is a comparison."""


class DeltaEncoder:
    """The router's side of the delta: what the service holds, and the next version.

    `encode` builds the next snapshot document against the last one the service acknowledged
    (`commit` after a 200 or a 503); any other outcome (timeout, error, 409) makes the next one
    full, since the service may or may not have applied it. A snapshot from the router's or the
    sim's load book gives its delta by `changed_since` (it walks only what changed); a hand-made
    one is compared row by row. A snapshot that excludes instances for its request (a retry)
    goes full and is no base for the next delta, so the service never keeps a stale view of
    what was left out. One exchange at a time: the caller serialises them."""

    def __init__(self) -> None:
        self.version = 0
        self._acked: _Sent | None = None
        self._pending: _Sent | None = None
        self.full_sent = 0

    def reset(self) -> None:
        """The next snapshot is full."""
        self._acked = None
        self._pending = None

    def encode(self, snapshot: Snapshot, *, full: bool = False) -> dict[str, Any]:
        self.version += 1
        book = snapshot.index is not None
        partial = bool(snapshot.exclude)
        base = None if full or partial else self._acked
        doc: dict[str, Any] = {
            "version": self.version,
            "base": None if base is None else base.doc_version,
            "now": snapshot.now,
            "threshold_tokens": snapshot.threshold_tokens,
            "bandwidth_scarce": snapshot.bandwidth_scarce,
            "link": _link_doc(snapshot),
        }
        rows: dict[str, InstanceLoad] | None = None
        if base is None:
            self.full_sent += 1
            instances = list(snapshot.instances)
            doc["instances"] = [encode_instance(i) for i in instances]
            doc["removed"] = []
            costs = _costs_doc(snapshot)
            if costs is not None:
                doc["costs"] = costs
            if not book:
                rows = {i.id: i for i in instances}
        elif book and base.book_version is not None:
            doc["instances"] = [
                encode_instance(i) for i in snapshot.changed_since(base.book_version)
            ]
            doc["removed"] = []
        else:
            rows = {i.id: i for i in snapshot.instances}
            held = base.rows or {}
            doc["instances"] = [encode_instance(i) for iid, i in rows.items() if held.get(iid) != i]
            doc["removed"] = [iid for iid in held if iid not in rows]
        self._pending = (
            None if partial else _Sent(self.version, snapshot.version if book else None, rows)
        )
        return doc

    def commit(self) -> None:
        """The service holds the last encoded snapshot (a partial one is no base: reset)."""
        self._acked, self._pending = self._pending, None


def encode_decision(router: str, view: RequestView, snapshot_doc: dict[str, Any]) -> dict[str, Any]:
    return {
        "protocol": PROTOCOL,
        "router": router,
        "request": encode_request(view),
        "snapshot": snapshot_doc,
    }


def encode_route(route: Route) -> dict[str, Any]:
    return {
        "prefill_cluster": route.prefill_cluster,
        "prefill_instance": route.prefill_instance,
        "decode_instance": route.decode_instance,
        "uncached_tokens": route.uncached_tokens,
        "pull_prefix_tokens": route.pull_prefix_tokens,
    }


@dataclass(frozen=True)
class Outcome:
    """How a routed request ended (Python: `on_complete(request, outcome)`; HTTP: POST
    /feedback). Times are real-world seconds."""

    status: str
    """"completed" or "failed"."""
    route: str | None
    prefill_instance: str | None
    decode_instance: str | None
    ttft_s: float | None
    e2e_s: float | None
    failure_reason: str | None
    decided_by: str | None


def encode_feedback(router: str, request: RequestView, outcome: Outcome) -> dict[str, Any]:
    return {
        "protocol": PROTOCOL,
        "router": router,
        "request": encode_request(request),
        "outcome": dataclasses.asdict(outcome),
    }


# ------------------------------------------------------------------------------ decoding


def decode_route(doc: Any, threshold: float | None = None) -> Route:
    """The route in an answer body; ProtocolError (the fallback reason) if there is none.

    The route's threshold is the answer's optional `route.threshold_tokens` (what the policy
    under test says it applied: the report plots it as the policy's), else `threshold`; an
    HTTP client passes none, so a service that reports no threshold is not credited with the
    snapshot's. A value that is not a positive finite number is garbage: the answer breaks
    the contract, and the fallback decides rather than the testbed guessing what was meant."""
    if not isinstance(doc, dict):
        raise ProtocolError(f"garbage: answer is {type(doc).__name__}, not an object")
    if doc.get("protocol", PROTOCOL) != PROTOCOL:
        raise ProtocolError(f"garbage: protocol {doc.get('protocol')!r}, expected {PROTOCOL}")
    r = doc.get("route")
    if not isinstance(r, dict):
        raise ProtocolError("garbage: answer has no 'route' object")
    cluster = r.get("prefill_cluster")
    if cluster not in _CLUSTERS:
        raise ProtocolError(f"garbage: prefill_cluster {cluster!r}")
    pre, dec = r.get("prefill_instance"), r.get("decode_instance")
    if not isinstance(pre, str) or not isinstance(dec, str):
        raise ProtocolError("garbage: prefill_instance and decode_instance must be strings")
    unc = _count(r, "uncached_tokens", None)
    pull = _count(r, "pull_prefix_tokens", 0)
    said = r.get("threshold_tokens")
    if said is not None:
        if (
            isinstance(said, bool)
            or not isinstance(said, int | float)
            or not math.isfinite(said)
            or said <= 0
        ):
            raise ProtocolError(f"garbage: threshold_tokens must be positive, got {said!r}")
        threshold = float(said)
    return Route(cluster, pre, dec, unc, threshold, pull_prefix_tokens=pull)


def _count(doc: dict[str, Any], name: str, default: int | None) -> int:
    v = doc.get(name, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ProtocolError(f"garbage: {name} must be a non-negative integer, got {v!r}")
    return v


def decode_request(doc: dict[str, Any]) -> RequestView:
    kw: dict[str, Any] = {
        "id": str(doc["id"]),
        "input_tokens": int(doc["input_tokens"]),
        "output_tokens": int(doc["output_tokens"]),
        "cached_local": int(doc.get("cached_local", 0)),
        "cached_prfaas": int(doc.get("cached_prfaas", 0)),
        "kv_bytes": float(doc.get("kv_bytes", 0.0)),
    }
    return RequestView(**_known(RequestView, kw))


def decode_instance(row: list[Any]) -> InstanceLoad:
    kw = dict(zip(INSTANCE_COLUMNS, row, strict=True))
    return InstanceLoad(**_known(InstanceLoad, kw))


def _known(cls: type, kw: dict[str, Any]) -> dict[str, Any]:
    """Only the fields `cls` has (the snapshot's optional fields arrive one at a time)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in kw.items() if k in names}


class SnapshotMirror:
    """A service's copy of one router's deployment, kept from full and delta snapshots."""

    def __init__(self) -> None:
        self.version: int | None = None
        self.rows: dict[str, list[Any]] = {}
        self.costs: dict[str, Any] | None = None

    def apply(self, snap: dict[str, Any]) -> dict[str, list[Any]]:
        """The instance rows after `snap`; Resync if it is a delta on a base not held."""
        base = snap.get("base")
        if base is None:
            self.rows = {}
            if snap.get("costs") is not None:
                self.costs = snap["costs"]
        elif base != self.version:
            self.version = None
            raise Resync(f"delta on version {base}, holding {self.version}")
        for iid in snap.get("removed", ()):
            self.rows.pop(iid, None)
        for row in snap["instances"]:
            self.rows[row[0]] = row
        self.version = snap["version"]
        return self.rows


def snapshot_from_doc(
    snap: dict[str, Any],
    rows: dict[str, list[Any]] | None = None,
    costs: dict[str, Any] | None = None,
) -> Snapshot:
    """The Python snapshot a document stands for: what a Python policy would have been handed
    (for a delta, pass a mirror's `rows` and `costs`)."""
    table = rows if rows is not None else {r[0]: r for r in snap["instances"]}
    link = snap.get("link")
    c = snap.get("costs") or costs
    return Snapshot(
        now=float(snap["now"]),
        instances=tuple(decode_instance(r) for r in table.values()),
        threshold_tokens=snap.get("threshold_tokens"),
        bandwidth_scarce=bool(snap.get("bandwidth_scarce", False)),
        link=LinkView(**link) if link else None,
        costs=(
            CostModel(
                {k: (tuple(v[0]), tuple(v[1])) for k, v in c["prefill_knots"].items()},
                (tuple(c["kv_knots"][0]), tuple(c["kv_knots"][1])),
                float(c.get("kv_state_bytes", 0.0)),
            )
            if c
            else None
        ),
    )
