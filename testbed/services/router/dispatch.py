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
from collections.abc import Iterable, Sequence

import aiohttp

from testbed.clock import LiveClock, Scale
from testbed.kvcache.manager import CacheLookup, CachePlan, KVCacheManager, plan_request
from testbed.metrics.prometheus import RouterMetrics
from testbed.metrics.records import RequestRecord, TokenTimer
from testbed.policy.base import CostModel, LinkView, RequestView, Route, Snapshot
from testbed.policy.book import BookEntry, LoadBook
from testbed.policy.decider import Decider, Decision
from testbed.profiles import MODELS, ModelProfile
from testbed.scheduler.cluster import Role, SenderCounters
from testbed.scheduler.loops import ControlLoops
from testbed.scheduler.state import SchedulerState
from testbed.services.dispatch_rules import (
    HEALTH_INTERVAL_S,
    MAX_ATTEMPTS,
    NO_ROUTE_WAIT_S,
    REGISTER_TIMEOUT_S,
)
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


def _costs(model: ModelProfile, instances: Iterable[InstanceInfo]) -> CostModel | None:
    """The model's cost curves on the hardware each cluster runs (the first instance's: a
    cluster is one hardware profile); None if a profile lacks a curve for it."""
    hardware: dict[str, str] = {}
    for i in instances:
        if i.hardware is not None:
            hardware.setdefault(i.cluster, i.hardware)
    if not hardware or any(h not in model.prefill for h in hardware.values()):
        return None
    return CostModel.of(model, hardware)


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
            _costs(self.model, self.instances.values()),
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
        self.hash_ids: dict[str, tuple[int, ...]] = {}
        """Block hash ids of the requests in flight (by request id), for the cache lookups."""
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
        sched = self.scheduler
        link = (
            LinkView(
                sched.bandwidth_estimate,
                sched.link_in_flight,
                sched.link_delivered,
                self.rtt_s,
                sched.scarce,
            )
            if self.has_link
            else None
        )
        return self.book.snapshot(self.clock.now(), sched.threshold, sched.scarce, link, exclude)

    def mark_down(self, instance: str) -> None:
        self.book.set_healthy(instance, False)

    def _charge(
        self, prefill: str | None, tokens: float, decode: str | None, out: float, sign: int
    ) -> None:
        self.book.charge(prefill, tokens, decode, out, sign)

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
            self.hash_ids[rid] = hash_ids
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
            rec.status = "completed"
        except RequestError as exc:
            rec.status, rec.failure_reason = "failed", str(exc)
        except ClientGone:  # seen when a token could not be written to it
            rec.status, rec.failure_reason = "failed", CLIENT_GONE
        except asyncio.CancelledError:  # the handler is cancelled when its client disconnects
            rec.status, rec.failure_reason = "failed", SHUT_DOWN if self.closing else CLIENT_GONE
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
        """Dispatch with retries: a failed attempt is re-routed, avoiding what failed.

        A broken cross-datacenter transfer sends the next attempt to local PD-P; a dead
        instance is taken out of rotation until it answers /health again; tokens already
        streamed by a decode instance that died are not streamed twice.
        """
        exclude: set[str] = set()
        reasons: list[str] = []
        for attempt in range(MAX_ATTEMPTS):
            try:
                await self._attempt(rec, attempt, frozenset(exclude), on_tokens)
                return
            except RequestError as exc:  # keep the reasons of the attempts that led here
                raise RequestError("; then ".join([*reasons, str(exc)])) from None
            except AttemptError as exc:
                reasons.append(exc.reason)
                rec.retries = attempt + 1
                if exc.dead is not None:
                    self.mark_down(exc.dead)
                    exclude.add(exc.dead)
                if exc.link_failed:
                    exclude.add("prfaas")
                if exc.suspect is not None:
                    exclude.add(exc.suspect)
        raise RequestError("; then ".join(reasons))

    async def _attempt(
        self, rec: RequestRecord, attempt: int, exclude: frozenset[str], on_tokens: TokenSink
    ) -> None:
        hash_ids = self.hash_ids.get(rec.id, ())
        look = self.cache.lookup(hash_ids, rec.input_tokens) if self.cache else CacheLookup()
        view = RequestView(
            rec.id, rec.input_tokens, rec.output_tokens, look.local, look.prfaas,
            self.model.kv_bytes(rec.input_tokens),
        )  # fmt: skip
        if self.control is not None and attempt == 0:
            self.control.observe(rec.arrival, self._routed_length(view))
        decision = await self._route(view, exclude)
        route = decision.route
        decision.write(rec)
        prefill = self.instances[route.prefill_instance]
        decode = self.instances[route.decode_instance]
        rec.route = route.prefill_cluster
        rec.prefill_instance, rec.decode_instance = prefill.id, decode.id
        plan = await self._cache_plan(rec, route, look, decode, exclude)
        rec.cached_tokens = plan.reused_tokens
        rec.threshold_tokens = route.threshold_tokens
        rec.cross_dc = prefill.cluster != decode.cluster
        rec.kv_wire_bytes_expected = self.engine.kv_wire_bytes(rec.input_tokens, plan.kv_tokens)
        rec.kv_wire_bytes_sent = rec.kv_wire_bytes_received = 0
        if rec.tokens_out == 0:  # tokens already streamed came from an earlier attempt's KV
            rec.kv_verified = False
        kv = kv_address(prefill.cluster, decode)
        if kv is None:
            raise RequestError(f"decode instance {decode.id} has no KV address")
        # Each attempt travels under its own unguessable wire id (transfer/capability.py), the
        # capability only this decode and this prefill are handed; records keep rec.id.
        wire_id = new_wire_id()
        self._charge(prefill.id, plan.prefill_tokens, decode.id, rec.output_tokens, +1)
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
                    raise AttemptError(
                        f"decode on {decode.id}: did not register the request within "
                        f"{REGISTER_TIMEOUT_S:g}s",
                        dead=decode.id,
                    )
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
                self._charge(prefill.id, plan.prefill_tokens, None, 0, -1)
            if self.cache is not None:  # the prompt's prefix now sits in the prefill's cluster
                self.cache.insert(prefill.cluster, hash_ids, rec.input_tokens)
                self.cache.record_prefill(prefill.cluster, plan)
            await decode_task
        finally:
            self._charge(None, 0, decode.id, rec.output_tokens, -1)

    def _routed_length(self, view: RequestView) -> int:
        """The length the policy compares with t: the whole prompt for cache-blind policies,
        the part no usable cache holds for the cache-aware rule. The scheduler's planner is fed
        these, so the t it plans fits the lengths the routing really sees."""
        if not self.policy.cache_aware:
            return view.input_tokens
        scarce = self.scheduler.scarce
        cached = view.cached_local if scarce else max(view.cached_local, view.cached_prfaas)
        return max(1, view.input_tokens - cached)

    async def _cache_plan(
        self,
        rec: RequestRecord,
        route: Route,
        look: CacheLookup,
        decode: InstanceInfo,
        exclude: frozenset[str],
    ) -> CachePlan:
        """What the prefill computes and what KV goes to decode (kvcache.manager's byte
        model); pulls the prefix first when the route asks for it (services.cache_pull).

        Without a manager (or with an engine whose KV is always the whole prompt) the route's
        own uncached length is both, as before the prefix cache existed."""
        if self.cache is None or not self.engine.prefix_cache:
            n = route.uncached_tokens
            return CachePlan(n, rec.input_tokens - n, n)
        rec.cached_local, rec.cached_prfaas = look.local, look.prfaas
        cluster = route.prefill_cluster
        plan = plan_request(rec.input_tokens, look, cluster, route.pull_prefix_tokens)
        if not plan.pull_tokens:
            return plan
        rec.pull_tokens = plan.pull_tokens
        source = None
        if plan.pull_from == "prfaas" and "prfaas" not in exclude:
            senders = [
                i for i in self.snapshot(exclude).instances
                if i.cluster == "prfaas" and i.role == "prefill" and i.state == "ok"
            ]  # fmt: skip
            if senders:
                source = self.instances[min(senders, key=lambda i: (i.outstanding, i.id)).id]
        if source is None:
            rec.pull_status = (
                "skipped: no KV path from the local cluster to PrfaaS"
                if plan.pull_from == "local"
                else "skipped: no PrfaaS instance or link to pull from"
            )
            return plan_request(rec.input_tokens, look, cluster, 0)
        result = await self.workers.pull_prefix(
            source=source,
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
        if not result.ok:  # compute the prefix instead
            return plan_request(rec.input_tokens, look, cluster, 0)
        self.cache.insert(cluster, self.hash_ids.get(rec.id, ()), plan.reused_tokens)
        return plan

    async def _route(self, view: RequestView, exclude: frozenset[str]) -> Decision:
        """The policy's route; when no instance can take the request (all down or excluded),
        wait up to `no_route_wait_s` for one to come back (restarted workers rejoin through
        /health), no longer avoiding instances that are healthy again."""
        wait, poll = self.no_route_wait_s, self.health_interval_s / 2
        deadline = time.monotonic() + wait
        for _ in range(int(wait / poll) + 2):
            try:
                return await self.decider.adecide(view, self.snapshot(exclude))
            except (LookupError, ValueError) as exc:
                if time.monotonic() >= deadline:
                    raise RequestError(f"no route: {exc}") from None
            await asyncio.sleep(poll)
            exclude = frozenset(
                x for x in exclude if x in ("prfaas", "local") or not self.healthy.get(x, True)
            )
        raise RequestError("no route: no instance came back in time")
