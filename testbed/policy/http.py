"""A policy answered by an outside service over HTTP (protocol `prfaas-policy/1`).

Named by its URL, wherever a policy name goes: `--policy http://127.0.0.1:9000/route`, or
`policy: {kind: http, url: ..., timeout: 20ms, fallback: prfaas-static}` in a scenario (the
config turns that into the same string). Settings ride in the URL's fragment, which is never
sent: `http://host:port/route#timeout=20ms&fallback=prfaas-static&lanes=8&validate=1`. The
registry makes one class per such name (the resolver below), carrying the fallback's facts
(deployment, threshold, scheduler loops, cache awareness): the service decides routes, the
testbed keeps running what the fallback would need, so a fallback decision is always possible.

`decide` blocks (the sim: a decision takes no virtual time; its wall latency is measured);
`adecide` is the live router's: up to `lanes` exchanges at once on one aiohttp session with
keep-alive. Both, and the feedback worker, keep one rule (testbed.policy.http_client): a total
deadline per exchange, the size cap on every body read, no decompression, no redirects.
Either raises LookupError for "no route yet" (HTTP 503) and anything else for a failure; the
shared wrapper (testbed.policy.decider) turns a failure into a fallback decision. The `_timed`
forms also give the send-to-answer seconds. Outcomes go to POST /feedback from a bounded queue
on a worker thread: fire-and-forget, dropped when full, each post bounded in time and size by
the same rule, its failures counted by kind (`feedback_stats`); closing stops the worker after
the post it is in, whatever is left queued.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import queue
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from testbed.config import DeploymentKind
from testbed.policy.base import POLICIES, Policy, RequestView, Route, Snapshot
from testbed.policy.http_client import (
    DEFAULT_LANES,
    MAX_LANES,
    Answered,
    BlockingClient,
    Lane,
    Lanes,
    apost,
    feedback_deadline_s,
    late,
    new_session,
)
from testbed.policy.http_process import SchedulerProcess
from testbed.policy.protocol import (
    FEEDBACK_PATH,
    DeltaEncoder,
    Outcome,
    ProtocolError,
    decode_route,
    encode_decision,
    encode_feedback,
)
from testbed.registry import PluginError, UnknownName
from testbed.units import UnitError, parse_duration

__all__ = [
    "DEFAULT_FALLBACK",
    "DEFAULT_LANES",
    "DEFAULT_TIMEOUT_S",
    "HttpPolicy",
    "HttpSpec",
    "NoRouteYet",
    "SchedulerProcess",
    "check_schema",
    "is_http_spec",
]

DEFAULT_TIMEOUT_S = 0.020
DEFAULT_FALLBACK = "prfaas-static"
FEEDBACK_QUEUE = 1024
"""Outcomes waiting to be posted; more are dropped (counted), never waited for."""
SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


class NoRouteYet(LookupError):
    """The service answered 503: no instance can take the request now (wait, as built-ins do)."""


def is_http_spec(spec: str) -> bool:
    return spec.startswith(("http://", "https://"))


@dataclass(frozen=True)
class HttpSpec:
    """What a policy URL says: where to ask, how long to wait, who decides when it fails."""

    url: str
    timeout_s: float = DEFAULT_TIMEOUT_S
    fallback: str = DEFAULT_FALLBACK
    validate: bool = False
    """Debug: check every message against the JSON Schemas in schemas/ (needs jsonschema)."""
    lanes: int = DEFAULT_LANES
    """Live exchanges at once, each with its own router id (testbed.policy.http_client)."""

    @classmethod
    def parse(cls, spec: str) -> HttpSpec:
        url, _, frag = spec.partition("#")
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"policy URL {spec!r}: write it as http://host:port/path")
        kw: dict[str, Any] = {}
        for key, value in urllib.parse.parse_qsl(frag, keep_blank_values=True):
            if key == "timeout":
                kw["timeout_s"] = parse_duration(value)
                if kw["timeout_s"] <= 0:
                    raise ValueError(f"policy URL {spec!r}: timeout must be positive")
            elif key == "fallback":
                if is_http_spec(value) or not value:
                    raise ValueError(f"policy URL {spec!r}: the fallback must be a policy name")
                kw["fallback"] = value
            elif key == "validate":
                kw["validate"] = value not in ("0", "false", "no", "")
            elif key == "lanes":
                if not value.isdigit() or not 1 <= int(value) <= MAX_LANES:
                    raise ValueError(f"policy URL {spec!r}: lanes must be a whole number "
                                     f"from 1 to {MAX_LANES}, not {value!r}")  # fmt: skip
                kw["lanes"] = int(value)
            else:
                raise ValueError(
                    f"policy URL {spec!r}: unknown setting {key!r} in the fragment "
                    "(known: timeout, fallback, lanes, validate)"
                )
        return cls(url, **kw)

    def to_spec(self) -> str:
        """The policy name that stands for these settings (only what differs from defaults)."""
        frag = []
        if self.timeout_s != DEFAULT_TIMEOUT_S:
            frag.append(f"timeout={self.timeout_s * 1e3:g}ms")
        if self.fallback != DEFAULT_FALLBACK:
            frag.append(f"fallback={self.fallback}")
        if self.lanes != DEFAULT_LANES:
            frag.append(f"lanes={self.lanes}")
        if self.validate:
            frag.append("validate=1")
        return self.url + ("#" + "&".join(frag) if frag else "")

    @property
    def feedback_timeout_s(self) -> float:
        """A feedback post's total deadline (off the decision path: generous, still bounded)."""
        return feedback_deadline_s(self.timeout_s)

    @property
    def feedback_url(self) -> str:
        parts = urllib.parse.urlsplit(self.url)
        return urllib.parse.urlunsplit((parts.scheme, parts.netloc, FEEDBACK_PATH, "", ""))


