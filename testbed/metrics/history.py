"""A run's history with its queue samples as columns: the sim's 10K-GPU hour samples 1,248
instances' queues four times a simulated second, 1.8M events that as objects took more memory
than everything else but the records (bench/sim_scale.py).

`RunHistory` keeps each queue sample as a time, a series index and a depth, the other events as
they are. It iterates in time order, ties in the order the events were added (the stable sort
the sim applied to its list), builds a queue event only when iterated, and answers the
summary's and the timeline's questions (`events`, `queue_series`, `docs`) without building one.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np

from testbed.metrics.records import HistoryEvent

__all__ = ["RunHistory", "events"]

QUEUE = "queue"


class RunHistory(Sequence[HistoryEvent]):
    """A run's history with its queue samples as columns (see the module's docstring)."""

    def __init__(self) -> None:
        self._seq = 0
        self._other: list[HistoryEvent] = []
        self._other_seq = array("q")
        self._q_t = array("d")
        self._q_series = array("l")  # index into self._series
        self._q_depth = array("q")
        self._q_seq = array("q")
        self._series: list[tuple[str, str, str]] = []  # (instance, cluster, role)
        self._series_index: dict[tuple[str, str, str], int] = {}
        self._order: np.ndarray | None = None
        self.loose_queue = False
        """A queue sample that is not (str, str, str, int) was kept as an event: `queue_series`
        then leaves it out (testbed.metrics.summary.queue_depth_series reads every event)."""

    def __len__(self) -> int:
        return len(self._other) + len(self._q_t)

    def append(self, event: HistoryEvent) -> None:
        d = event.data
        if event.kind == QUEUE and list(d) == ["instance", "cluster", "role", "depth"]:
            key = (d["instance"], d["cluster"], d["role"])
            depth = d["depth"]
            if type(depth) is int and all(type(k) is str for k in key):
                self.add_queue(event.t, [(*key, depth)])
                return
        self.loose_queue |= event.kind == QUEUE
        self._other.append(event)
        self._other_seq.append(self._seq)
        self._seq += 1
        self._order = None

    def extend(self, events: Iterable[HistoryEvent]) -> None:
        for e in events:
            self.append(e)

    def add_queue(self, t: float, rows: Iterable[tuple[str, str, str, int]]) -> None:
        """Queue samples at `t`: (instance, cluster, role, depth) each, as
        testbed.metrics.samples.queue_events would make them (depths are ints here)."""
        index = self._series_index
        for inst, cluster, role, depth in rows:
            if type(depth) is not int:  # kept as an event, as written
                data = {"instance": inst, "cluster": cluster, "role": role, "depth": depth}
                self._other.append(HistoryEvent(t, QUEUE, data))
                self.loose_queue = True
                self._other_seq.append(self._seq)
                self._seq += 1
                continue
            key = (inst, cluster, role)
            i = index.get(key)
            if i is None:
                i = index[key] = len(self._series)
                self._series.append(key)
            self._q_t.append(t)
            self._q_series.append(i)
            self._q_depth.append(depth)
            self._q_seq.append(self._seq)
            self._seq += 1
        self._order = None

    def _sorted(self) -> np.ndarray:
        """Positions (queue samples first, then the others) in (t, order added) order."""
        if self._order is None:
            t = self.times()
            seq = np.concatenate(
                [np.asarray(self._q_seq, dtype=np.int64), np.asarray(self._other_seq, np.int64)]
            )
            self._order = np.lexsort((seq, t))
        return self._order

    def _queue_event(self, i: int) -> HistoryEvent:
        inst, cluster, role = self._series[self._q_series[i]]
        data = {"instance": inst, "cluster": cluster, "role": role, "depth": self._q_depth[i]}
        return HistoryEvent(self._q_t[i], QUEUE, data)

    def __iter__(self) -> Iterator[HistoryEvent]:
        nq = len(self._q_t)
        for pos in self._sorted().tolist():
            yield self._queue_event(pos) if pos < nq else self._other[pos - nq]

    @overload
    def __getitem__(self, i: int) -> HistoryEvent: ...
    @overload
    def __getitem__(self, i: slice) -> list[HistoryEvent]: ...
    def __getitem__(self, i: int | slice) -> HistoryEvent | list[HistoryEvent]:
        if isinstance(i, slice):
            return list(itertools.islice(iter(self), *i.indices(len(self))))
        n = len(self)
        pos = int(self._sorted()[i if i >= 0 else n + i])
        nq = len(self._q_t)
        return self._queue_event(pos) if pos < nq else self._other[pos - nq]

    def times(self) -> np.ndarray:
        """Every event's time (in no particular order)."""
        others = np.array([e.t for e in self._other], dtype=np.float64)
        return np.concatenate([np.asarray(self._q_t, dtype=np.float64), others])

    def docs(self) -> Iterator[dict[str, Any]]:
        """Every event's history.jsonl object, in order (no event built per queue sample)."""
        nq = len(self._q_t)
        q_t, q_series, q_depth, series = self._q_t, self._q_series, self._q_depth, self._series
        for pos in self._sorted().tolist():
            if pos < nq:
                inst, cluster, role = series[q_series[pos]]
                yield {"t": q_t[pos], "kind": QUEUE, "instance": inst, "cluster": cluster,
                       "role": role, "depth": q_depth[pos]}  # fmt: skip
            else:
                yield self._other[pos - nq].to_json()

    def of_kinds(self, *kinds: str) -> list[HistoryEvent]:
        """The events of these kinds, in order (queue samples not among them)."""
        assert QUEUE not in kinds
        ordered = sorted(zip(self._other, self._other_seq, strict=True), key=lambda p: p[0].t)
        return [e for e, _ in ordered if e.kind in kinds]

    def queue_series(self) -> dict[str, dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]]]:
        """cluster/role -> (instance, cluster, role) -> (times, depths) in time order."""
        t = np.asarray(self._q_t, dtype=np.float64)
        s = np.asarray(self._q_series, dtype=np.int64)
        d = np.asarray(self._q_depth, dtype=np.int64)
        order = np.lexsort((np.arange(len(t)), t, s))  # by series, then time, then as added
        t, s, d = t[order], s[order], d[order]
        bounds = np.searchsorted(s, np.arange(len(self._series) + 1))
        out: dict[str, dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]]] = {}
        for i, key in enumerate(self._series):
            lo, hi = bounds[i], bounds[i + 1]
            out.setdefault(f"{key[1]}/{key[2]}", {})[key] = (t[lo:hi], d[lo:hi])
        return out


def events(history: Iterable[HistoryEvent], *kinds: str) -> list[HistoryEvent]:
    """The events of these kinds (not "queue"), in the history's order; a `RunHistory` answers
    without building its queue samples."""
    if isinstance(history, RunHistory):
        return history.of_kinds(*kinds)
    return [e for e in history if e.kind in kinds]
