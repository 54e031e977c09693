"""The router: the frontend that asks the policy for a route, dispatches prefill and decode,
streams tokens back and records every request's lifecycle.

For each request it opens the decode stream first (the decode instance starts waiting for KV)
and then asks the chosen prefill instance to prefill and send KV to that decode instance, through
the link proxy when the two sit in different datacenters. It keeps its own count of outstanding
work per instance, which is the load signal the policy sees.

APIs: `POST /generate` (NDJSON stream: `{"tokens": n}` lines, then `{"record": {...}}`),
`POST /v1/completions` (OpenAI-compatible, with `stream: true` as server-sent events),
`GET /history`, `GET /stats`, `GET /health`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from testbed.clock import LiveClock, Scale
from testbed.engine.emulated import wire_layer_bytes
from testbed.engine.torch import live
from testbed.kvcache import BLOCK_TOKENS
from testbed.kvcache.manager import CacheLookup, CachePlan, KVCacheManager, plan_request
from testbed.metrics.records import RequestRecord
from testbed.policy import make_policy
from testbed.policy.base import InstanceLoad, RequestView, Route, Snapshot
from testbed.profiles import MODELS
from testbed.services import cache_pull
from testbed.services.control import ControlLoops, role_view
from testbed.services.kv_expect import REGISTER_TIMEOUT_S
from testbed.services.kv_targets import NO_TARGETS_STATUS, deployment_targets, post_targets
from testbed.services.spec import InstanceInfo, ServiceSpec
from testbed.services.validate import health, json_errors, parse_json_object
from testbed.transfer.capability import new_wire_id

__all__ = ["create_app"]

HEALTH = web.AppKey("health", asyncio.Task)
SCHEDULER = web.AppKey("scheduler", asyncio.Task)
LONG_TERM = web.AppKey("long_term", asyncio.Task)
MAX_INPUT_TOKENS = 10_000_000
MAX_OUTPUT_TOKENS = 1_000_000
MAX_ATTEMPTS = 3
"""Dispatch attempts per request before it fails with every attempt's reason."""
HEALTH_INTERVAL_S = 0.5
NO_ROUTE_WAIT_S = 10.0
"""Wall seconds a request waits for an instance to come back when none can take it."""

TokenSink = Callable[[int], Awaitable[None]]


class RequestError(Exception):
    """A request failed for good; the message is the failure reason recorded for it."""


class ClientGone(Exception):
    """The client that sent the request went away: its request stops and no instance is blamed.

    Deliberately not an aiohttp.ClientError: a failed write to the departed client must not
    look like a lost decode stream (which takes the decode instance out of rotation)."""


CLIENT_GONE = "client disconnected"
SHUT_DOWN = "router shut down"


class AttemptError(Exception):
    """One dispatch attempt failed; the router may retry elsewhere."""

    def __init__(
        self,
        reason: str,
        *,
        dead: str | None = None,
        link_failed: bool = False,
        suspect: str | None = None,
    ):
        super().__init__(reason)
        self.reason = reason
        self.dead = dead
        """An instance that did not answer: out of rotation until /health answers."""
        self.link_failed = link_failed
        self.suspect = suspect
        """An instance this request should avoid on its next attempt (not marked down)."""
        """The KV could not cross the link: retry with local prefill."""