def check_schema(name: str, doc: Any) -> None:
    """ProtocolError ("garbage: ...") unless `doc` fits schemas/NAME.json (tests, debug)."""
    _Schemas.check(name, doc)


class _Schemas:
    """The protocol's JSON Schemas, loaded on first use (debug only: not the hot path)."""

    _validators: ClassVar[dict[str, Any]] = {}

    @classmethod
    def check(cls, name: str, doc: Any) -> None:
        v = cls._validators.get(name)
        if v is None:
            try:
                import jsonschema
            except ImportError as exc:
                raise RuntimeError("validate=1 needs the jsonschema package") from exc
            from referencing import Registry, Resource  # comes with jsonschema

            docs = {p.stem: json.loads(p.read_text()) for p in SCHEMAS.glob("*.json")}
            reg: Any = Registry().with_resources(
                (d["$id"], Resource.from_contents(d)) for d in docs.values()
            )
            v = cls._validators[name] = jsonschema.Draft202012Validator(docs[name], registry=reg)
        errors = sorted(v.iter_errors(doc), key=lambda e: list(e.path))
        if errors:
            e = errors[0]
            where = "/".join(str(p) for p in e.path) or "(top)"
            raise ProtocolError(f"garbage: {name} schema: {where}: {e.message}")


class HttpPolicy:
    """The client side of one policy URL (a subclass per URL carries the facts and `spec`)."""

    name: ClassVar[str] = "http"
    deployment_kind: ClassVar[DeploymentKind] = "prfaas-pd"
    needs_threshold: ClassVar[bool] = True
    replans: ClassVar[bool] = False
    long_term: ClassVar[bool] = False
    cache_aware: ClassVar[bool] = False
    link_view: ClassVar[bool] = True
    """A service may read the snapshot's link, so the router measures it whatever the
    fallback's facts (policy.base.measures_link); only re-planning follows the fallback."""
    spec: ClassVar[HttpSpec]
    fallback_name: ClassVar[str]

    def __init__(self) -> None:
        self.lanes = Lanes(self.spec.lanes)
        """Exchanges that may run at once, each with its own router id and delta base; the
        blocking client (the sim) uses the first only."""
        parts = urllib.parse.urlsplit(self.spec.url)
        self._host = parts.hostname or "127.0.0.1"
        https = parts.scheme == "https"
        self._port = parts.port or (443 if https else 80)
        self._path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        self._client = BlockingClient(self._host, self._port, https)
        self._session: Any = None  # aiohttp.ClientSession, made on the first live decision
        self.clock: Callable[[], float] = time.monotonic
        """The deadline's clock (monotonic; a test may replace it)."""
        self._deciders: dict[str, str] = {}
        """Request id -> the router id of the lane that last decided it (its feedback's)."""
        self._feedback: queue.Queue[dict[str, Any] | None] | None = None
        self._feeder: threading.Thread | None = None
        self._closing = threading.Event()
        self.feedback_dropped = 0
        """Outcomes never posted: the queue was full, or the policy closed before their turn."""
        self.feedback_posted = 0
        self.feedback_failed: Counter[str] = Counter()
        """Posts that got no 2xx answer in time, by kind (late, unreachable, status, garbage)."""
        self.resyncs = 0

    @property
    def router(self) -> str:
        """The first lane's router id (the blocking client's, and a sequential live one's)."""
        return self.lanes.all[0].router

    @property
    def encoder(self) -> DeltaEncoder:
        return self.lanes.all[0].encoder

    # -------------------------------------------------------------------- one decision

    def _body(self, lane: Lane, view: RequestView, snapshot: Snapshot, full: bool) -> bytes:
        self._deciders[view.id] = lane.router
        doc = encode_decision(lane.router, view, lane.encoder.encode(snapshot, full=full))
        if self.spec.validate:
            _Schemas.check("decision-request", doc)
        return json.dumps(doc, separators=(",", ":")).encode()

    def _answer(
        self, lane: Lane, status: int, body: bytes, snapshot: Snapshot, answer_s: float
    ) -> Route | None:
        """The route of a 200; None for a 409 (resend full); raises for the rest (`Answered`:
        the fallback decides, the answer's time is still reported)."""
        if status == 409:
            lane.encoder.reset()
            self.resyncs += 1
            return None
        if status == 503:
            lane.encoder.commit()
            raise NoRouteYet(f"scheduler: no route yet ({body[:120].decode(errors='replace')})")
        if status != 200:
            lane.encoder.reset()
            raise Answered(f"status: HTTP {status}", answer_s)
        lane.encoder.commit()
        try:
            doc = json.loads(body)
            if self.spec.validate:
                _Schemas.check("decision-response", doc)
            return decode_route(doc)
        except ProtocolError as exc:
            raise Answered(str(exc), answer_s) from None
        except ValueError:
            raise Answered(f"garbage: not JSON: {body[:60]!r}", answer_s) from None

    def _in_time(self, lane: Lane, sent: float, deadline: float) -> float:
        """Send-to-answer seconds of an answer just read; `late` if its last byte came after
        the deadline (the loop may have been too busy to fire the timer)."""
        read = self.clock()
        if read > deadline:
            lane.encoder.reset()
            raise late(self.spec.timeout_s, read - deadline)
        return read - sent

    def decide(self, request: RequestView, snapshot: Snapshot) -> Route:
        return self.decide_timed(request, snapshot)[0]

    def decide_timed(self, request: RequestView, snapshot: Snapshot) -> tuple[Route, float]:
        """Blocking (the sim's form): one keep-alive connection, one lane, a total deadline of
        `timeout_s` per decision. The route and its send-to-answer wall seconds."""
        lane = self.lanes.all[0]
        deadline = self.clock() + self.spec.timeout_s
        full = False
        for _ in range(2):  # a 409 resends the whole snapshot once
            body = self._body(lane, request, snapshot, full)
            try:
                status, answer, sent = self._client.post(self._path, body, deadline, self.clock)
            except (OSError, http.client.HTTPException, ProtocolError) as exc:
                lane.encoder.reset()
                raise self._failure(exc) from None
            took = self._in_time(lane, sent, deadline)
            route = self._answer(lane, status, answer, snapshot, took)
            if route is not None:
                return route, took
            full = True
        raise ProtocolError("status: 409 twice (the service refused a full snapshot)")

    async def adecide(self, request: RequestView, snapshot: Snapshot) -> Route:
        return (await self.adecide_timed(request, snapshot))[0]

    async def adecide_timed(self, request: RequestView, snapshot: Snapshot) -> tuple[Route, float]:
        """The live router's form: a free lane (else `queued` at the deadline), then the
        exchange on one aiohttp session (keep-alive; the lanes bound its connections)."""
        if self._session is None:
            self._session = new_session()
        deadline = self.clock() + self.spec.timeout_s
        lane = await self.lanes.take(deadline, self.clock)
        if lane is None:
            raise TimeoutError(
                f"queued: no free lane within {self.spec.timeout_s * 1e3:g}ms "
                f"({len(self.lanes.all)} lanes busy)"
            )
        try:
            return await self._exchange(lane, request, snapshot, deadline)
        finally:
            self.lanes.give(lane)

    async def _exchange(
        self, lane: Lane, request: RequestView, snapshot: Snapshot, deadline: float
    ) -> tuple[Route, float]:
        import aiohttp

        assert self._session is not None
        full = False
        url = self.spec.url.partition("#")[0]
        for _ in range(2):
            body = self._body(lane, request, snapshot, full)
            try:
                status, answer, sent = await apost(self._session, url, body, deadline, self.clock)
            except (OSError, aiohttp.ClientError, ProtocolError) as exc:
                lane.encoder.reset()
                raise self._failure(exc) from None
            took = self._in_time(lane, sent, deadline)
            route = self._answer(lane, status, answer, snapshot, took)
            if route is not None:
                return route, took
            full = True
        raise ProtocolError("status: 409 twice (the service refused a full snapshot)")

    def _failure(self, exc: BaseException) -> Exception:
        """What a failed exchange raises, on every path: `late` past the deadline, the
        ProtocolError itself (an answer over the cap), else `unreachable`."""
        if isinstance(exc, TimeoutError):
            return late(self.spec.timeout_s)
        if isinstance(exc, ProtocolError):
            return exc
        return ConnectionError(f"unreachable: {type(exc).__name__}: {exc}")

    # -------------------------------------------------------------------- feedback

    def on_complete(self, request: RequestView, outcome: Outcome) -> None:
        """Queue the outcome for POST /feedback; never blocks (dropped when the queue is full).
        It carries the router id of the lane that decided the request."""
        router = self._deciders.pop(request.id, self.router)
        if self._feedback is None:
            self._feedback = queue.Queue(FEEDBACK_QUEUE)
            self._feeder = threading.Thread(
                target=self._feed, args=(self._feedback,), name="policy-feedback", daemon=True
            )
            self._feeder.start()
        try:
            self._feedback.put_nowait(encode_feedback(router, request, outcome))
        except queue.Full:
            self.feedback_dropped += 1

    def _feed(self, q: queue.Queue[dict[str, Any] | None]) -> None:
        """The worker: each post bounded by a total deadline and its answer by the size cap
        (the decisions' rule); it stops at None or when the policy closes."""
        path = urllib.parse.urlsplit(self.spec.feedback_url).path
        client = BlockingClient(self._host, self._port, self.spec.url.startswith("https:"))
        for _ in iter(int, 1):  # bounded by the queue: None (close) ends it
            doc = q.get()
            if doc is None:
                break
            if self._closing.is_set():
                self.feedback_dropped += 1 + sum(1 for d in _drain(q) if d is not None)
                break
            deadline = time.monotonic() + self.spec.feedback_timeout_s
            try:
                status, _, _ = client.post(path, json.dumps(doc).encode(), deadline)
            except (OSError, http.client.HTTPException, ProtocolError) as exc:
                self.feedback_failed[str(self._failure(exc)).split(":", 1)[0]] += 1
                continue
            if 200 <= status < 300:
                self.feedback_posted += 1
            else:
                self.feedback_failed["status"] += 1
        client.close()

    def feedback_stats(self) -> dict[str, Any]:
        """The /feedback posts so far: answered 2xx, failed (by kind), never sent (dropped)."""
        failed = dict(sorted(self.feedback_failed.items()))
        return {"posted": self.feedback_posted, "failed": failed, "dropped": self.feedback_dropped}

    # -------------------------------------------------------------------- closing

    def close(self) -> None:
        """The queued outcomes get a second to be posted; then the worker stops after the post
        it is in (at most a feedback deadline), and what is left counts as dropped."""
        self._client.close()
        if self._feedback is not None and self._feeder is not None:
            with contextlib.suppress(queue.Full):
                self._feedback.put_nowait(None)
            self._feeder.join(timeout=1.0)
            self._closing.set()

    async def aclose(self) -> None:
        self.close()
        if self._session is not None:
            await self._session.close()
            self._session = None


