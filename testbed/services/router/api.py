"""The router's HTTP API: the aiohttp app over the dispatcher (services.router.dispatch).

`POST /generate` (NDJSON stream: `{"tokens": n}` lines, then `{"record": {...}}`),
`POST /v1/completions`, `POST /v1/chat/completions`, `GET /v1/models` (OpenAI-compatible:
services.router.openai), `GET /history` (the records, a page at a time: `?after=SEQ&limit=N`,
at most HISTORY_PAGE), `GET /records` (records as they end: services.router.recorded),
`GET /stats` (load, policy inputs, scheduler state, the keeper's state), `GET /events` (the
scheduler's event stream: services.router.follow), `GET /metrics` (Prometheus:
metrics.prometheus), `GET /health`. /stats's `decisions` gives the
fallback's name and the event loop's lag (services.router.lag), for the run's summary.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import aiohttp
from aiohttp import web

from testbed.metrics.prometheus import Sample, SampleCollector
from testbed.services.exposition import add_metrics_route
from testbed.services.router.dispatch import RouterState
from testbed.services.router.follow import FOLLOWERS, Follower, events
from testbed.services.router.intake import (
    STATE,
    claim,
    hash_ids_field,
    positive_int,
    read_body,
    token_sink,
)
from testbed.services.router.lag import LoopLag
from testbed.services.router.openai import (
    MAX_INPUT_TOKENS,
    MAX_OUTPUT_TOKENS,
    chat_completions,
    completions,
    models,
)
from testbed.services.router.recorded import (
    HISTORY_PAGE,
    RecordsGone,
    add_record_routes,
    after_param,
    gone,
)
from testbed.services.router.workers import Workers
from testbed.services.spec import ServiceSpec
from testbed.services.validate import health, json_errors

__all__ = ["create_app"]

TASKS = web.AppKey("tasks", list[asyncio.Task[None]])
LAG = web.AppKey("lag", LoopLag)


async def _generate(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    body = await read_body(request)
    input_tokens = positive_int(body, "input_tokens", MAX_INPUT_TOKENS)
    output_tokens = positive_int(body, "output_tokens", MAX_OUTPUT_TOKENS)
    hash_ids = hash_ids_field(body, input_tokens)
    rid = claim(state, body)  # last: a request refused for bad fields does not use up its id
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await resp.prepare(request)
    on_tokens = token_sink(resp, lambda n: b'{"tokens":%d}\n' % n)
    rec = await state.handle(rid, input_tokens, output_tokens, on_tokens, hash_ids)
    with contextlib.suppress(ConnectionError, aiohttp.ClientConnectionResetError):
        await resp.write((json.dumps({"record": rec.to_json()}) + "\n").encode())
    return resp


async def _history(request: web.Request) -> web.Response:
    """A JSON list of records `after`+1 .. `after`+`limit` in the order they ended (`seq`
    order); a page shorter than `limit` is the last. 410 for records already dropped (kept on
    disk by `testbed up`'s keeper: services.router.recorded)."""
    after = after_param(request)
    raw = request.query.get("limit", str(HISTORY_PAGE))
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 6 and 1 <= int(raw) <= HISTORY_PAGE):
        raise web.HTTPBadRequest(text=f"limit must be an integer from 1 to {HISTORY_PAGE}")
    try:
        page = request.app[STATE].record_log.page(after, int(raw))
    except RecordsGone as exc:
        raise gone(exc) from None
    return web.json_response([r.to_json() for r in page])


