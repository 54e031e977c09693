"""The per-request figures a summary and a timeline read, kept as they come rather than as records.

`RecordTable.add` takes one request record and keeps what summary.json and timeline.png need
of it: a few numbers per request in typed columns (8 bytes a float, against ~0.6 KB a record
object), exact integer counters and the short lists the decisions section reads. A run can
then write each record to requests.jsonl as it finishes and drop it (the sim's 10K-GPU hour,
testbed.metrics.stream), while a live run builds the same table from its records
(`RecordTable.of`): one code path, so the summary of either is the same.

Every statistic is computed from the columns in record order (the order of requests.jsonl),
with the same float operations the record properties use (`ttft` = first_token - arrival, ...),
so means, standard deviations and percentiles are exact and equal to computing them from the
records.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from testbed.config import SloConfig
from testbed.metrics.bench import DoneFigures, stats
from testbed.metrics.records import RequestRecord
from testbed.policy.decider import fallback_kind

__all__ = ["RecordTable"]

_NONE = float("nan")


class RecordTable:
    """Columns and counters of a run's records, added one at a time in requests.jsonl's order."""

    def __init__(self) -> None:
        self.records: list[RequestRecord] | None = None
        """The records themselves when the table was made from them (`of`) or a `RecordStream`
        kept them (at most its `keep`), else None."""
        self.arrival = array("d")
        self.first_token = array("d")  # nan: None
        self.last_token = array("d")
        self.tokens_out = array("q")
        self.input_tokens = array("q")
        self.cached_tokens = array("q")
        self.route = array("b")  # index into self.route_names
        self.completed = array("b")
        self.route_names: list[str] = []
        self._route_index: dict[str | None, int] = {}
        self.failures: Counter[str] = Counter()
        self.kv_expected = 0
        self.kv_sent = 0
        self.kv_received = 0
        self.kv_cross_dc = 0
        self.kv_received_by_route: Counter[str] = Counter()
        self.found = {"prfaas": 0, "local": 0}
        self.pulls = {"asked": 0, "ok": 0, "failed": 0, "skipped": 0, "tokens": 0, "bytes": 0}
        self.pull_s = array("d")
        self.retries = 0
        self.decided: Counter[str] = Counter()
        self.fallback_kinds: Counter[str] = Counter()
        self.first_fallback: str | None = None
        self._fallback_seen = False
        self.decision_wall: list[float] = []
        self.decision_answer: list[float] = []
        self.own = array("d")
        """arrival, threshold, arrival, ... of requests the policy decided naming a threshold
        (a built-in policy names the scheduler's on every request: 16 bytes each here)."""

    @classmethod
    def of(cls, records: Iterable[RequestRecord]) -> RecordTable:
        table = cls()
        table.records = records if isinstance(records, list) else list(records)
        for r in table.records:
            table.add(r)
        return table

    def __len__(self) -> int:
        return len(self.arrival)

    def add(self, r: RequestRecord) -> None:
        self.arrival.append(r.arrival)
        self.first_token.append(_NONE if r.first_token is None else r.first_token)
        self.last_token.append(_NONE if r.last_token is None else r.last_token)
        self.tokens_out.append(r.tokens_out)
        self.input_tokens.append(r.input_tokens)
        self.cached_tokens.append(r.cached_tokens)
        route = r.route
        idx = self._route_index.get(route)
        if idx is None:
            idx = self._route_index[route] = len(self.route_names)
            self.route_names.append(route or "unrouted")
        self.route.append(idx)
        done = r.status == "completed"
        self.completed.append(done)
        if not done:
            self.failures[r.failure_reason or "unknown"] += 1
        self.kv_expected += r.kv_wire_bytes_expected
        self.kv_sent += r.kv_wire_bytes_sent
        self.kv_received += r.kv_wire_bytes_received
        if r.cross_dc:
            self.kv_cross_dc += r.kv_wire_bytes_received
        self.kv_received_by_route[route or "unrouted"] += r.kv_wire_bytes_received
        self.found["prfaas"] += r.cached_prfaas
        self.found["local"] += r.cached_local
        pulls = self.pulls
        pulls["bytes"] += r.pull_wire_bytes
        status = r.pull_status
        if status is not None:
            pulls["asked"] += 1
            if status == "ok":
                pulls["ok"] += 1
                pulls["tokens"] += r.pull_tokens
                if r.pull_s is not None:
                    self.pull_s.append(r.pull_s)
            elif status.startswith("failed"):
                pulls["failed"] += 1
            elif status.startswith("skipped"):
                pulls["skipped"] += 1
        self.retries += r.retries
        by = r.decided_by
        if by is not None:
            self.decided[by] += 1
            if by == "fallback":
                self.fallback_kinds[fallback_kind(r.fallback_reason)] += 1
                if not self._fallback_seen:
                    self.first_fallback, self._fallback_seen = r.fallback_reason, True
            if r.decision_wall_s is not None:
                self.decision_wall.append(r.decision_wall_s)
            if r.decision_answer_s is not None:
                self.decision_answer.append(r.decision_answer_s)
            if by == "policy" and r.threshold_tokens is not None:
                self.own.append(r.arrival)
                self.own.append(float(r.threshold_tokens))

    # --- the columns as numpy arrays, and what the summary derives from them ---

    def own_thresholds(self) -> list[tuple[float, float]]:
        """(arrival, threshold) pairs of `own`, sorted (metrics.thresholds.own_thresholds)."""
        own = self.own
        return sorted(zip(own[0::2], own[1::2], strict=True))

    def columns(self) -> dict[str, np.ndarray]:
        """arrival, first, last, tokens_out, input, cached, route, done, and the latencies
        (ttft, tpot, e2e: nan where the record's property is None)."""
        arrival = np.frombuffer(self.arrival, dtype=np.float64) if len(self) else np.zeros(0)
        first = np.frombuffer(self.first_token, dtype=np.float64) if len(self) else np.zeros(0)
        last = np.frombuffer(self.last_token, dtype=np.float64) if len(self) else np.zeros(0)
        out = np.asarray(self.tokens_out, dtype=np.int64)
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(out >= 2, (last - first) / (out - 1), np.nan)
        return {
            "arrival": arrival,
            "first": first,
            "last": last,
            "tokens_out": out,
            "input": np.asarray(self.input_tokens, dtype=np.int64),
            "cached": np.asarray(self.cached_tokens, dtype=np.int64),
            "route": np.asarray(self.route, dtype=np.int8),
            "done": np.asarray(self.completed, dtype=bool),
            "ttft": first - arrival,
            "tpot": tpot,
            "e2e": last - arrival,
        }

    def good(self, cols: dict[str, np.ndarray], slo: SloConfig) -> int:
        """Completed requests within every SLO bound (metrics.summary.meets_slo)."""
        ok = cols["done"] & ~np.isnan(cols["ttft"]) & (cols["ttft"] <= slo.ttft)
        if slo.e2e is not None:
            ok &= ~np.isnan(cols["e2e"]) & (cols["e2e"] <= slo.e2e)
        tpot = cols["tpot"]
        ok &= np.isnan(tpot) | (tpot <= slo.tpot * (1.0 + slo.tpot_tolerance))
        return int(ok.sum())

    def routes(self) -> dict[str, int]:
        """Route (or "unrouted") -> requests, sorted by name."""
        counts = np.bincount(
            np.asarray(self.route, dtype=np.int64), minlength=len(self.route_names)
        )
        merged: Counter[str] = Counter()
        for i, name in enumerate(self.route_names):
            merged[name] += int(counts[i])
        return dict(sorted(merged.items()))

    def route_mask(self, cols: dict[str, np.ndarray], name: str) -> np.ndarray:
        codes = [i for i, n in enumerate(self.route_names) if n == name]
        return np.isin(cols["route"], codes)

    def by_route(self, cols: dict[str, np.ndarray], byte_scale: float) -> dict[str, Any]:
        out: dict[str, Any] = {}
        done = cols["done"]
        for route in sorted(set(self.route_names)):
            rs = self.route_mask(cols, route)
            n = int(rs.sum())
            d = rs & done
            ttft, e2e = cols["ttft"][d], cols["e2e"][d]
            out[route] = {
                "requests": n,
                "completed": int(d.sum()),
                "failed": n - int(d.sum()),
                "input_tokens_mean": float(np.mean(cols["input"][rs])),
                "cached_tokens_mean": float(np.mean(cols["cached"][rs])),
                "ttft_s": stats(ttft[~np.isnan(ttft)]),
                "e2e_s": stats(e2e[~np.isnan(e2e)]),
                "kv_bytes": float(self.kv_received_by_route[route]) * byte_scale,
            }
        return out

    def prefix_cache(self, cols: dict[str, np.ndarray], byte_scale: float) -> dict[str, Any]:
        """metrics.summary's `prefix_cache` section (see its docstring there)."""
        clusters: dict[str, Any] = {}
        for cluster in ("prfaas", "local"):
            rs = self.route_mask(cols, cluster) if cluster in self.route_names else None
            if rs is None:
                hit = total = requests = hit_requests = 0
            else:
                cached = cols["cached"][rs]
                hit, total = int(cached.sum()), int(cols["input"][rs].sum())
                requests, hit_requests = int(rs.sum()), int((cached > 0).sum())
            clusters[cluster] = {
                "requests": requests,
                "hit_requests": hit_requests,
                "hit_tokens": hit,
                "hit_fraction": hit / total if total else None,
                "found_tokens": self.found[cluster],
            }
        p = self.pulls
        return {
            "clusters": clusters,
            "pulls": {
                "asked": p["asked"],
                "ok": p["ok"],
                "failed": p["failed"],
                "skipped": p["skipped"],
                "tokens": p["tokens"],
                "bytes": float(p["bytes"]) * byte_scale,
                "seconds": stats(np.asarray(self.pull_s, dtype=np.float64)),
            },
        }

    def done(self, cols: dict[str, np.ndarray]) -> DoneFigures:
        """The completed requests' count, token totals and latencies (metrics.bench)."""
        d = cols["done"]
        lat: dict[str, Sequence[float] | np.ndarray] = {}
        for prop, col in (("ttft", "ttft"), ("tpot", "tpot"), ("itl", "tpot"), ("e2e", "e2e")):
            v = cols[col][d]
            lat[prop] = v[~np.isnan(v)]
        return DoneFigures(
            int(d.sum()), int(cols["input"][d].sum()), int(cols["tokens_out"][d].sum()), lat
        )
