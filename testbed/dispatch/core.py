"""The dispatch core: the rules of one request's way through its attempts, written once, with
no I/O, for the two drivers that run it (the live router, services.router.dispatch, on aiohttp;
the sim, sim.dispatch, on its virtual loop).

A driver feeds it what happened (a decision or none, a failed attempt, a pull's outcome, a
prefill's answer) and does what it is told (retry, wait a poll and ask again, fail the request
with this reason, pull the prefix from this instance). What the core owns:

- the attempts: at most MAX_ATTEMPTS, each failure's reason kept and joined with "; then ";
- what a failure excludes: a dead instance is marked down and avoided, a KV transfer that could
  not cross the link sends the next attempt to local prefill (`prfaas` avoided), a prefill that
  failed locally makes the next attempt avoid its decode instance;
- the no-route wait: with no instance to route to, ask again every poll, avoiding only what is
  still down, until the wait is over;
- the routed length the scheduler's planner is fed, once per request;
- the cache plan: what the prefill computes and what KV goes to decode, and where a prefix pull
  comes from (or why it is skipped);
- the attempt's record fields, the KV verification reset and the cache's bookkeeping once a
  prefill answered;
- the load accounting: what an attempt holds on the load book and when each half is released;
- the policy's snapshot and the cost model, from the load book and the scheduler state.

The messages a failure carries are made here too (`Failure` constructors), so the live
workers' errors and the sim's modelled ones read the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from testbed.dispatch.rules import MAX_ATTEMPTS, REGISTER_TIMEOUT_S
from testbed.kvcache.manager import CacheLookup, CachePlan, KVCacheManager, plan_request
from testbed.kvcache.pool import ChainKeys
from testbed.metrics.records import RequestRecord
from testbed.policy.base import Cluster, CostModel, RequestView, Route, Snapshot
from testbed.policy.book import LoadBook
from testbed.profiles import ModelProfile
from testbed.scheduler.state import SchedulerState

__all__ = [
    "REASON_JOIN",
    "SKIP_LOCAL",
    "SKIP_PRFAAS",
    "AttemptLoad",
    "Failure",
    "RequestDispatch",
    "begin_attempt",
    "cache_plan",
    "cluster_hardware",
    "cost_model",
    "finish",
    "prefill_answered",
    "pull_done",
    "request_view",
    "routed_length",
    "snapshot",
    "start_attempt",
]

REASON_JOIN = "; then "
"""Between the reasons of a request's failed attempts, in order."""
SKIP_LOCAL = "skipped: no KV path from the local cluster to PrfaaS"
SKIP_PRFAAS = "skipped: no PrfaaS instance or link to pull from"


@dataclass(frozen=True)
class Failure:
    """One failed attempt: its reason and what the next attempt must avoid."""

    reason: str
    dead: str | None = None
    """An instance that did not answer: out of rotation until its health check answers."""
    link_failed: bool = False
    """The KV could not cross the link: the next attempt prefills locally."""
    suspect: str | None = None
    """An instance this request avoids on its next attempt (not marked down)."""

    @classmethod
    def prefill_unreachable(cls, instance: str, why: str) -> Failure:
        return cls(f"prefill on {instance} unreachable ({why})", dead=instance)

    @classmethod
    def decode_lost(cls, instance: str, why: str) -> Failure:
        return cls(f"decode on {instance} lost ({why})", dead=instance)

    @classmethod
    def not_registered(cls, decode: str) -> Failure:
        """The decode did not register the request in time: paused or wedged."""
        return cls(
            f"decode on {decode}: did not register the request within {REGISTER_TIMEOUT_S:g}s",
            dead=decode,
        )

    @classmethod
    def prefill_failed(
        cls, prefill: str, error: object, cross_dc: bool, decode: str | None
    ) -> Failure:
        """The prefill answered with an error (its KV send failed): across the link, retry
        locally; in the datacenter, avoid the decode it sent to."""
        return cls(
            f"prefill on {prefill}: {error}",
            link_failed=cross_dc,
            suspect=None if cross_dc else decode,
        )


