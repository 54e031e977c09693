"""The router's dispatch on the sim: route with the policy, run the attempt on the modelled
instances and link, retry what failed elsewhere, and fill the request's record.

It follows services.router.dispatch (their shared constants: services.dispatch_rules): up to
MAX_ATTEMPTS attempts; an instance that did not answer is marked down and avoided, a KV transfer
that could not cross the link sends the next attempt to local prefill (`prfaas` excluded), a
prefill that failed locally makes the next attempt avoid its decode instance; with no instance to
route to, a request waits up to NO_ROUTE_WAIT_S for one to come back. Records carry the same
fields and reasons as live ones. The prefix cache (kvcache.manager) is the live router's: lookups
before routing, `plan_request` for what is computed and sent, inserts after a prefill, pulls
across the link as flows.

An attempt is a chain of callbacks on the virtual loop (prefill queued -> started -> ended ->
KV delivered -> admitted -> tokens done), not a coroutine: the sim spends its time on events.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from testbed.clock import Clock
from testbed.kvcache.manager import CacheLookup, CachePlan, KVCacheManager, plan_request
from testbed.kvcache.pool import ChainKeys
from testbed.metrics.records import RequestRecord
from testbed.policy.base import RequestView, Route
from testbed.policy.decider import Decider
from testbed.profiles import ModelProfile
from testbed.scheduler.loops import ControlLoops
from testbed.services.dispatch_rules import MAX_ATTEMPTS, NO_ROUTE_WAIT_S, REGISTER_TIMEOUT_S
from testbed.sim.cluster import SimCluster, SimInstance
from testbed.sim.instances import PrefillJob, Slot
from testbed.sim.link import Flow
from testbed.workload.generate import RequestSpec

__all__ = ["Attempt", "SimDispatcher", "wire_kv_bytes"]


def wire_kv_bytes(model: ModelProfile, tokens: int, byte_scale: float) -> int:
    """sum(engine.emulated.wire_layer_bytes(model, tokens, byte_scale)) without building the
    list: the layers are two groups of near-equal shares (ModelProfile.layer_bytes), so the sum
    of their rounded-up scaled sizes is two products per group (tests/sim check it is equal)."""
    total = round(model.kv_bytes(tokens))
    if total == 0:
        return 0
    kinds = model.layer_kinds
    n_lin = kinds.count("linear")
    n_full = len(kinds) - n_lin
    state = min(round(model.state_bytes), total) if n_lin else 0

    def group(amount: int, parts: int) -> int:
        if parts == 0:
            return 0
        base, extra = divmod(amount, parts)
        return extra * math.ceil((base + 1) / byte_scale) + (parts - extra) * math.ceil(
            base / byte_scale
        )

    return group(state, n_lin) + group(total - state, n_full)


@dataclass(eq=False)
class Attempt:
    req: SimRequest
    prefill: SimInstance
    decode: SimInstance
    plan: CachePlan
    wire_bytes: int
    cross_dc: bool
    job: PrefillJob | None = None
    flow: Flow | None = None
    slot: Slot | None = None
    prefill_charged: bool = True
    """The prefill's call has not answered yet (its KV is not acknowledged)."""
    decode_charged: bool = True
    decoded: bool = False
    """Every token is out; the attempt ends once its prefill's call answers too."""
    over: bool = False
    timer: asyncio.TimerHandle | None = None


@dataclass(eq=False)
class SimRequest:
    spec: RequestSpec
    rec: RequestRecord
    keys: ChainKeys
    """The prompt's prefix-cache chain keys, hashed once for every lookup and insert."""
    attempt: int = 0
    exclude: set[str] = field(default_factory=set)
    reasons: list[str] = field(default_factory=list)
    current: Attempt | None = None
    route_deadline: float | None = None