def _drain(q: queue.Queue[dict[str, Any] | None]) -> list[dict[str, Any] | None]:
    """What is left in the queue, taken out (bounded by its size)."""
    left: list[dict[str, Any] | None] = []
    for _ in range(q.maxsize or FEEDBACK_QUEUE):
        try:
            left.append(q.get_nowait())
        except queue.Empty:
            break
    return left


def _resolve(name: str) -> type[Policy] | None:
    """The registry's resolver: a class for a policy URL (None for any other name)."""
    if not is_http_spec(name):
        return None
    try:
        spec = HttpSpec.parse(name)
        fb = POLICIES[spec.fallback]
    except (ValueError, UnitError, UnknownName) as exc:  # one line, before anything starts
        text = str(exc) if str(exc).startswith("policy URL") else f"policy URL {name!r}: {exc}"
        raise PluginError(text) from None
    attrs = {
        "name": name,
        "deployment_kind": fb.deployment_kind,
        "needs_threshold": fb.needs_threshold,
        "replans": fb.replans,
        "long_term": fb.long_term,
        "cache_aware": fb.cache_aware,
        "spec": spec,
        "fallback_name": spec.fallback,
        "__module__": __name__,
    }
    return type("HttpPolicy", (HttpPolicy,), attrs)


POLICIES.add_resolver(_resolve)