@dataclass(eq=False, slots=True)
class RequestDispatch:
    """One request's attempts, exclusions, reasons and no-route wait."""

    rec: RequestRecord
    mark_down: Callable[[str], None]
    """Take an instance out of rotation (the driver's load book and health checks)."""
    attempt: int = 0
    exclude: set[str] = field(default_factory=set)
    reasons: list[str] = field(default_factory=list)
    route_deadline: float | None = None
    observed: bool = False

    @property
    def avoiding(self) -> frozenset[str]:
        """Instances and clusters the next decision must not use."""
        return frozenset(self.exclude)

    def observe_once(self) -> bool:
        """True the first time only: the scheduler sees each request's length once."""
        first, self.observed = not self.observed, True
        return first

    def failed(self, failure: Failure) -> str | None:
        """An attempt failed: None to retry (avoiding what failed), or the request's failure
        reason once its attempts are spent."""
        self.reasons.append(failure.reason)
        self.attempt += 1
        self.rec.retries = self.attempt
        if failure.dead is not None:
            self.mark_down(failure.dead)
            self.exclude.add(failure.dead)
        if failure.link_failed:
            self.exclude.add("prfaas")
        if failure.suspect is not None:
            self.exclude.add(failure.suspect)
        if self.attempt >= MAX_ATTEMPTS:
            return REASON_JOIN.join(self.reasons)
        return None

    def fail(self, reason: str) -> str:
        """The request fails for good: `reason` after the reasons of the attempts before."""
        return REASON_JOIN.join([*self.reasons, reason])

    def no_route(self, exc: Exception, now: float, wait: float) -> str | None:
        """No instance can take the request: this attempt's failure reason once `wait` (from
        the first miss, in the driver's clock) is over (the request then fails: `fail`), else
        None (ask again after a poll)."""
        if self.route_deadline is None:
            self.route_deadline = now + wait
        if now >= self.route_deadline:
            return f"no route: {exc}"
        return None

    def forgive(self, healthy: Mapping[str, bool]) -> None:
        """Before asking again: stop avoiding instances that are healthy again (clusters stay
        avoided: a broken link is not healed by a health check)."""
        self.exclude = {
            x for x in self.exclude if x in ("prfaas", "local") or not healthy.get(x, True)
        }

    def routed(self) -> None:
        self.route_deadline = None


def request_view(rec: RequestRecord, look: CacheLookup, model: ModelProfile) -> RequestView:
    """What the policy is told of the request: its lengths, what each cluster caches of it and
    the size of its KV."""
    return RequestView(
        rec.id, rec.input_tokens, rec.output_tokens, look.local, look.prfaas,
        model.kv_bytes(rec.input_tokens),
    )  # fmt: skip


def routed_length(view: RequestView, cache_aware: bool, scarce: bool) -> int:
    """The length the policy compares with t: the whole prompt for cache-blind policies, the
    part no usable cache holds for the cache-aware rule. The scheduler's planner is fed these,
    so the t it plans fits the lengths the routing really sees."""
    if not cache_aware:
        return view.input_tokens
    local, prfaas = view.cached_local, view.cached_prfaas
    cached = prfaas if not scarce and prfaas > local else local  # max() without the call
    uncached = view.input_tokens - cached
    return uncached if uncached > 1 else 1


def begin_attempt(
    rec: RequestRecord,
    route: Route,
    prefill: str,
    decode: str,
) -> None:
    """The route's fields on the record, before the cache plan."""
    rec.route = route.prefill_cluster
    rec.prefill_instance, rec.decode_instance = prefill, decode


def cache_plan(
    rec: RequestRecord,
    route: Route,
    look: CacheLookup,
    *,
    cache_on: bool,
    avoiding: frozenset[str],
    snapshot: Callable[[frozenset[str]], Snapshot],
    has_link: bool,
) -> tuple[CachePlan, str | None]:
    """What the prefill computes and what KV goes to decode (kvcache.manager's byte model),
    and the PrfaaS instance to pull the prefix from first when the route asks for a pull
    (None: no pull; the record says why one was skipped).

    Without a cache (or with an engine whose KV is always the whole prompt) the route's own
    uncached length is both."""
    if not cache_on:
        n = route.uncached_tokens
        return CachePlan(n, rec.input_tokens - n, n), None
    rec.cached_local, rec.cached_prfaas = look.local, look.prfaas
    cluster = route.prefill_cluster
    plan = plan_request(rec.input_tokens, look, cluster, route.pull_prefix_tokens)
    if not plan.pull_tokens:
        return plan, None
    rec.pull_tokens = plan.pull_tokens
    if plan.pull_from == "prfaas" and "prfaas" not in avoiding and has_link:
        senders = [
            i for i in snapshot(avoiding).instances
            if i.cluster == "prfaas" and i.role == "prefill" and i.state == "ok"
        ]  # fmt: skip
        if senders:
            return plan, min(senders, key=lambda i: (i.outstanding, i.id)).id
    rec.pull_status = SKIP_LOCAL if plan.pull_from == "local" else SKIP_PRFAAS
    return plan_request(rec.input_tokens, look, cluster, 0), None


