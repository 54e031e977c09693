"""The router's dispatch: ask the policy for a route, run the request on the chosen instances,
retry what failed elsewhere, and keep the load accounting the policy and the scheduler read.

For each attempt it opens the decode stream first (the decode instance starts waiting for KV)
and then asks the chosen prefill instance to prefill and send KV to that decode instance, through
the link proxy when the two sit in different datacenters. It keeps its own count of outstanding
work per instance, which is the load signal the policy sees. The policy's other inputs (the
threshold, the scarcity verdict) and the instances being drained come from the scheduler's state
(scheduler.state), which the control loops (scheduler.loops) write; the loops see this object
through `scheduler.cluster.Cluster`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence

import aiohttp

from testbed.clock import LiveClock, Scale
from testbed.dispatch import core
from testbed.dispatch.core import Failure, RequestDispatch
from testbed.dispatch.rules import (
    HEALTH_INTERVAL_S,
    MAX_ATTEMPTS,
    NO_ROUTE_WAIT_S,
    REGISTER_TIMEOUT_S,
)
from testbed.kvcache.manager import CacheLookup, CachePlan, KVCacheManager
from testbed.kvcache.pool import ChainKeys
from testbed.metrics.prometheus import RouterMetrics
from testbed.metrics.records import RequestRecord, TokenTimer
from testbed.policy.base import RequestView, Route, Snapshot
from testbed.policy.book import BookEntry, LoadBook
from testbed.policy.decider import Decider, Decision
from testbed.profiles import MODELS
from testbed.scheduler.cluster import Role, SenderCounters
from testbed.scheduler.loops import ControlLoops
from testbed.scheduler.state import SchedulerState
from testbed.services.kv_targets import deployment_targets, kv_address
from testbed.services.pd import DECODE_PREFIX, PREFILL_PREFIX
from testbed.services.router.engines import engine_requests
from testbed.services.router.errors import (
    CLIENT_GONE,
    SHUT_DOWN,
    AttemptError,
    ClientGone,
    RequestError,
)
from testbed.services.router.ids import RequestIds
from testbed.services.router.recorded import RecordLog
from testbed.services.router.steps import TokenSink, run_prefill, stream_decode
from testbed.services.router.workers import HttpWorkers, Workers
from testbed.services.spec import InstanceInfo, ServiceSpec
from testbed.transfer.capability import new_wire_id

__all__ = ["MAX_ATTEMPTS", "RouterState", "TokenSink", "role_view"]


def role_view(info: InstanceInfo, role: str) -> InstanceInfo:
    """The router's view of a switchable PD instance serving `role`: its URL points at the
    role's mount in services/pd.py, so every call the router makes reaches the active role."""
    prefix = PREFILL_PREFIX if role == "prefill" else DECODE_PREFIX
    return info.model_copy(update={"role": role, "url": _base_url(info) + prefix})


def _base_url(info: InstanceInfo) -> str:
    return info.url.removesuffix(PREFILL_PREFIX).removesuffix(DECODE_PREFIX)