class SimDispatcher:
    """Every request of a simulated run, from arrival to its record. `live` is the clock the
    live router would run on (the scenario's time_scale): its wall-time constants (how long a
    request waits for a route, for a decode to register) convert to real time through it."""

    def __init__(
        self,
        cluster: SimCluster,
        decider: Decider,
        cache: KVCacheManager | None,
        control: ControlLoops | None,
        byte_scale: float,
        live: Clock,
        on_record: Callable[[RequestRecord], None],
    ) -> None:
        self.cluster = cluster
        self.loop = cluster.loop
        self.decider = decider
        """The policy behind the shared failure semantics (policy.decider): a decision takes no
        virtual time; its wall latency goes on the record."""
        self.policy = decider.policy
        self.decision_walls: list[float] = []
        """Wall seconds of each decision (the run's `decisions` history event summarises them)."""
        self.cache = cache
        self.control = control
        self.byte_scale = byte_scale
        self.model = cluster.model
        self.n_layers = self.model.n_layers
        self.on_record = on_record
        self.no_route_wait = live.real(NO_ROUTE_WAIT_S)
        self.no_route_poll = cluster.health_interval / 2
        self.register_timeout = live.real(REGISTER_TIMEOUT_S)
        self.in_flight: dict[str, SimRequest] = {}
        self._sizes: dict[int, int] = {}

    # ------------------------------------------------------------------ requests

    def submit(self, spec: RequestSpec) -> None:
        """The request arrives now."""
        rec = RequestRecord(
            id=spec.id,
            input_tokens=spec.input_tokens,
            output_tokens=spec.output_tokens,
            arrival=self.loop.time(),
        )
        req = SimRequest(spec, rec, ChainKeys(spec.hash_ids))
        self.in_flight[spec.id] = req
        self._try(req)

    def fail_all(self, reason: str) -> None:
        """End every request still in flight as failed (the run stops)."""
        for req in list(self.in_flight.values()):
            if req.current is not None:
                self._abandon(req.current)
            self._finish(req, reason)

    def _finish(self, req: SimRequest, failure: str | None) -> None:
        rec = req.rec
        if failure is None:
            rec.status = "completed"
        else:
            rec.status, rec.failure_reason = "failed", failure
        self.in_flight.pop(rec.id, None)
        self.on_record(rec)
        self.decider.on_record(rec)

    def _kv_wire_bytes(self, kv_tokens: int) -> int:
        n = self._sizes.get(kv_tokens)
        if n is None:
            n = self._sizes[kv_tokens] = wire_kv_bytes(self.model, kv_tokens, self.byte_scale)
        return n

    def _routed_length(self, view: RequestView) -> int:
        """As RouterState._routed_length: the prompt for cache-blind policies, the part no
        usable cache holds for cache-aware ones (what the scheduler's planner is fed)."""
        if not self.policy.cache_aware:
            return view.input_tokens
        scarce = self.cluster.state.scarce
        cached = view.cached_local if scarce else max(view.cached_local, view.cached_prfaas)
        return max(1, view.input_tokens - cached)

    # ------------------------------------------------------------------ one attempt

    def _try(self, req: SimRequest) -> None:
        rec = req.rec
        look = self.cache.lookup(req.keys, rec.input_tokens) if self.cache else CacheLookup()
        view = RequestView(
            rec.id, rec.input_tokens, rec.output_tokens, look.local, look.prfaas,
            self.cluster.model.kv_bytes(rec.input_tokens),
        )  # fmt: skip
        if self.control is not None and req.attempt == 0 and req.route_deadline is None:
            self.control.observe(rec.arrival, self._routed_length(view))
        try:
            decision = self.decider.decide(view, self.cluster.snapshot(frozenset(req.exclude)))
        except (LookupError, ValueError) as exc:
            now = self.loop.time()
            if req.route_deadline is None:
                req.route_deadline = now + self.no_route_wait
            if now >= req.route_deadline:
                self._request_failed(req, f"no route: {exc}")
                return
            healthy = self.cluster.healthy
            req.exclude = {
                x for x in req.exclude if x in ("prfaas", "local") or not healthy.get(x, True)
            }
            self.loop.call_later(self.no_route_poll, self._try, req)
            return
        req.route_deadline = None
        decision.write(rec, wall=False)  # wall times would make requests.jsonl differ per run
        self.decision_walls.append(decision.wall_s)
        self._dispatch(req, decision.route, look)

    def _dispatch(self, req: SimRequest, route: Route, look: CacheLookup) -> None:
        rec = req.rec
        prefill = self.cluster.instances[route.prefill_instance]
        decode = self.cluster.instances[route.decode_instance]
        rec.route = route.prefill_cluster
        rec.prefill_instance, rec.decode_instance = prefill.id, decode.id
        plan = self._cache_plan(req, route, look)
        if plan is None:
            return  # a prefix pull is under way; it dispatches when it ends
        self._run(req, route, prefill, decode, plan)

    def _cache_plan(self, req: SimRequest, route: Route, look: CacheLookup) -> CachePlan | None:
        rec = req.rec
        if self.cache is None:
            n = route.uncached_tokens
            return CachePlan(n, rec.input_tokens - n, n)
        rec.cached_local, rec.cached_prfaas = look.local, look.prfaas
        cluster = route.prefill_cluster
        plan = plan_request(rec.input_tokens, look, cluster, route.pull_prefix_tokens)
        if not plan.pull_tokens:
            return plan
        rec.pull_tokens = plan.pull_tokens
        link = self.cluster.link
        source = None
        if plan.pull_from == "prfaas" and "prfaas" not in req.exclude and link is not None:
            senders = [
                i for i in self.cluster.snapshot(frozenset(req.exclude)).instances
                if i.cluster == "prfaas" and i.role == "prefill" and i.state == "ok"
            ]  # fmt: skip
            if senders:
                source = min(senders, key=lambda i: (i.outstanding, i.id)).id
        if source is None or link is None:
            rec.pull_status = (
                "skipped: no KV path from the local cluster to PrfaaS"
                if plan.pull_from == "local"
                else "skipped: no PrfaaS instance or link to pull from"
            )
            return plan_request(rec.input_tokens, look, cluster, 0)
        started = self.loop.time()
        wire = self._kv_wire_bytes(plan.pull_tokens)
        rec.pull_wire_bytes += wire

        def pulled(at: float) -> None:
            def go() -> None:
                rec.pull_s, rec.pull_status = self.loop.time() - started, "ok"
                assert self.cache is not None
                self.cache.insert(cluster, req.keys, plan.reused_tokens)
                self._after_pull(req, route, plan)

            self.loop.call_at(at, go)

        def failed(reason: str) -> None:
            rec.pull_s, rec.pull_status = self.loop.time() - started, f"failed: {reason}"
            self._after_pull(req, route, plan_request(rec.input_tokens, look, cluster, 0))

        link.start(Flow(wire * self.byte_scale, pulled, failed, sender=source))
        return None

    def _after_pull(self, req: SimRequest, route: Route, plan: CachePlan) -> None:
        inst = self.cluster.instances
        self._run(req, route, inst[route.prefill_instance], inst[route.decode_instance], plan)

    def _run(
        self,
        req: SimRequest,
        route: Route,
        prefill: SimInstance,
        decode: SimInstance,
        plan: CachePlan,
    ) -> None:
        rec = req.rec
        rec.cached_tokens = plan.reused_tokens
        rec.threshold_tokens = route.threshold_tokens
        rec.cross_dc = prefill.cluster != decode.cluster
        wire = self._kv_wire_bytes(plan.kv_tokens)
        rec.kv_wire_bytes_expected = wire
        rec.kv_wire_bytes_sent = rec.kv_wire_bytes_received = 0
        if rec.tokens_out == 0:
            rec.kv_verified = False
        att = Attempt(req, prefill, decode, plan, wire, rec.cross_dc)
        req.current = att
        self.cluster.charge(prefill.id, plan.prefill_tokens, decode.id, rec.output_tokens, +1)
        if not decode.alive or decode.decode is None:
            self._attempt_failed(att, f"decode on {decode.id} lost (ClientConnectorError)",
                                 dead=decode.id)  # fmt: skip
            return
        if decode.paused:
            att.timer = self.loop.call_later(
                self.register_timeout,
                self._attempt_failed,
                att,
                f"decode on {decode.id}: did not register the request within "
                f"{REGISTER_TIMEOUT_S:g}s",
                decode.id,
            )
            return
        if not prefill.alive or prefill.prefill is None:
            self._attempt_failed(att, f"prefill on {prefill.id} unreachable (ClientConnectorError)",
                                 dead=prefill.id)  # fmt: skip
            return
        att.job = PrefillJob(
            plan.prefill_tokens,
            on_start=lambda t, d: self._prefill_started(att, t, d),
            on_end=lambda t: self._prefill_ended(att, t),
            on_fail=lambda reason: None,
        )
        prefill.prefill.submit(att.job)

    def _prefill_started(self, att: Attempt, t: float, d: float) -> None:
        if att.over:
            return
        rec = att.req.rec
        rec.prefill_start = t
        rec.transfer_start = t + d / self.n_layers  # the first layer's KV is complete
        link = self.cluster.link
        if att.cross_dc and link is not None:
            att.flow = Flow(
                att.wire_bytes * self.byte_scale,
                on_done=lambda at: self._delivered(att, at, link.one_way()),
                on_fail=lambda reason: self._transfer_failed(att, reason),
                sender=att.prefill.id,
            )
            link.start(att.flow, d)

    def _prefill_ended(self, att: Attempt, t: float) -> None:
        if att.over:
            return
        att.req.rec.prefill_end = t
        if not att.cross_dc:  # in the datacenter: the last layer lands as it is computed
            self._delivered(att, t, 0.0)

    def _transfer_failed(self, att: Attempt, reason: str) -> None:
        if att.over:
            return
        att.flow = None
        att.job = None  # the prefill computes on: only its transfer failed (as live)
        self._attempt_failed(att, f"prefill on {att.prefill.id}: {reason}", link_failed=True)

    def _delivered(self, att: Attempt, at: float, ack_delay: float) -> None:
        """The KV's last byte reaches the decode instance at `at`; the prefill's answer (its
        KV acknowledged) comes `ack_delay` later."""
        att.flow = None
        self.loop.call_at(at, self._admit, att)
        self.loop.call_at(at + ack_delay, self._acked, att)

    def _admit(self, att: Attempt) -> None:
        if att.over:
            return
        rec, dec = att.req.rec, att.decode.decode
        if not att.decode.alive or dec is None:
            return  # its kill already failed the attempt
        rec.kv_wire_bytes_received = att.wire_bytes
        rec.kv_verified = True
        att.slot = Slot(att.req.rec.output_tokens, lambda f, last: self._decoded(att, f, last))
        dec.admit(att.slot)

    def _acked(self, att: Attempt) -> None:
        """The prefill's call answers: its KV is acknowledged (the live router awaits this
        before the decode's end, so a request ends only when both have)."""
        if not att.prefill_charged:
            return  # the attempt was abandoned
        rec = att.req.rec
        rec.transfer_end = self.loop.time()
        rec.kv_wire_bytes_sent = att.wire_bytes
        self._release_prefill(att)
        if self.cache is not None:
            self.cache.insert(att.prefill.cluster, att.req.keys, rec.input_tokens)
            self.cache.record_prefill(att.prefill.cluster, att.plan)
        if att.decoded:
            self._complete(att)

    def _release_prefill(self, att: Attempt) -> None:
        if att.prefill_charged:
            att.prefill_charged = False
            self.cluster.charge(att.prefill.id, att.plan.prefill_tokens, None, 0, -1)

    def _decoded(self, att: Attempt, first: float, last: float) -> None:
        if att.over:
            return
        rec = att.req.rec
        if rec.first_token is None or rec.tokens_out == 0:
            rec.first_token = first
        rec.last_token = last
        rec.tokens_out = rec.output_tokens
        self._release_decode(att)
        att.decoded = True
        if not att.prefill_charged:
            self._complete(att)

    def _complete(self, att: Attempt) -> None:
        att.over = True
        att.req.current = None
        self._finish(att.req, None)

    def _release_decode(self, att: Attempt) -> None:
        if att.decode_charged:
            att.decode_charged = False
            self.cluster.charge(None, 0, att.decode.id, att.req.rec.output_tokens, -1)

    # ------------------------------------------------------------------ failures

    def _abandon(self, att: Attempt) -> None:
        """Stop everything an attempt holds (the live router cancels its prefill call and
        the decode's wait); release its load."""
        if att.over:
            return
        att.over = True
        if att.timer is not None:
            att.timer.cancel()
        if att.job is not None and att.prefill.prefill is not None:
            att.prefill.prefill.cancel(att.job)
        if att.flow is not None and self.cluster.link is not None:
            self.cluster.link.cancel(att.flow)
        if att.slot is not None and att.decode.decode is not None:
            dec = att.decode.decode
            if not att.slot.done and att.slot in dec.active:
                dec.sync(self.loop.time())
            if att.slot.generated > 0:  # tokens streamed before it broke stay streamed
                rec = att.req.rec
                if rec.tokens_out == 0:
                    rec.first_token = att.slot.first_token
                rec.tokens_out = max(rec.tokens_out, att.slot.generated)
            dec.cancel(att.slot)
        self._release_prefill(att)
        self._release_decode(att)

    def _attempt_failed(
        self,
        att: Attempt,
        reason: str,
        dead: str | None = None,
        link_failed: bool = False,
        suspect: str | None = None,
    ) -> None:
        if att.over:
            return
        self._abandon(att)
        req = att.req
        req.current = None
        req.reasons.append(reason)
        req.attempt += 1
        req.rec.retries = req.attempt
        if dead is not None:
            self.cluster.mark_down(dead)
            req.exclude.add(dead)
        if link_failed:
            req.exclude.add("prfaas")
        if suspect is not None:
            req.exclude.add(suspect)
        if req.attempt >= MAX_ATTEMPTS:
            self._finish(req, "; then ".join(req.reasons))
            return
        self._try(req)

    def _request_failed(self, req: SimRequest, reason: str) -> None:
        self._finish(req, "; then ".join([*req.reasons, reason]))

    # ------------------------------------------------------------------ process faults

    def lost_instance(self, inst: SimInstance, reason: str) -> None:
        """`inst` died: every attempt that used it fails and it is marked down."""
        for req in list(self.in_flight.values()):
            att = req.current
            if att is None or att.over:
                continue
            if att.decode is inst and not att.decoded:
                self._attempt_failed(att, f"decode on {inst.id} lost ({reason})", dead=inst.id)
            elif att.prefill is inst and att.prefill_charged:
                self._attempt_failed(
                    att, f"prefill on {inst.id} unreachable ({reason})", dead=inst.id
                )