def pull_done(
    rec: RequestRecord,
    route: Route,
    look: CacheLookup,
    plan: CachePlan,
    cache: KVCacheManager,
    keys: Sequence[int] | ChainKeys,
    ok: bool,
) -> CachePlan:
    """A prefix pull ended: with it, its prefix is cached where the prefill runs and the plan
    stands; without it, the prefill computes the prefix instead."""
    if not ok:
        return plan_request(rec.input_tokens, look, route.prefill_cluster, 0)
    cache.insert(route.prefill_cluster, keys, plan.reused_tokens)
    return plan


def start_attempt(
    rec: RequestRecord, route: Route, cross_dc: bool, plan: CachePlan, wire_bytes: int
) -> None:
    """The attempt's fields on the record once its cache plan is known. KV verification is
    reset unless tokens already streamed (they came from an earlier attempt's KV)."""
    rec.cached_tokens = plan.reused_tokens
    rec.threshold_tokens = route.threshold_tokens
    rec.cross_dc = cross_dc
    rec.kv_wire_bytes_expected = wire_bytes
    rec.kv_wire_bytes_sent = rec.kv_wire_bytes_received = 0
    if rec.tokens_out == 0:
        rec.kv_verified = False


def prefill_answered(
    cache: KVCacheManager | None,
    cluster: Cluster,
    keys: Sequence[int] | ChainKeys,
    rec: RequestRecord,
    plan: CachePlan,
) -> None:
    """The prefill answered (its KV acknowledged): the prompt's prefix now sits in its
    cluster."""
    if cache is not None:
        cache.insert(cluster, keys, rec.input_tokens)
        cache.record_prefill(cluster, plan)


class AttemptLoad:
    """What one attempt holds on the load book (the load signal the policy and the scheduler
    read): its prefill's tokens until the prefill answers (its KV acknowledged), its decode's
    output until the decode ends. Charged when made; each half released once, however the
    attempt ends. (A slotted class: the sim makes one per attempt, a million an hour at 10K
    GPUs.)"""

    __slots__ = ("book", "decode", "decode_held", "out", "prefill", "prefill_held", "tokens")

    def __init__(self, book: LoadBook, prefill: str, tokens: float, decode: str, out: float):
        self.book, self.prefill, self.tokens, self.decode, self.out = (
            book, prefill, tokens, decode, out
        )  # fmt: skip
        self.prefill_held = True
        """The prefill's call has not answered yet."""
        self.decode_held = True
        book.charge(prefill, tokens, decode, out, +1)

    def release_prefill(self) -> None:
        if self.prefill_held:
            self.prefill_held = False
            self.book.charge(self.prefill, self.tokens, None, 0, -1)

    def release_decode(self) -> None:
        if self.decode_held:
            self.decode_held = False
            self.book.charge(None, 0, self.decode, self.out, -1)


def finish(rec: RequestRecord, failure: str | None) -> None:
    """The request's outcome on its record."""
    if failure is None:
        rec.status = "completed"
    else:
        rec.status, rec.failure_reason = "failed", failure


def snapshot(
    book: LoadBook,
    state: SchedulerState,
    now: float,
    rtt_s: float | None,
    has_link: bool,
    exclude: frozenset[str],
) -> Snapshot:
    """The policy's view; `exclude` names instances or clusters this request failed on."""
    link = (
        book.link_view(
            state.bandwidth_estimate, state.link_in_flight, state.link_delivered, rtt_s,
            state.scarce,
        )
        if has_link
        else None
    )  # fmt: skip
    return book.snapshot(now, state.threshold, state.scarce, link, exclude)


def cost_model(model: ModelProfile, hardware: Mapping[str, str]) -> CostModel | None:
    """The model's cost curves on each cluster's hardware; None if a profile lacks a curve."""
    if not hardware or any(h not in model.prefill for h in hardware.values()):
        return None
    return CostModel.of(model, hardware)


def cluster_hardware(instances: Iterable[tuple[str, str | None]]) -> dict[str, str]:
    """(cluster, hardware) of each instance -> each cluster's hardware (the first instance's:
    a cluster is one hardware profile)."""
    hardware: dict[str, str] = {}
    for cluster, hw in instances:
        if hw is not None:
            hardware.setdefault(cluster, hw)
    return hardware
