"""`GET /metrics` on every service: Prometheus text exposition (metrics.prometheus).

The router's series are observed as requests run; a worker's are read at scrape time from the
same counters its `/stats` answers with (`worker_samples`), so the two never disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from testbed.metrics.prometheus import Sample, SampleCollector

__all__ = ["add_metrics_route", "worker_registry", "worker_samples"]


def add_metrics_route(app: web.Application, registry: CollectorRegistry) -> None:
    async def _metrics(_request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    app.router.add_get("/metrics", _metrics)


def worker_registry(read: Callable[[], Iterable[Sample]]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(SampleCollector(read))
    return registry


def worker_samples(
    doc: dict[str, Any], *, model: str, byte_scale: float, tokens: int
) -> list[Sample]:
    """A prefill or decode worker's /stats document as Prometheus samples.

    `tokens` is the worker's token counter: prompt tokens prefilled (prefill) or tokens
    streamed (decode)."""
    m = {"model_name": model, "engine": "0"}  # one engine: vllm-router counts the labels
    ident = {"instance_id": str(doc.get("id", "")), "cluster": str(doc.get("cluster", "local"))}
    out = [
        Sample("testbed_requests_completed_total", "counter", "Requests this worker finished.",
               float(doc.get("completed", 0)), ident),
        Sample("testbed_requests_failed_total", "counter", "Requests this worker failed.",
               float(doc.get("failed", 0)), ident),
    ]  # fmt: skip
    if doc.get("role") == "prefill":
        return [
            *out,
            Sample("vllm:num_requests_running", "gauge", "Prefills computing now.",
                   1.0 if doc.get("running") else 0.0, m),
            Sample("vllm:num_requests_waiting", "gauge", "Prefills queued.",
                   float(doc.get("queued", 0)), m),
            Sample("vllm:prompt_tokens_total", "counter", "Prompt tokens prefilled.",
                   float(tokens), m),
            Sample("testbed_prefill_queued_tokens", "gauge", "Tokens queued for prefill.",
                   float(doc.get("queued_tokens", 0)), ident),
            Sample("testbed_kv_transfers_in_flight", "gauge", "KV transfers still sending.",
                   float(doc.get("transfers_in_flight", 0)), ident),
            Sample("testbed_kv_transfer_bytes_total", "counter",
                   "KV bytes sent (real-world bytes).",
                   float(doc.get("bytes_sent", 0)) * byte_scale, {**ident, "direction": "sent"}),
        ]  # fmt: skip
    return [
        *out,
        Sample("vllm:num_requests_running", "gauge", "Requests in the decode batch.",
               float(doc.get("active", 0)), m),
        Sample("vllm:num_requests_waiting", "gauge",
               "Requests waiting for their KV or for a batch slot.",
               float(doc.get("waiting_batch", 0)) + float(doc.get("waiting_kv", 0)), m),
        Sample("vllm:generation_tokens_total", "counter", "Tokens generated and streamed.",
               float(tokens), m),
        Sample("testbed_kv_transfer_bytes_total", "counter",
               "KV bytes received (real-world bytes).",
               float(doc.get("kv_wire_bytes_received", 0)) * byte_scale,
               {**ident, "direction": "received"}),
        Sample("testbed_kv_checksum_failures_total", "counter", "KV frames failing checksum.",
               float(doc.get("kv_checksum_failures", 0)), ident),
    ]  # fmt: skip
