"""The router's dispatch on the sim: the dispatch core (testbed.dispatch.core) driven by the
virtual loop. The core owns the rules the live router (services.router.dispatch) follows too:
attempts and what a failure excludes, the reasons and their join, the no-route wait, the routed
length, the cache plan and the record's fields. This module runs the attempt on the modelled
instances and link, and turns what happens to them (a kill, a pause, a failed flow) into the
core's `Failure`s.

An attempt is a chain of callbacks on the virtual loop (prefill queued -> started -> ended ->
KV delivered -> admitted -> tokens done), not a coroutine: the sim spends its time on events.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass

from testbed.clock import Clock
from testbed.dispatch import core
from testbed.dispatch.core import Failure, RequestDispatch
from testbed.dispatch.rules import NO_ROUTE_WAIT_S, REGISTER_TIMEOUT_S
from testbed.kvcache.manager import CacheLookup, CachePlan, KVCacheManager
from testbed.kvcache.pool import ChainKeys
from testbed.metrics.records import RequestRecord
from testbed.policy.base import Route
from testbed.policy.decider import Decider
from testbed.profiles import ModelProfile
from testbed.scheduler.loops import ControlLoops
from testbed.sim.cluster import SimCluster, SimInstance
from testbed.sim.instances import PrefillJob, Slot
from testbed.sim.link import Flow
from testbed.workload.generate import RequestSpec

__all__ = ["Attempt", "SimDispatcher", "wire_kv_bytes"]

CONNECT_ERROR = "ClientConnectorError"
"""What the live router's call to a dead or absent instance raises (services.router.workers)."""


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


@dataclass(eq=False, slots=True)
class Attempt:
    req: SimRequest
    prefill: SimInstance
    decode: SimInstance
    plan: CachePlan
    wire_bytes: int
    cross_dc: bool
    load: core.AttemptLoad
    """What it holds on the load book; `load.prefill_held` until its prefill's call answers."""
    job: PrefillJob | None = None
    flow: Flow | None = None
    slot: Slot | None = None
    decoded: bool = False
    """Every token is out; the attempt ends once its prefill's call answers too."""
    over: bool = False
    timer: asyncio.TimerHandle | None = None


def _unlink(att: Attempt) -> None:
    """Drop an ended attempt's references to what calls back into it (its prefill job's and
    decode slot's callbacks close over it; its request points at it), so that reference
    counting frees a request's objects when it ends: left in cycles, the 10K-GPU hour's
    million requests waited for the cyclic collector (bench/sim_scale.py, docs/sim.md)."""
    att.req.current = None
    att.job = att.slot = att.flow = None
    att.timer = None


