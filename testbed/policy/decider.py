"""One failure semantics for every policy, Python or HTTP, live or simulated.

The live router and the sim both ask a `Decider` instead of the policy itself:

- LookupError (HTTP 503) is "no route yet": it propagates, and the caller waits and asks again,
  as it always has for the built-in policies;
- anything else the policy does wrong (an exception, no answer by the deadline: `queued` or
  `late`, an answer that is not a route, a route to an unknown instance, to one of the wrong
  role or cluster, or to one whose state is not "ok") makes the fallback decide that request.
  The decision says so (`decided_by: "fallback"` and the reason, "kind: detail"), and the
  caller writes it on the request record; the summary counts fallbacks by kind and gives
  decision latency percentiles.

A built-in policy has no fallback (it is the reference), so its routes, its errors and the
router's behaviour stay exactly what they were; an HTTP policy falls back to `prfaas-static`
unless its URL says otherwise (`#fallback=NAME`), a plugin (`module:Class`, an entry point) to
`prfaas-static` too, or to a policy needing no threshold when it has none (`plugin_fallback`).

A decision's wall latency is measured here (ask-to-route; an HTTP policy's `decide_timed` adds
send-to-answer), for the report; on the sim it costs no virtual time.
"""

from __future__ import annotations

import contextlib
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from testbed.frozen import quick_init
from testbed.policy import make_policy
from testbed.policy.base import POLICIES, InstanceLoad, Policy, RequestView, Route, Snapshot
from testbed.policy.http import DEFAULT_FALLBACK, HttpPolicy, is_http_spec
from testbed.policy.protocol import Outcome, ProtocolError

if TYPE_CHECKING:
    from testbed.config import PolicyConfig

__all__ = ["Decider", "Decision", "fallback_kind", "plugin_fallback", "route_problem"]

FALLBACK_KINDS = (
    "queued",
    "late",
    "unreachable",
    "status",
    "garbage",
    "unknown-instance",
    "wrong-role",
    "wrong-cluster",
    "not-ok",
    "error",
)
"""What `fallback_reason` starts with (the report counts by these). `queued`: no free lane before
the deadline, nothing sent; `late`: sent, no whole answer read by the deadline (abandoned); an
exception a Python policy raises (a TimeoutError too) is an `error`."""
LEGACY_KINDS = {"timeout": "late"}
"""Kinds of older records: `timeout` was `queued` ("queued behind other decisions") or `late`."""


@quick_init
@dataclass(frozen=True)
class Decision:
    route: Route
    decided_by: str
    """"policy" or "fallback"."""
    fallback_reason: str | None
    wall_s: float
    """Ask-to-route wall seconds (the policy's, plus the fallback's when it decided)."""
    answer_s: float | None = None
    """Send-to-answer wall seconds of an HTTP policy's answer read in time (a route, or one the
    fallback replaced); None when none was (queued, late, unreachable) and for Python."""

    def write(self, rec: Any, *, wall: bool = True) -> None:
        """Onto a request record (metrics.records.RequestRecord): who decided, why, and (unless
        `wall` is False: the sim, whose records are the same for the same seed) how fast."""
        rec.decided_by, rec.fallback_reason = self.decided_by, self.fallback_reason
        rec.decision_wall_s = self.wall_s if wall else None
        rec.decision_answer_s = self.answer_s if wall else None


def fallback_kind(reason: str | None) -> str:
    """The kind a fallback reason starts with ("late: ..." -> "late"; an older record's
    "timeout: ... (queued behind other decisions)" -> "queued", other "timeout" -> "late")."""
    if not reason:
        return "none"
    head = reason.split(":", 1)[0].strip()
    if head in LEGACY_KINDS:
        return "queued" if "queued behind" in reason else LEGACY_KINDS[head]
    return head if head in FALLBACK_KINDS else "error"