class RouterState:
    """One router: its instances and their load, the requests it took, the scheduler state."""

    def __init__(self, spec: ServiceSpec, workers: Workers | None = None) -> None:
        self.spec = spec
        self.clock = LiveClock.of(spec)
        self.scale = Scale.of(spec)
        self.model = MODELS[spec.model]
        self.engine = engine_requests(spec)
        self.decider = Decider.for_spec(spec.policy, spec.policy_config)
        """The policy behind the shared failure semantics (fallback, latency; policy.decider)."""
        self.policy = self.decider.policy
        self.instances = {i.id: role_view(i, i.role) if i.switchable else i for i in spec.instances}
        """The router's view of every instance; a switchable PD instance's entry follows its
        role (role_view)."""
        self.scheduler = SchedulerState(self.clock, spec.threshold_tokens)
        """Threshold, scarcity, bandwidth estimate, draining set and events (the loops')."""
        self.book = LoadBook(
            (BookEntry(i.id, i.cluster, i.role, i.hardware) for i in self.instances.values()),
            self.scheduler.draining,
            core.cost_model(
                self.model,
                core.cluster_hardware((i.cluster, i.hardware) for i in self.instances.values()),
            ),
        )
        """Load, queue wait and health of every instance: what the policy's snapshot reads."""
        self.outstanding = self.book.outstanding
        self.healthy = self.book.healthy
        self.work = self.book.work
        self.rtt_s = spec.scheduler.deployment.link.rtt if spec.scheduler is not None else None
        self.has_link = any(i.cluster == "prfaas" for i in self.instances.values()) and any(
            i.cluster == "local" for i in self.instances.values()
        )
        self.control = (
            ControlLoops(spec.scheduler, self, self.scheduler, self.clock, self.scale)
            if spec.scheduler is not None
            else None
        )
        self.record_log = RecordLog(spec.keeper_token)
        """Finished records, followed live by a keeper at `testbed up` (router.recorded)."""
        self.records: list[RequestRecord] = self.record_log.held
        """The records still held: all of them, unless a keeper kept (and so dropped) some."""
        self.live: dict[str, RequestRecord] = {}
        """Records of the requests in flight, by id (the OpenAI stream reads their tokens)."""
        self.in_flight = 0
        self.ids = RequestIds()
        """Every request id this router has taken, in flight or finished: ids are unique per
        run (records, KV wire ids and checkers key on them); compact (router.ids)."""
        self.closing = False
        self.session: aiohttp.ClientSession | None = None
        self._workers = workers
        self.cache = (
            KVCacheManager.for_model(self.model, spec.prefix_cache_bytes)
            if spec.prefix_cache_bytes is not None
            else None
        )
        """The global KVCache manager: which cluster holds which prefix (kvcache.manager)."""
        self.hash_ids: dict[str, ChainKeys] = {}
        """Prefix-cache chain keys of the requests in flight (by request id), hashed once for
        every lookup and insert."""
        self.health_interval_s = HEALTH_INTERVAL_S
        self.no_route_wait_s = NO_ROUTE_WAIT_S
        self.metrics = RouterMetrics(spec.model, spec.byte_scale)
        """The router's Prometheus series (metrics.prometheus), served at /metrics."""

    @property
    def workers(self) -> Workers:
        assert self._workers is not None, "the router has not started"
        return self._workers

    async def open(self) -> None:
        """Start talking to the instances (unless a test handed its own workers)."""
        if self._workers is None:
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=self.spec.request_timeout_s, sock_connect=5),
            )
            self._workers = HttpWorkers(self.session, self.spec.request_timeout_s)

    async def aclose(self) -> None:
        await self.decider.aclose()
        if self.session is not None:
            await self.session.close()

    # ------------------------------------------------------------------ ids and load

    def next_id(self) -> str:
        """A fresh id, skipping any a client already chose."""
        return self.ids.fresh()

    def claim_id(self, rid: str) -> bool:
        """Take a request id; False if this router has already seen it."""
        return self.ids.claim(rid)

    def snapshot(self, exclude: frozenset[str] = frozenset()) -> Snapshot:
        """The policy's view; `exclude` names instances or clusters this request failed on."""
        return core.snapshot(
            self.book, self.scheduler, self.clock.now(), self.rtt_s, self.has_link, exclude
        )

    def mark_down(self, instance: str) -> None:
        self.book.set_healthy(instance, False)

    async def watch_health(self) -> None:
        """Bring instances that failed back into rotation once they answer /health again."""
        while True:
            await asyncio.sleep(self.health_interval_s)
            for iid, ok in list(self.healthy.items()):
                if not ok and await self.workers.healthy(self.instances[iid]):
                    self.book.set_healthy(iid, True)

    # ------------------------------------------------------------------ scheduler.cluster.Cluster

    async def sender_stats(self, instances: Sequence[str]) -> list[SenderCounters | None]:
        return list(await asyncio.gather(*(self._sender_stats(i) for i in instances)))

    async def _sender_stats(self, instance: str) -> SenderCounters | None:
        doc = await self.workers.stats(self.instances[instance])
        if doc is None:
            return None
        try:
            return SenderCounters(
                float(doc["bytes_acked"]), float(doc["in_flight_bytes"]), float(doc["queued_bytes"])
            )
        except (KeyError, TypeError, ValueError):
            return None

    async def switch_role(self, instance: str, role: Role, switch_s: float) -> bool:
        inst = self.instances[instance]
        doc = await self.workers.post_role(_base_url(inst), role, self.clock.wall(switch_s))
        if doc is None:
            return False
        self.instances[instance] = role_view(inst, role)
        self.book.set_role(instance, role)
        return True

    # ------------------------------------------------------------------ requests

    async def handle(
        self,
        rid: str,
        input_tokens: int,
        output_tokens: int,
        on_tokens: TokenSink,
        hash_ids: tuple[int, ...] = (),
        arrival: float | None = None,
    ) -> RequestRecord:
        """Run one request; `arrival` is when the router received it (default: now), so the
        time spent reading and tokenizing a text prompt counts in its TTFT as a client sees."""
        rec = RequestRecord(
            id=rid,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            arrival=self.clock.now() if arrival is None else arrival,
        )
        if hash_ids:
            self.hash_ids[rid] = ChainKeys(hash_ids)
        self.in_flight += 1
        self.live[rid] = rec
        timer = TokenTimer()  # inter-token gaps as the client gets them (records, /metrics)
        self.metrics.taken(input_tokens)

        async def timed(n: int) -> None:
            gap = timer.add(self.clock.now(), n)
            if gap is None:
                self.metrics.first_token()
            else:
                self.metrics.gap(gap, n)
            self.metrics.tokens(n)
            await on_tokens(n)

        try:
            await self._run(rec, timed)
            core.finish(rec, None)
        except RequestError as exc:
            core.finish(rec, str(exc))
        except ClientGone:  # seen when a token could not be written to it
            core.finish(rec, CLIENT_GONE)
        except asyncio.CancelledError:  # the handler is cancelled when its client disconnects
            core.finish(rec, SHUT_DOWN if self.closing else CLIENT_GONE)
            raise
        finally:
            self.in_flight -= 1
            self.hash_ids.pop(rid, None)
            self.live.pop(rid, None)
            timer.write(rec)
            self.metrics.finished(rec, started=timer.chunks > 0)
            seq = self.record_log.append(rec)
            self.decider.on_record(rec)
        await self.record_log.wait_kept(seq)  # on disk before the client sees the end
        return rec

    async def _run(self, rec: RequestRecord, on_tokens: TokenSink) -> None:
        """Dispatch with retries (dispatch.core.RequestDispatch): a failed attempt is re-routed,
        avoiding what failed.

        A broken cross-datacenter transfer sends the next attempt to local PD-P; a dead
        instance is taken out of rotation until it answers /health again; tokens already
        streamed by a decode instance that died are not streamed twice.
        """
        req = RequestDispatch(rec, self.mark_down)
        while True:  # bounded: RequestDispatch.failed ends the request after MAX_ATTEMPTS
            try:
                await self._attempt(req, on_tokens)
                return
            except RequestError as exc:  # keep the reasons of the attempts that led here
                raise RequestError(req.fail(str(exc))) from None
            except AttemptError as exc:
                final = req.failed(exc.failure)
                if final is not None:
                    raise RequestError(final) from None

    async def _attempt(self, req: RequestDispatch, on_tokens: TokenSink) -> None:
        rec = req.rec
        keys = self.hash_ids.get(rec.id, ())
        decision, look = await self._route(req)
        route = decision.route
        decision.write(rec)
        prefill = self.instances[route.prefill_instance]
        decode = self.instances[route.decode_instance]
        core.begin_attempt(rec, route, prefill.id, decode.id)
        plan = await self._cache_plan(req, route, look, decode)
        wire = self.engine.kv_wire_bytes(rec.input_tokens, plan.kv_tokens)
        core.start_attempt(rec, route, prefill.cluster != decode.cluster, plan, wire)
        kv = kv_address(prefill.cluster, decode)
        if kv is None:
            raise RequestError(f"decode instance {decode.id} has no KV address")
        # Each attempt travels under its own unguessable wire id (transfer/capability.py), the
        # capability only this decode and this prefill are handed; records keep rec.id.
        wire_id = new_wire_id()
        load = core.AttemptLoad(
            self.book, prefill.id, plan.prefill_tokens, decode.id, rec.output_tokens
        )
        try:
            registered = asyncio.Event()
            decode_task = asyncio.create_task(
                stream_decode(self.workers, decode, rec, wire_id, on_tokens, registered)
            )
            prefill_task: asyncio.Task[None] | None = None
            try:
                # The prefill may send only once the decode's KV receiver expects the wire id:
                # frames for ids a receiver was not told about are refused.
                flag = asyncio.ensure_future(registered.wait())
                try:
                    await asyncio.wait(
                        {flag, decode_task},
                        timeout=REGISTER_TIMEOUT_S,
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                finally:
                    flag.cancel()
                if not registered.is_set():
                    if decode_task.done():
                        await decode_task  # raises its AttemptError
                        raise AttemptError(f"decode on {decode.id}: ended before registering")
                    raise AttemptError.of(Failure.not_registered(decode.id))
                prefill_task = asyncio.create_task(
                    run_prefill(
                        self.workers,
                        self.engine,
                        self.instances,
                        prefill,
                        rec,
                        wire_id,
                        plan.prefill_tokens,
                        kv,
                        plan.kv_tokens,
                    )
                )
                # A decode instance that fails while the prefill runs fails the attempt at once
                # (and goes out of rotation) instead of waiting for the KV send to give up.
                await asyncio.wait({prefill_task, decode_task}, return_when=asyncio.FIRST_COMPLETED)
                if decode_task.done() and not prefill_task.done() and decode_task.exception():
                    await decode_task
                await prefill_task
            except BaseException:
                if prefill_task is not None:
                    prefill_task.cancel()
                    with contextlib.suppress(BaseException):
                        await prefill_task
                await self.workers.cancel_decode(decode, wire_id)
                decode_task.cancel()
                with contextlib.suppress(BaseException):
                    await decode_task
                raise
            finally:
                load.release_prefill()
            core.prefill_answered(self.cache, prefill.cluster, keys, rec, plan)
            await decode_task
        finally:
            load.release_decode()

    async def _cache_plan(
        self, req: RequestDispatch, route: Route, look: CacheLookup, decode: InstanceInfo
    ) -> CachePlan:
        """The cache plan (dispatch.core.cache_plan); pulls the prefix first when the route
        asks for it and a PrfaaS instance can send it (services.cache_pull)."""
        rec = req.rec
        plan, source = core.cache_plan(
            rec,
            route,
            look,
            cache_on=self.cache is not None and self.engine.prefix_cache,
            avoiding=req.avoiding,
            snapshot=self.snapshot,
            has_link=self.has_link,
        )
        if source is None:
            return plan
        assert self.cache is not None
        result = await self.workers.pull_prefix(
            source=self.instances[source],
            target=decode,
            tokens=plan.pull_tokens,
            model=self.spec.model,
            byte_scale=self.spec.byte_scale,
            clock=self.clock,
            timeout_s=self.spec.request_timeout_s,
            label=rec.id,
            kv_targets=deployment_targets(self.instances.values()),
        )
        rec.pull_wire_bytes += result.wire_bytes
        rec.pull_s, rec.pull_status = result.seconds, result.status
        keys = self.hash_ids.get(rec.id, ())
        return core.pull_done(rec, route, look, plan, self.cache, keys, result.ok)

    def _routed_length(self, view: RequestView) -> int:
        """What the scheduler's planner is fed for this request (dispatch.core.routed_length)."""
        return core.routed_length(view, self.policy.cache_aware, self.scheduler.scarce)

    async def _route(self, req: RequestDispatch) -> tuple[Decision, CacheLookup]:
        """The policy's route, and the cache lookup it was made on; when no instance can take
        the request (all down or excluded), ask again every poll until `no_route_wait_s` is
        over (restarted workers rejoin through /health; dispatch.core.RequestDispatch)."""
        rec = req.rec
        wait, poll = self.no_route_wait_s, self.health_interval_s / 2
        keys = self.hash_ids.get(rec.id, ())
        for _ in range(int(wait / poll) + 2):
            look = self.cache.lookup(keys, rec.input_tokens) if self.cache else CacheLookup()
            view = core.request_view(rec, look, self.model)
            if self.control is not None and req.observe_once():
                self.control.observe(rec.arrival, self._routed_length(view))
            try:
                decision = await self.decider.adecide(view, self.snapshot(req.avoiding))
            except (LookupError, ValueError) as exc:
                final = req.no_route(exc, time.monotonic(), wait)
                if final is not None:
                    raise RequestError(final) from None
                await asyncio.sleep(poll)
                req.forgive(self.healthy)
                continue
            req.routed()
            return decision, look
        raise RequestError("no route: no instance came back in time")