@dataclass(eq=False, slots=True)
class SimRequest:
    spec: RequestSpec
    core: RequestDispatch
    """Its attempts, exclusions and reasons (the rules shared with the live router)."""
    rec: RequestRecord
    """core.rec, read ten times a request: an attribute, not a property."""
    keys: ChainKeys
    """The prompt's prefix-cache chain keys, hashed once for every lookup and insert."""
    current: Attempt | None = None


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
        dispatch = RequestDispatch(rec, self.cluster.mark_down)
        req = SimRequest(spec, dispatch, rec, ChainKeys(spec.hash_ids))
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
        core.finish(rec, failure)
        self.in_flight.pop(rec.id, None)
        self.on_record(rec)
        self.decider.on_record(rec)

    def _kv_wire_bytes(self, kv_tokens: int) -> int:
        n = self._sizes.get(kv_tokens)
        if n is None:
            n = self._sizes[kv_tokens] = wire_kv_bytes(self.model, kv_tokens, self.byte_scale)
        return n

    # ------------------------------------------------------------------ one attempt

    def _try(self, req: SimRequest) -> None:
        rec = req.rec
        look = self.cache.lookup(req.keys, rec.input_tokens) if self.cache else CacheLookup()
        view = core.request_view(rec, look, self.model)
        if self.control is not None and req.core.observe_once():
            routed = core.routed_length(view, self.policy.cache_aware, self.cluster.state.scarce)
            self.control.observe(rec.arrival, routed)
        try:
            decision = self.decider.decide(view, self.cluster.snapshot(req.core.avoiding))
        except (LookupError, ValueError) as exc:
            final = req.core.no_route(exc, self.loop.time(), self.no_route_wait)
            if final is not None:
                self._finish(req, req.core.fail(final))
                return
            self.loop.call_later(self.no_route_poll, self._ask_again, req)
            return
        req.core.routed()
        decision.write(rec, wall=False)  # wall times would make requests.jsonl differ per run
        self.decision_walls.append(decision.wall_s)
        self._dispatch(req, decision.route, look)

    def _ask_again(self, req: SimRequest) -> None:
        req.core.forgive(self.cluster.healthy)
        self._try(req)

    def _dispatch(self, req: SimRequest, route: Route, look: CacheLookup) -> None:
        rec = req.rec
        prefill = self.cluster.instances[route.prefill_instance]
        decode = self.cluster.instances[route.decode_instance]
        core.begin_attempt(rec, route, prefill.id, decode.id)
        link = self.cluster.link
        plan, source = core.cache_plan(
            rec,
            route,
            look,
            cache_on=self.cache is not None,
            avoiding=req.core.avoiding,
            snapshot=self.cluster.snapshot,
            has_link=link is not None,
        )
        if source is None or link is None:
            self._run(req, route, prefill, decode, plan)
            return
        started = self.loop.time()
        wire = self._kv_wire_bytes(plan.pull_tokens)
        rec.pull_wire_bytes += wire

        def pulled(at: float) -> None:
            def go() -> None:
                rec.pull_s, rec.pull_status = self.loop.time() - started, "ok"
                self._after_pull(req, route, look, plan, True)

            self.loop.call_at(at, go)

        def failed(reason: str) -> None:
            rec.pull_s, rec.pull_status = self.loop.time() - started, f"failed: {reason}"
            self._after_pull(req, route, look, plan, False)

        link.start(Flow(wire * self.byte_scale, pulled, failed, sender=source))

    def _after_pull(
        self, req: SimRequest, route: Route, look: CacheLookup, plan: CachePlan, ok: bool
    ) -> None:
        assert self.cache is not None
        plan = core.pull_done(req.rec, route, look, plan, self.cache, req.keys, ok)
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
        wire = self._kv_wire_bytes(plan.kv_tokens)
        core.start_attempt(rec, route, prefill.cluster != decode.cluster, plan, wire)
        load = core.AttemptLoad(
            self.cluster.book, prefill.id, plan.prefill_tokens, decode.id, rec.output_tokens
        )
        att = Attempt(req, prefill, decode, plan, wire, rec.cross_dc, load)
        req.current = att
        if not decode.alive or decode.decode is None:
            self._attempt_failed(att, Failure.decode_lost(decode.id, CONNECT_ERROR))
            return
        if decode.paused:
            att.timer = self.loop.call_later(
                self.register_timeout, self._attempt_failed, att, Failure.not_registered(decode.id)
            )
            return
        if not prefill.alive or prefill.prefill is None:
            self._attempt_failed(att, Failure.prefill_unreachable(prefill.id, CONNECT_ERROR))
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
        failure = Failure.prefill_failed(att.prefill.id, reason, True, att.decode.id)
        self._attempt_failed(att, failure)

    def _delivered(self, att: Attempt, at: float, ack_delay: float) -> None:
        """The KV's last byte reaches the decode instance at `at`; the prefill's answer (its
        KV acknowledged) comes `ack_delay` later."""
        att.flow = None
        if ack_delay > 0:
            self.loop.call_at(at, self._admit, att)
            self.loop.call_at(at + ack_delay, self._acked, att)
        else:  # both due at once: one timer (the two would have run back to back)
            self.loop.call_at(at, self._admit_acked, att)

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

    def _admit_acked(self, att: Attempt) -> None:
        self._admit(att)
        self._acked(att)

    def _acked(self, att: Attempt) -> None:
        """The prefill's call answers: its KV is acknowledged (the live router awaits this
        before the decode's end, so a request ends only when both have)."""
        if not att.load.prefill_held:
            return  # the attempt was abandoned
        rec = att.req.rec
        rec.transfer_end = self.loop.time()
        rec.kv_wire_bytes_sent = att.wire_bytes
        att.load.release_prefill()
        core.prefill_answered(self.cache, att.prefill.cluster, att.req.keys, rec, att.plan)
        if att.decoded:
            self._complete(att)

    def _decoded(self, att: Attempt, first: float, last: float) -> None:
        if att.over:
            return
        rec = att.req.rec
        if rec.first_token is None or rec.tokens_out == 0:
            rec.first_token = first
        rec.last_token = last
        rec.tokens_out = rec.output_tokens
        att.load.release_decode()
        att.decoded = True
        if not att.load.prefill_held:
            self._complete(att)

    def _complete(self, att: Attempt) -> None:
        att.over = True
        _unlink(att)
        self._finish(att.req, None)

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
        att.load.release_prefill()
        att.load.release_decode()
        _unlink(att)

    def _attempt_failed(self, att: Attempt, failure: Failure) -> None:
        if att.over:
            return
        self._abandon(att)
        req = att.req
        final = req.core.failed(failure)
        if final is not None:
            self._finish(req, final)
            return
        self._try(req)

    # ------------------------------------------------------------------ process faults

    def lost_instance(self, inst: SimInstance, reason: str) -> None:
        """`inst` died: every attempt that used it fails and it is marked down."""
        for req in list(self.in_flight.values()):
            att = req.current
            if att is None or att.over:
                continue
            if att.decode is inst and not att.decoded:
                self._attempt_failed(att, Failure.decode_lost(inst.id, reason))
            elif att.prefill is inst and att.load.prefill_held:
                self._attempt_failed(att, Failure.prefill_unreachable(inst.id, reason))