class RouterState:
    def __init__(self, spec: ServiceSpec) -> None:
        self.spec = spec
        self.clock = LiveClock.of(spec)
        self.scale = Scale.of(spec)
        self.model = MODELS[spec.model]
        self.tiny = (
            live.tiny_config(spec.model_seed, spec.model_dtype) if spec.engine == "torch" else None
        )
        """engine: torch: the real model's layout (prompts and KV sizes); torch-free."""
        self.policy = make_policy(spec.policy)
        self.instances = {i.id: role_view(i, i.role) if i.switchable else i for i in spec.instances}
        """The router's view of every instance; a switchable PD instance's entry follows its
        role (control.role_view)."""
        self.draining: set[str] = set()
        """Instances the long-term loop is emptying before a role switch: no new work."""
        self.events: list[dict[str, Any]] = []
        """Scheduler decisions and their signals (GET /scheduler, copied into the history)."""
        self.control = ControlLoops(self) if spec.scheduler is not None else None
        self.outstanding = dict.fromkeys(self.instances, 0)
        self.healthy = dict.fromkeys(self.instances, True)
        self.threshold = spec.threshold_tokens
        self.scarce = False
        self.bandwidth_estimate: float | None = None
        """Real bytes/s of cross-datacenter bandwidth the short-term loop believes in."""
        self.work = dict.fromkeys(self.instances, 0.0)
        self.records: list[RequestRecord] = []
        self.in_flight = 0
        self._ids = itertools.count(1)
        self.ids: set[str] = set()
        """Every request id this router has taken, in flight or finished: ids are unique per
        run (records, KV wire ids and checkers key on them)."""
        self.closing = False
        self.session: aiohttp.ClientSession | None = None
        self.cache = (
            KVCacheManager.for_model(self.model, spec.prefix_cache_bytes)
            if spec.prefix_cache_bytes is not None
            else None
        )
        """The global KVCache manager: which cluster holds which prefix (kvcache.manager)."""
        self.hash_ids: dict[str, tuple[int, ...]] = {}
        """Block hash ids of the requests in flight (by request id), for the cache lookups."""

    def next_id(self) -> str:
        """A fresh id, skipping any a client already chose."""
        while (rid := f"q{next(self._ids):06d}") in self.ids:
            pass
        return rid

    def claim_id(self, rid: str) -> bool:
        """Take a request id; False if this router has already seen it."""
        if rid in self.ids:
            return False
        self.ids.add(rid)
        return True

    def snapshot(self, exclude: frozenset[str] = frozenset()) -> Snapshot:
        """Load of every healthy instance not in `exclude` (instance ids or cluster names)."""
        return Snapshot(
            now=self.clock.now(),
            instances=tuple(
                InstanceLoad(i.id, i.cluster, i.role, self.outstanding[i.id], self.work[i.id])
                for i in self.instances.values()
                if self.healthy[i.id]
                and i.id not in exclude
                and i.cluster not in exclude
                and i.id not in self.draining
            ),
            threshold_tokens=self.threshold,
            bandwidth_scarce=self.scarce,
        )

    def mark_down(self, instance: str) -> None:
        self.healthy[instance] = False

    async def watch_health(self) -> None:
        """Bring instances that failed back into rotation once they answer /health again."""
        assert self.session is not None
        while True:
            await asyncio.sleep(HEALTH_INTERVAL_S)
            for iid, ok in list(self.healthy.items()):
                if ok:
                    continue
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with asyncio.timeout(1.0):
                        url = f"{self.instances[iid].url}/health"
                        async with self.session.get(url) as resp:
                            if resp.status == 200:
                                self.healthy[iid] = True

    async def fetch_stats(self, inst: InstanceInfo) -> dict[str, Any] | None:
        assert self.session is not None
        try:
            async with asyncio.timeout(1.0):
                async with self.session.get(f"{inst.url}/stats") as resp:
                    doc: dict[str, Any] = await resp.json()
                    return doc
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    async def handle(
        self,
        rid: str,
        input_tokens: int,
        output_tokens: int,
        on_tokens: TokenSink,
        hash_ids: tuple[int, ...] = (),
    ) -> RequestRecord:
        rec = RequestRecord(
            id=rid,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            arrival=self.clock.now(),
        )
        if hash_ids:
            self.hash_ids[rid] = hash_ids
        self.in_flight += 1
        try:
            await self._run(rec, on_tokens)
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
            self.records.append(rec)
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
        view = RequestView(rec.id, rec.input_tokens, rec.output_tokens, look.local, look.prfaas)
        if self.control is not None and attempt == 0:
            self.control.observe(rec.arrival, self._routed_length(view))
        route = await self._route(view, exclude)
        prefill = self.instances[route.prefill_instance]
        decode = self.instances[route.decode_instance]
        rec.route = route.prefill_cluster
        rec.prefill_instance, rec.decode_instance = prefill.id, decode.id
        plan = await self._cache_plan(rec, attempt, route, look, decode, exclude)
        rec.cached_tokens = plan.reused_tokens
        rec.threshold_tokens = route.threshold_tokens
        rec.cross_dc = prefill.cluster != decode.cluster
        rec.kv_wire_bytes_expected = (
            sum(self.tiny.layer_sizes(0, rec.input_tokens))  # real tensors, the whole prompt
            if self.tiny is not None
            else sum(wire_layer_bytes(self.model, plan.kv_tokens, self.spec.byte_scale))
        )
        rec.kv_wire_bytes_sent = rec.kv_wire_bytes_received = 0
        if rec.tokens_out == 0:  # tokens already streamed came from an earlier attempt's KV
            rec.kv_verified = False
        if rec.cross_dc:
            kv = (decode.kv_link_host, decode.kv_link_port)
        else:
            kv = (decode.kv_host, decode.kv_port)
        if kv[0] is None or kv[1] is None:
            raise RequestError(f"decode instance {decode.id} has no KV address")
        # Each attempt travels under its own unguessable wire id (transfer/capability.py), the
        # capability only this decode and this prefill are handed; records keep rec.id.
        wire_id = new_wire_id()
        self._charge(prefill.id, plan.prefill_tokens, decode.id, rec.output_tokens, +1)
        try:
            registered = asyncio.Event()
            decode_task = asyncio.create_task(
                self._decode(decode, rec, wire_id, on_tokens, registered)
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
                    self._prefill(prefill, rec, wire_id, plan.prefill_tokens, kv, plan.kv_tokens)
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
                await self._cancel_decode(decode, wire_id)
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
        cached = view.cached_local if self.scarce else max(view.cached_local, view.cached_prfaas)
        return max(1, view.input_tokens - cached)

    async def _cache_plan(
        self,
        rec: RequestRecord,
        attempt: int,
        route: Route,
        look: CacheLookup,
        decode: InstanceInfo,
        exclude: frozenset[str],
    ) -> CachePlan:
        """What the prefill computes and what KV goes to decode (kvcache.manager's byte
        model); pulls the prefix first when the route asks for it (services.cache_pull).

        Without a manager (or with the torch engine, whose KV is always the whole prompt) the
        route's own uncached length is both, as before the prefix cache existed."""
        if self.cache is None or self.tiny is not None:
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
                if i.cluster == "prfaas" and i.role == "prefill"
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
        assert self.session is not None
        result = await cache_pull.pull_prefix(
            self.session,
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

    async def _route(self, view: RequestView, exclude: frozenset[str]) -> Route:
        """The policy's route; when no instance can take the request (all down or excluded),
        wait up to NO_ROUTE_WAIT_S for one to come back (restarted workers rejoin through
        /health), no longer avoiding instances that are healthy again."""
        deadline = time.monotonic() + NO_ROUTE_WAIT_S
        for _ in range(int(NO_ROUTE_WAIT_S / (HEALTH_INTERVAL_S / 2)) + 2):
            try:
                return self.policy.decide(view, self.snapshot(exclude))
            except (LookupError, ValueError) as exc:
                if time.monotonic() >= deadline:
                    raise RequestError(f"no route: {exc}") from None
            await asyncio.sleep(HEALTH_INTERVAL_S / 2)
            exclude = frozenset(
                x for x in exclude if x in ("prfaas", "local") or not self.healthy.get(x, True)
            )
        raise RequestError("no route: no instance came back in time")

    def _charge(
        self, prefill: str | None, tokens: float, decode: str | None, out: float, sign: int
    ) -> None:
        if prefill is not None:
            self.outstanding[prefill] += sign
            self.work[prefill] += sign * tokens
        if decode is not None:
            self.outstanding[decode] += sign
            self.work[decode] += sign * out

    async def _prefill(
        self,
        inst: InstanceInfo,
        rec: RequestRecord,
        wire_id: str,
        tokens: int,
        kv: tuple[Any, Any],
        kv_tokens: int | None = None,
    ) -> None:
        assert self.session is not None
        body: dict[str, Any] = {
            "id": wire_id,
            "uncached_tokens": tokens,
            "kv_host": kv[0],
            "kv_port": kv[1],
        }
        if kv_tokens is not None and kv_tokens != tokens and self.tiny is None:
            body["kv_tokens"] = kv_tokens  # decode holds part of the prompt, or needs more
        if self.tiny is not None:  # real token ids, drawn from (seed, request id, length)
            ids = live.prompt_ids(
                self.spec.prompt_seed, rec.id, rec.input_tokens, self.tiny.vocab_size
            )
            rec.prompt_digest = live.ids_digest(ids)
            body["tokens"] = ids
        session = self.session

        async def post() -> tuple[int, dict[str, Any]]:
            async with session.post(f"{inst.url}/prefill", json=body) as resp:
                return resp.status, await resp.json(content_type=None)

        try:
            async with asyncio.timeout(self.spec.request_timeout_s):
                status, doc = await post()
                # A worker that does not know the deployment's KV receivers yet (a PD instance,
                # a restarted one): hand it the instance table's, then ask again.
                if status == NO_TARGETS_STATUS and await post_targets(
                    session, inst.url, deployment_targets(self.instances.values())
                ):
                    status, doc = await post()
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise AttemptError(
                f"prefill on {inst.id} unreachable ({type(exc).__name__})", dead=inst.id
            ) from None
        for key in ("prefill_start", "prefill_end", "transfer_start", "transfer_end"):
            if key in doc:
                setattr(rec, key, doc[key])
        rec.kv_wire_bytes_sent = int(doc.get("kv_wire_bytes_sent", 0))
        if status != 200 or "error" in doc:
            raise AttemptError(
                f"prefill on {inst.id}: {doc.get('error', status)}",
                link_failed=rec.cross_dc,
                suspect=None if rec.cross_dc else rec.decode_instance,
            )
        if self.tiny is not None:
            await self._first_token(rec, wire_id, doc.get("first_token_id"))

    async def _first_token(self, rec: RequestRecord, wire_id: str, token: Any) -> None:
        """engine: torch: hand the prefill's first token to the decode instance (the control
        path; the KV carries only states and latents)."""
        assert self.session is not None and rec.decode_instance is not None
        inst = self.instances[rec.decode_instance]
        try:
            async with asyncio.timeout(10):
                url = f"{inst.url}/decode/{wire_id}/first_token"
                async with self.session.post(url, json={"first_token_id": token}) as resp:
                    ok = resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            ok = False
        if not ok:
            raise AttemptError(f"decode on {inst.id}: first token not delivered", suspect=inst.id)

    async def _decode(
        self,
        inst: InstanceInfo,
        rec: RequestRecord,
        wire_id: str,
        on_tokens: TokenSink,
        registered: asyncio.Event,
    ) -> None:
        """Stream this attempt's tokens; those the client already has are not sent again.

        `registered` is set at the stream's first line: the decode's KV receiver now expects
        `wire_id` (services/kv_expect.py), so the prefill may start sending."""
        assert self.session is not None
        body = {
            "id": wire_id,
            "request": rec.id,
            "output_tokens": rec.output_tokens,
            "expected_wire_bytes": rec.kv_wire_bytes_expected,
        }
        already = rec.tokens_out
        generated = 0
        verified = False  # this attempt's KV was verified before its first token ("admitted")
        try:
            async with self.session.post(f"{inst.url}/decode", json=body) as resp:
                if resp.status != 200:
                    raise AttemptError(f"decode on {inst.id}: HTTP {resp.status}")
                async for line in resp.content:
                    if not line.strip():
                        continue
                    doc = json.loads(line)
                    if doc.get("expecting"):
                        registered.set()
                    elif doc.get("admitted"):
                        verified = bool(doc.get("kv_verified"))
                        rec.kv_verified = verified
                    elif "tokens" in doc and "done" not in doc:
                        if not verified:  # tokens from KV not known verified: taint the record
                            rec.kv_verified = False
                        generated += int(doc["tokens"])
                        if generated > rec.tokens_out:
                            new = generated - rec.tokens_out
                            rec.tokens_out = generated
                            await on_tokens(new)
                    elif doc.get("done"):
                        if rec.first_token is None or already == 0:
                            rec.first_token = doc["first_token"]
                        rec.last_token = doc["last_token"]
                        rec.kv_wire_bytes_received = int(doc["kv_wire_bytes"])
                        rec.kv_verified = bool(doc["kv_verified"]) and verified
                        if "token_ids" in doc:  # engine: torch: what the model generated
                            rec.output_ids = [int(t) for t in doc["token_ids"]]
                        if generated != doc["tokens"] or rec.tokens_out != rec.output_tokens:
                            raise RequestError(
                                f"decode on {inst.id}: streamed {generated} tokens of "
                                f"{doc['tokens']}"
                            )
                        return
                    elif "error" in doc:
                        raise AttemptError(f"decode on {inst.id}: {doc['error']}")
        except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
            raise AttemptError(
                f"decode on {inst.id} lost ({type(exc).__name__})", dead=inst.id
            ) from None
        raise AttemptError(f"decode on {inst.id}: stream ended without a result", dead=inst.id)

    async def _cancel_decode(self, inst: InstanceInfo, rid: str) -> None:
        assert self.session is not None
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with asyncio.timeout(5):
                await self.session.delete(f"{inst.url}/decode/{rid}")


STATE = web.AppKey("state", RouterState)


def _bad(message: str) -> web.HTTPException:
    return web.HTTPBadRequest(
        text=json.dumps({"error": {"message": message, "type": "invalid_request_error"}}),
        content_type="application/json",
    )


def _positive_int(body: dict[str, Any], key: str, limit: int, default: int | None = None) -> int:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(f"{key} must be an integer")
    if isinstance(value, float) and (not math.isfinite(value) or value != int(value)):
        raise _bad(f"{key} must be an integer")
    if not 1 <= value <= limit:  # compared exactly: a 400-digit int never meets a float
        raise _bad(f"{key} must be between 1 and {limit}")
    return int(value)


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        return parse_json_object(await request.read())
    except ValueError as exc:
        raise _bad(str(exc)) from None


def _claim(state: RouterState, body: dict[str, Any]) -> str:
    """The request's id: the client's own (unique, 1 to 60 bytes) or a fresh one."""
    rid = body.get("id")
    if rid is None:
        rid = state.next_id()
    elif not isinstance(rid, str) or not 1 <= len(rid.encode()) <= 60:
        raise _bad("id must be a string of 1 to 60 bytes")
    if not state.claim_id(rid):
        raise web.HTTPConflict(
            text=json.dumps(
                {
                    "error": {
                        "message": f"request id {rid!r} was already used in this run",
                        "type": "invalid_request_error",
                    }
                }
            ),
            content_type="application/json",
        )
    return rid


def _token_sink(resp: web.StreamResponse, encode: Callable[[int], bytes]) -> TokenSink:
    """Write tokens to the client; a client that went away raises ClientGone (see there)."""

    async def on_tokens(n: int) -> None:
        try:
            await resp.write(encode(n))
        except (ConnectionError, aiohttp.ClientConnectionResetError) as exc:
            raise ClientGone(str(exc)) from None

    return on_tokens


async def _generate(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    body = await _json_body(request)
    input_tokens = _positive_int(body, "input_tokens", MAX_INPUT_TOKENS)
    output_tokens = _positive_int(body, "output_tokens", MAX_OUTPUT_TOKENS)
    hash_ids = _hash_ids(body, input_tokens)
    rid = _claim(state, body)  # last: a request refused for bad fields does not use up its id
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await resp.prepare(request)
    on_tokens = _token_sink(resp, lambda n: b'{"tokens":%d}\n' % n)
    rec = await state.handle(rid, input_tokens, output_tokens, on_tokens, hash_ids)
    with contextlib.suppress(ConnectionError, aiohttp.ClientConnectionResetError):
        await resp.write((json.dumps({"record": rec.to_json()}) + "\n").encode())
    return resp


def _hash_ids(body: dict[str, Any], input_tokens: int) -> tuple[int, ...]:
    """The optional `hash_ids` of a Mooncake-style request: one id per 512-token block of the
    prompt (the last may be partial), so at most ceil(input_tokens / 512) signed 64-bit ints.
    Checked before the response starts, so a bad list is a 400, not a failed request."""
    value = body.get("hash_ids")
    if value is None:
        return ()
    limit = -(-input_tokens // BLOCK_TOKENS)
    if not isinstance(value, list) or len(value) > limit:
        raise _bad(f"hash_ids must be a list of at most ceil(input_tokens / 512) = {limit} ints")
    if not all(
        isinstance(h, int) and not isinstance(h, bool) and -(2**63) <= h < 2**63 for h in value
    ):
        raise _bad("hash_ids must hold only integers (signed 64-bit)")
    return tuple(value)


def _prompt_tokens(prompt: Any) -> int:
    """Rough token count of an OpenAI prompt (about 4 characters a token)."""
    if isinstance(prompt, list):
        if all(isinstance(p, int) for p in prompt):
            return max(1, len(prompt))
        prompt = "".join(str(p) for p in prompt)
    return max(1, math.ceil(len(str(prompt)) / 4))


def _token_text(start: int, n: int) -> str:
    return "".join(f" t{i}" for i in range(start, start + n))


async def _completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    body = await _json_body(request)
    if "prompt" not in body:
        raise _bad("prompt is required")
    if "input_tokens" in body:
        input_tokens = _positive_int(body, "input_tokens", MAX_INPUT_TOKENS)
    else:
        input_tokens = _prompt_tokens(body["prompt"])
        if input_tokens > MAX_INPUT_TOKENS:
            raise _bad(f"prompt too long (at most {MAX_INPUT_TOKENS} tokens)")
    output_tokens = _positive_int(body, "max_tokens", MAX_OUTPUT_TOKENS, default=16)
    rid = _claim(state, {})
    cid = f"cmpl-{rid}"
    created = int(time.time())
    model = str(body.get("model", state.spec.model))

    def chunk(text: str, finish: str | None) -> dict[str, Any]:
        return {
            "id": cid,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
        }

    if body.get("stream"):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        sent = 0

        def encode(n: int) -> bytes:
            nonlocal sent
            doc = chunk(_token_text(sent, n), None)
            sent += n
            return f"data: {json.dumps(doc)}\n\n".encode()

        rec = await state.handle(rid, input_tokens, output_tokens, _token_sink(resp, encode))
        if rec.status == "completed":
            tail = f"data: {json.dumps(chunk('', 'length'))}\n\n"
        else:
            err = {"error": {"message": rec.failure_reason, "type": "server_error"}}
            tail = f"data: {json.dumps(err)}\n\n"
        with contextlib.suppress(ConnectionError, aiohttp.ClientConnectionResetError):
            await resp.write(tail.encode() + b"data: [DONE]\n\n")
        return resp

    total = 0

    async def count(n: int) -> None:
        nonlocal total
        total += n

    rec = await state.handle(rid, input_tokens, output_tokens, count)
    if rec.status != "completed":
        return web.json_response(
            {"error": {"message": rec.failure_reason, "type": "server_error"}}, status=503
        )
    doc = chunk(_token_text(0, total), "length")
    doc["usage"] = {
        "prompt_tokens": input_tokens,
        "completion_tokens": total,
        "total_tokens": input_tokens + total,
    }
    return web.json_response(doc)


async def _history(request: web.Request) -> web.Response:
    return web.json_response([r.to_json() for r in request.app[STATE].records])


async def _stats(request: web.Request) -> web.Response:
    state = request.app[STATE]
    snap = state.snapshot()
    return web.json_response(
        {
            "now": snap.now,
            "in_flight": state.in_flight,
            "recorded": len(state.records),
            "threshold_tokens": snap.threshold_tokens,
            "bandwidth_scarce": snap.bandwidth_scarce,
            "n_prefill_local": sum(
                1 for i in state.instances.values() if i.cluster == "local" and i.role == "prefill"
            ),
            "draining": sorted(state.draining),
            "bandwidth_estimate_gbps": (
                None if state.bandwidth_estimate is None else state.bandwidth_estimate * 8 / 1e9
            ),
            "prefix_cache": None if state.cache is None else state.cache.stats(),
            "instances": [
                {
                    "id": i.id,
                    "cluster": i.cluster,
                    "role": i.role,
                    "outstanding": i.outstanding,
                    "outstanding_work": i.outstanding_work,
                }
                for i in snap.instances
            ],
        }
    )


async def _scheduler(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATE].events)


async def create_app(spec: ServiceSpec) -> tuple[web.Application, dict[str, int]]:
    state = RouterState(spec)
    app = web.Application(client_max_size=1 << 20, middlewares=[json_errors])
    app[STATE] = state
    app.router.add_post("/generate", _generate)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_get("/history", _history)
    app.router.add_get("/stats", _stats)
    app.router.add_get("/scheduler", _scheduler)
    app.router.add_get("/health", health)

    async def _startup(_app: web.Application) -> None:
        state.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=spec.request_timeout_s, sock_connect=5),
        )
        loop = asyncio.get_running_loop()
        app[HEALTH] = loop.create_task(state.watch_health())
        if state.control is not None:
            app[SCHEDULER] = loop.create_task(state.control.run_short_term())
            if state.control.long is not None:
                app[LONG_TERM] = loop.create_task(state.control.run_long_term())

    async def _closing(_app: web.Application) -> None:
        state.closing = True  # handlers cancelled from here on: "router shut down"

    async def _shutdown(_app: web.Application) -> None:
        for key in (HEALTH, SCHEDULER, LONG_TERM):
            task = app.get(key)
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if state.session is not None:
            await state.session.close()

    app.on_startup.append(_startup)
    app.on_shutdown.append(_closing)
    app.on_cleanup.append(_shutdown)
    return app, {}