def route_problem(route: Any, snapshot: Snapshot) -> str | None:
    """Why `route` cannot be used on `snapshot` (a fallback reason), or None if it can.

    A book-backed snapshot looks each instance up in its load book (O(1)); a hand-made one
    is indexed once."""
    if not isinstance(route, Route):
        return f"garbage: decide returned {type(route).__name__}, not a Route"
    lookup = _lookup(snapshot)
    found: dict[str, InstanceLoad] = {}
    for iid, role in ((route.prefill_instance, "prefill"), (route.decode_instance, "decode")):
        inst = lookup(iid)
        if inst is None:
            return f"unknown-instance: {role} instance {iid!r} is not in the snapshot"
        if inst.role != role:
            return f"wrong-role: {iid!r} is a {inst.role} instance, not {role}"
        if iid in snapshot.exclude or inst.cluster in snapshot.exclude:
            return f"not-ok: {role} instance {iid!r} failed this request before (excluded)"
        if inst.state != "ok":
            return f"not-ok: {role} instance {iid!r} is {inst.state}"
        found[role] = inst
    if found["prefill"].cluster != route.prefill_cluster:
        return (
            f"wrong-cluster: {route.prefill_instance!r} is in "
            f"{found['prefill'].cluster}, the route says {route.prefill_cluster}"
        )
    if route.uncached_tokens < 0 or route.pull_prefix_tokens < 0:
        return "garbage: negative token count in the route"
    return None


def _lookup(snapshot: Snapshot) -> Callable[[str], InstanceLoad | None]:
    load = getattr(snapshot.index, "load", None)  # testbed.policy.book.LoadBook.load
    if callable(load):

        def from_book(iid: str) -> InstanceLoad | None:
            try:
                found = load(iid)
            except KeyError:
                return None
            return found if isinstance(found, InstanceLoad) else None

        return from_book
    index = {i.id: i for i in snapshot.instances}
    return index.get


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:200]
    if isinstance(exc, ProtocolError | TimeoutError | ConnectionError) and text:
        head = text.split(":", 1)[0]
        if head in FALLBACK_KINDS:
            return text
    return f"error: {type(exc).__name__}: {text}" if text else f"error: {type(exc).__name__}"


def plugin_fallback(policy_cls: type[Policy]) -> str:
    """The fallback of a Python plugin: `prfaas-static` when the run gives it a threshold (the
    plugin `needs_threshold`); else one that needs none, for the plugin's deployment (`naive`,
    every prefill on PrfaaS while there is one, on a PrfaaS-PD deployment)."""
    if policy_cls.needs_threshold:
        return DEFAULT_FALLBACK
    return "homogeneous" if policy_cls.deployment_kind == "homogeneous" else "naive"


