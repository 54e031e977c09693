"""Prometheus exposition of the router and the workers, with vLLM's metric names.

Every service has its own `CollectorRegistry` (no process-global metrics: tests and PD
instances run several apps in one process). Names follow vLLM's where one exists, so
dashboards and clients that know vLLM (AIPerf's server-metrics collection, Grafana boards)
read the testbed unchanged; what vLLM has no name for is `testbed_*`. Every time is in
real-world seconds and every byte count in real-world bytes (wire bytes x byte_scale), like the
records: a scrape at time_scale k reads what a deployment k times slower would show.

- `RouterMetrics`: latency histograms observed as requests run (TTFT, inter-token latency per
  streamed chunk, E2E), token and request counters, in-flight gauges (waiting =
  before the first token, running = streaming), plus gauges read at scrape time from the router
  (`read`): threshold, scarcity, link bandwidth estimate.
- `SampleCollector`: gauges and counters read at scrape time from a worker's own counters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from testbed.metrics.records import RequestRecord

__all__ = ["RouterMetrics", "Sample", "SampleCollector"]

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
"""vLLM's buckets (vllm/v1/metrics/loggers.py), so histograms compare bucket for bucket."""
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000,
                 100000, 200000, 500000, 1000000)  # fmt: skip


@dataclass(frozen=True)
class Sample:
    """One gauge or counter value read at scrape time."""

    name: str
    kind: Literal["gauge", "counter"]
    doc: str
    value: float
    labels: dict[str, str] = field(default_factory=dict)


class SampleCollector(Collector):
    """Families built at every scrape from `read()` (a worker's live counters)."""

    def __init__(self, read: Callable[[], Iterable[Sample]]) -> None:
        self.read = read

    def collect(self) -> Iterable[Metric]:
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
        for s in self.read():
            fam = families.get(s.name)
            if fam is None:
                keys = sorted(s.labels)
                if s.kind == "counter":
                    fam = CounterMetricFamily(s.name.removesuffix("_total"), s.doc, labels=keys)
                else:
                    fam = GaugeMetricFamily(s.name, s.doc, labels=keys)
                families[s.name] = fam
            fam.add_metric([s.labels[k] for k in sorted(s.labels)], s.value)
        return list(families.values())


class RouterMetrics:
    """The router's series; `observe_*` are called as requests run (services.router)."""

    def __init__(
        self, model: str, byte_scale: float, read: Callable[[], Iterable[Sample]] = lambda: ()
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.byte_scale = byte_scale
        self.labels = {"model_name": model}
        names = ["model_name"]
        r = self.registry
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token (real-world seconds).",
            names, registry=r, buckets=TTFT_BUCKETS,
        )  # fmt: skip
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Time between streamed tokens as the router forwards them (real-world seconds).",
            names, registry=r, buckets=ITL_BUCKETS,
        )  # fmt: skip
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Arrival to last token of completed requests (real-world seconds).",
            names, registry=r, buckets=E2E_BUCKETS,
        )  # fmt: skip
        self.prompt_hist = Histogram(
            "vllm:request_prompt_tokens", "Prompt tokens of finished requests.",
            names, registry=r, buckets=TOKEN_BUCKETS,
        )  # fmt: skip
        self.gen_hist = Histogram(
            "vllm:request_generation_tokens", "Generated tokens of finished requests.",
            names, registry=r, buckets=TOKEN_BUCKETS,
        )  # fmt: skip
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prompt tokens of requests taken.", names, registry=r
        )
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Tokens streamed to clients.", names, registry=r
        )
        self.success = Counter(
            "vllm:request_success", "Completed requests by finish reason.",
            [*names, "finished_reason"], registry=r,
        )  # fmt: skip
        self.running = Gauge(
            "vllm:num_requests_running", "Requests streaming tokens.", names, registry=r
        )
        self.waiting = Gauge(
            "vllm:num_requests_waiting",
            "Requests taken that have no first token yet (routing, prefill, KV transfer).",
            names, registry=r,
        )  # fmt: skip
        self.requests = Counter(
            "testbed_requests", "Finished requests by route and status.",
            ["route", "status"], registry=r,
        )  # fmt: skip
        self.kv_bytes = Counter(
            "testbed_kv_transfer_bytes",
            "KV bytes decode instances received for finished requests (real-world bytes).",
            ["cross_dc"], registry=r,
        )  # fmt: skip
        self.pull_bytes = Counter(
            "testbed_prefix_pull_bytes",
            "Prefix-cache bytes pulled across the link (real-world bytes).", registry=r,
        )  # fmt: skip
        r.register(SampleCollector(read))
        for m in (self.ttft, self.itl, self.e2e, self.prompt_hist, self.gen_hist):
            m.labels(**self.labels)
        for m2 in (self.prompt_tokens, self.generation_tokens, self.running, self.waiting):
            m2.labels(**self.labels)

    def taken(self, input_tokens: int) -> None:
        """A request was taken: it waits until its first token."""
        self.prompt_tokens.labels(**self.labels).inc(input_tokens)
        self.waiting.labels(**self.labels).inc()

    def first_token(self) -> None:
        self.waiting.labels(**self.labels).dec()
        self.running.labels(**self.labels).inc()

    def tokens(self, n: int) -> None:
        self.generation_tokens.labels(**self.labels).inc(n)

    def gap(self, seconds: float, n: int) -> None:
        """`n` tokens came `seconds` after the previous ones: one observation of seconds / n.

        One per streamed chunk, not per token: a run coalesces ~50 ms of tokens per chunk, and
        an observation per token would cost the router a lock per token. At `testbed up` every
        token is its own chunk, so the count is tokens - 1 per request, as vLLM's."""
        self.itl.labels(**self.labels).observe(seconds / n)

    def finished(self, rec: RequestRecord, started: bool) -> None:
        """A request ended (`started`: it had streamed a token)."""
        (self.running if started else self.waiting).labels(**self.labels).dec()
        self.requests.labels(route=rec.route or "unrouted", status=rec.status).inc()
        self.kv_bytes.labels(cross_dc=str(rec.cross_dc).lower()).inc(
            rec.kv_wire_bytes_received * self.byte_scale
        )
        self.pull_bytes.inc(rec.pull_wire_bytes * self.byte_scale)
        self.prompt_hist.labels(**self.labels).observe(rec.input_tokens)
        self.gen_hist.labels(**self.labels).observe(rec.tokens_out)
        if rec.status != "completed":
            return
        self.success.labels(**self.labels, finished_reason="length").inc()
        if rec.ttft is not None:
            self.ttft.labels(**self.labels).observe(rec.ttft)
        if rec.e2e is not None:
            self.e2e.labels(**self.labels).observe(rec.e2e)