async def _stats(request: web.Request) -> web.Response:
    state = request.app[STATE]
    snap = state.snapshot()
    sched = state.scheduler
    return web.json_response(
        {
            "now": snap.now,
            "in_flight": state.in_flight,
            "recorded": state.record_log.made,
            "keeper": state.record_log.stats(),  # services.router.recorded
            "threshold_tokens": snap.threshold_tokens,
            "bandwidth_scarce": snap.bandwidth_scarce,
            "n_prefill_local": sum(
                1 for i in state.instances.values() if i.cluster == "local" and i.role == "prefill"
            ),
            "draining": sorted(sched.draining),
            "bandwidth_estimate_gbps": sched.bandwidth_estimate_gbps,
            "events_seq": sched.seq,
            "prefix_cache": None if state.cache is None else state.cache.stats(),
            "decisions": {  # the runner puts this in the history at the end (summary.decisions)
                "fallback": state.decider.fallback_name,
                "loop_lag_ms": request.app[LAG].to_json(),
            },
            "instances": [
                {
                    "id": i.id,
                    "cluster": i.cluster,
                    "role": i.role,
                    "outstanding": i.outstanding,
                    "outstanding_work": i.outstanding_work,
                    "queue_wait_s": i.queue_wait_s,
                    "state": i.state,
                }
                for i in snap.instances
            ],
        }
    )


def _samples(state: RouterState) -> list[Sample]:
    """The router's scrape-time series: the scheduler's inputs to the policy."""
    sched = state.scheduler
    out = [
        Sample("testbed_requests_in_flight", "gauge", "Requests the router is serving.",
               float(state.in_flight)),
        Sample("testbed_bandwidth_scarce", "gauge",
               "1 when the scheduler judges the link's bandwidth scarce.",
               1.0 if sched.scarce else 0.0),
        Sample("testbed_instances_draining", "gauge", "Instances being drained.",
               float(len(sched.draining))),
        Sample("testbed_scheduler_events_total", "counter", "Scheduler events so far.",
               float(sched.seq)),
    ]  # fmt: skip
    if sched.threshold is not None:
        out.append(
            Sample("testbed_threshold_tokens", "gauge",
                   "Routing threshold t: longer uncached prompts go to PrfaaS.",
                   float(sched.threshold))
        )  # fmt: skip
    if sched.bandwidth_estimate_gbps is not None:
        out.append(
            Sample("testbed_link_bandwidth_estimate_gbps", "gauge",
                   "The scheduler's estimate of the link's bandwidth (real-world Gbit/s).",
                   float(sched.bandwidth_estimate_gbps))
        )  # fmt: skip
    return out


async def create_app(
    spec: ServiceSpec, workers: Workers | None = None
) -> tuple[web.Application, dict[str, int]]:
    """The router's app; `workers` replaces its HTTP calls to the instances (tests)."""
    state = RouterState(spec, workers)
    app = web.Application(client_max_size=1 << 20, middlewares=[json_errors])
    app[STATE] = state
    app[FOLLOWERS] = set[Follower]()
    app[LAG] = LoopLag()
    app.router.add_post("/generate", _generate)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    state.metrics.registry.register(SampleCollector(lambda: _samples(state)))
    add_metrics_route(app, state.metrics.registry)
    app.router.add_get("/history", _history)
    app.router.add_get("/stats", _stats)
    app.router.add_get("/events", events)
    add_record_routes(app, state.record_log)  # GET /records, POST /records/kept
    app.router.add_get("/health", health)

    async def _startup(_app: web.Application) -> None:
        await state.open()
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(state.watch_health()), loop.create_task(app[LAG].run())]
        if state.control is not None:
            tasks.append(loop.create_task(state.control.run_short_term()))
            if state.control.long is not None:
                tasks.append(loop.create_task(state.control.run_long_term()))
        app[TASKS] = tasks

    async def _closing(_app: web.Application) -> None:
        state.closing = True  # handlers cancelled from here on: "router shut down"
        for follower in app[FOLLOWERS]:  # event streams end instead of holding the shutdown
            follower.end()

    async def _shutdown(_app: web.Application) -> None:
        for task in app.get(TASKS, []):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await state.aclose()

    app.on_startup.append(_startup)
    app.on_shutdown.append(_closing)
    app.on_cleanup.append(_shutdown)
    return app, {}