def wall_percentiles_ms(walls_s: Sequence[float]) -> dict[str, Any]:
    """Decision latencies as the summary gives them: count and p50/p90/p99/max, wall ms."""
    ms = sorted(w * 1e3 for w in walls_s)
    if not ms:
        return {"n": 0, "p50": None, "p90": None, "p99": None, "max": None}

    def pct(q: float) -> float:  # linear interpolation, as numpy's default
        k = (len(ms) - 1) * q
        lo = int(k)
        hi = min(lo + 1, len(ms) - 1)
        return ms[lo] + (ms[hi] - ms[lo]) * (k - lo)

    return {"n": len(ms), "p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99), "max": ms[-1]}


class Decider:
    """A policy with the shared failure semantics (see the module docstring)."""

    def __init__(self, policy: Policy, fallback: Policy | None) -> None:
        self.policy = policy
        self.fallback = fallback
        self._decide = getattr(policy, "decide_timed", None) or _untimed(policy.decide)
        """(route, send-to-answer seconds or None): an HTTP policy times its exchange."""
        adecide = getattr(policy, "adecide", None)
        self._adecide = getattr(policy, "adecide_timed", None) or (
            None if adecide is None else _auntimed(adecide)
        )
        self._on_complete = getattr(policy, "on_complete", None)
        self.answer_walls: list[float] | None = None
        """Send-to-answer seconds of every decision that had one, kept only when the caller
        asks (the sim sets a list: its `decisions` event summarises them). Live records carry
        their own, so a standing router does not grow a list per decision."""

    @property
    def fallback_name(self) -> str | None:
        """The name of the policy that decides when this one fails (None for a built-in)."""
        return None if self.fallback is None else self.fallback.name

    @classmethod
    def for_spec(cls, spec: str, config: PolicyConfig | None = None) -> Decider:
        """The decider for a policy name as a run records it (built-in, plugin, or URL); the
        scenario's `policy` section reaches a policy that reads its knobs from it
        (`make_policy`)."""
        policy_cls = POLICIES[spec]
        policy: Policy = make_policy(spec, config)
        if issubclass(policy_cls, HttpPolicy):
            return cls(policy, POLICIES[policy_cls.fallback_name]())
        if POLICIES.is_plugin(spec):
            return cls(policy, POLICIES[plugin_fallback(policy_cls)]())
        return cls(policy, None)

    @property
    def cache_aware(self) -> bool:
        return self.policy.cache_aware

    @property
    def timeout_s(self) -> float | None:
        """The HTTP policy's per-decision timeout (wall seconds); None for a Python one."""
        spec = getattr(self.policy, "spec", None)
        return getattr(spec, "timeout_s", None)

    # ---------------------------------------------------------------------- deciding

    def decide(self, view: RequestView, snapshot: Snapshot) -> Decision:
        """Blocking (the sim, and Python policies live)."""
        t0 = time.perf_counter()
        try:
            route, answer_s = self._decide(view, snapshot)
        except LookupError:
            raise
        except Exception as exc:
            if self.fallback is None:
                raise
            return self._fall_back(view, snapshot, _reason(exc), t0, _answer_s(exc))
        return self._checked(view, snapshot, route, t0, answer_s)

    async def adecide(self, view: RequestView, snapshot: Snapshot) -> Decision:
        """The live router's: an HTTP policy's exchange does not block the event loop."""
        if self._adecide is None:
            return self.decide(view, snapshot)
        t0 = time.perf_counter()
        try:
            route, answer_s = await self._adecide(view, snapshot)
        except LookupError:
            raise
        except Exception as exc:
            if self.fallback is None:
                raise
            return self._fall_back(view, snapshot, _reason(exc), t0, _answer_s(exc))
        return self._checked(view, snapshot, route, t0, answer_s)

    def _checked(
        self, view: RequestView, snapshot: Snapshot, route: Route, t0: float, answer_s: float | None
    ) -> Decision:
        if self.fallback is None:  # a built-in policy: its routes are the reference
            return Decision(route, "policy", None, time.perf_counter() - t0)
        problem = route_problem(route, snapshot)
        if problem is not None:
            return self._fall_back(view, snapshot, problem, t0, answer_s)
        if answer_s is not None and self.answer_walls is not None:
            self.answer_walls.append(answer_s)
        return Decision(route, "policy", None, time.perf_counter() - t0, answer_s)

    def _fall_back(
        self, view: RequestView, snapshot: Snapshot, reason: str, t0: float, answer_s: float | None
    ) -> Decision:
        assert self.fallback is not None
        route = self.fallback.decide(view, snapshot)  # its LookupError: no route yet
        if answer_s is not None and self.answer_walls is not None:
            self.answer_walls.append(answer_s)
        return Decision(route, "fallback", reason, time.perf_counter() - t0, answer_s)

    # ---------------------------------------------------------------------- outcomes

    def on_complete(self, view: RequestView, outcome: Outcome) -> None:
        """Tell the policy how a request it routed ended (never raises, never blocks long)."""
        if self._on_complete is None:
            return
        with contextlib.suppress(Exception):  # a policy's feedback must not fail a request
            self._on_complete(view, outcome)

    def on_record(self, rec: Any) -> None:
        """`on_complete` for a request record that ended (one the policy or fallback routed)."""
        if self._on_complete is None or rec.decided_by is None:
            return
        view = RequestView(
            rec.id, rec.input_tokens, rec.output_tokens, rec.cached_local, rec.cached_prfaas
        )
        self.on_complete(view, Outcome(
            rec.status, rec.route, rec.prefill_instance, rec.decode_instance, rec.ttft, rec.e2e,
            rec.failure_reason, rec.decided_by,
        ))  # fmt: skip

    def close(self) -> None:
        close = getattr(self.policy, "close", None)
        if callable(close):
            close()

    async def aclose(self) -> None:
        aclose = getattr(self.policy, "aclose", None)
        if callable(aclose):
            await aclose()
        else:
            self.close()


def _untimed(
    decide: Callable[[RequestView, Snapshot], Route],
) -> Callable[[RequestView, Snapshot], tuple[Route, float | None]]:
    return lambda view, snapshot: (decide(view, snapshot), None)


def _auntimed(
    adecide: Callable[[RequestView, Snapshot], Awaitable[Route]],
) -> Callable[[RequestView, Snapshot], Awaitable[tuple[Route, float | None]]]:
    async def timed(view: RequestView, snapshot: Snapshot) -> tuple[Route, float | None]:
        return await adecide(view, snapshot), None

    return timed


def _answer_s(exc: BaseException) -> float | None:
    """The send-to-answer seconds of a failed decision whose answer was read in time."""
    answer_s = getattr(exc, "answer_s", None)
    return answer_s if isinstance(answer_s, float) else None


def describe(spec: str) -> str:
    """A short label for a policy name (a URL without its fragment's settings)."""
    if is_http_spec(spec):
        return urllib.parse.urldefrag(spec)[0]
    return spec
