"""The load book: the router's (and the simulator's) accounting of every instance's load, kept
so that a policy's snapshot costs O(1) to make and O(log n) to query.

The router charges an instance when it dispatches an attempt and releases it when the attempt's
part there ends; between decisions only those two instances' loads change, so rebuilding every
instance's view per decision (what the router did before) made a decision cost O(n): ~1 ms at
1,000 instances, far too much at 10,000. The book instead keeps, per (cluster, role), a heap of
the instances in state ok keyed as `least_loaded` orders them (outstanding work, outstanding
requests, id); a changed instance gets a new entry and its old one goes stale, dropped when it
surfaces (lazy deletion), and the heap is rebuilt when stale entries outnumber live ones.

It also numbers every change (`version`) and remembers each instance's last one in change order,
so `changed_since(v)` walks only what moved: what a delta encoding of the snapshot sends.

Both the live router (services.router.dispatch) and the simulator (sim.cluster) keep their load
in one of these, so the policy sees the same accounting on both substrates.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import overload

from testbed.policy.base import (
    Cluster,
    CostModel,
    InstanceLoad,
    InstanceState,
    LinkView,
    Snapshot,
)

__all__ = ["BookEntry", "LoadBook"]

_Entry = tuple[float, int, str, int]
"""(outstanding work, outstanding, id, version of the change): an entry is live while its
version is the instance's last change."""


@dataclass
class BookEntry:
    """One instance as the book knows it: where it sits and what it serves."""

    id: str
    cluster: Cluster
    role: str
    hardware: str | None = None


class LoadBook:
    """Outstanding requests, work and queue wait per instance, their health, and the index."""

    def __init__(
        self,
        instances: Iterable[BookEntry],
        draining: set[str],
        costs: CostModel | None = None,
    ) -> None:
        self.entries: dict[str, BookEntry] = {e.id: e for e in instances}
        self.outstanding: dict[str, int] = dict.fromkeys(self.entries, 0)
        """Requests dispatched to each instance and not finished there."""
        self.work: dict[str, float] = dict.fromkeys(self.entries, 0.0)
        """Prefill: uncached tokens outstanding; decode: output tokens outstanding."""
        self.wait: dict[str, float] = dict.fromkeys(self.entries, 0.0)
        """Prefill: T_prefill of the outstanding requests, summed (real-world seconds)."""
        self.healthy: dict[str, bool] = dict.fromkeys(self.entries, True)
        self.draining = draining
        """The scheduler state's draining set (the long-term loop adds and removes ids in
        place; the book notices the difference at the next snapshot)."""
        self.costs = costs
        self.version = 0
        self._seen_draining: frozenset[str] = frozenset()
        self._loads: dict[str, InstanceLoad] = {}
        """Each instance's InstanceLoad as of its last change, made when first read: a change
        costs no object (four changes an attempt; most loads are never read)."""
        self._states: dict[str, InstanceState] = {}
        """Each instance's state as of its last change."""
        self._changed: dict[str, int] = {}
        """Instance id -> version of its last change, in the order of those changes."""
        self._heaps: dict[tuple[str, str], list[_Entry]] = {}
        self._link: LinkView | None = None
        for iid in self.entries:
            self._touch(iid)

    # ------------------------------------------------------------------ changes

    def charge(
        self, prefill: str | None, tokens: float, decode: str | None, out: float, sign: int
    ) -> None:
        """Add (sign +1) or remove (-1) one attempt's load: `tokens` uncached tokens on the
        prefill instance, `out` output tokens on the decode instance."""
        if prefill is not None:
            self.outstanding[prefill] += sign
            self.work[prefill] += sign * tokens
            self.wait[prefill] += sign * self._prefill_s(prefill, tokens)
            if self.outstanding[prefill] == 0:
                self.wait[prefill] = 0.0  # no float residue on an idle instance
            self._touch(prefill)
        if decode is not None:
            self.outstanding[decode] += sign
            self.work[decode] += sign * out
            self._touch(decode)

    def set_healthy(self, iid: str, ok: bool) -> None:
        if self.healthy[iid] != ok:
            self.healthy[iid] = ok
            self._touch(iid)

    def set_role(self, iid: str, role: str) -> None:
        """A switchable instance now serves `role`."""
        entry = self.entries[iid]
        if entry.role != role:
            entry.role = role
            self._touch(iid)

    def _prefill_s(self, iid: str, tokens: float) -> float:
        costs = self.costs
        if costs is None or tokens <= 0:
            return 0.0
        try:
            return costs.prefill_s(self.entries[iid].cluster, tokens)
        except KeyError:
            return 0.0

    def _state(self, iid: str) -> InstanceState:
        if not self.healthy[iid]:
            return "suspect"
        return "draining" if iid in self.draining else "ok"

    def _touch(self, iid: str) -> None:
        self.version = version = self.version + 1
        self._loads.pop(iid, None)
        state = self._states[iid] = self._state(iid)
        changed = self._changed
        changed.pop(iid, None)
        changed[iid] = version
        if state == "ok":
            e = self.entries[iid]
            heap = self._heaps.setdefault((e.cluster, e.role), [])
            heapq.heappush(heap, (self.work[iid], self.outstanding[iid], iid, version))
            if len(heap) > 2 * len(self.entries) + 64:
                self._compact(heap)

    def _compact(self, heap: list[_Entry]) -> None:
        changed = self._changed
        live = [x for x in heap if changed[x[2]] == x[3]]
        heap[:] = live
        heapq.heapify(heap)

    def _sync_draining(self) -> None:
        now = frozenset(self.draining)
        if now != self._seen_draining:
            for iid in now ^ self._seen_draining:
                if iid in self.entries:
                    self._touch(iid)
            self._seen_draining = now

    # ------------------------------------------------------------------ reads

    def load(self, iid: str) -> InstanceLoad:
        load = self._loads.get(iid)
        if load is None:
            e = self.entries[iid]
            load = self._loads[iid] = InstanceLoad(
                iid,
                e.cluster,
                e.role,  # type: ignore[arg-type]
                self.outstanding[iid],
                self.work[iid],
                self.wait[iid] if e.role == "prefill" else 0.0,
                self._states[iid],
                e.hardware,
            )
        return load

    def link_view(
        self,
        bandwidth_bps: float | None,
        in_flight_bytes: float | None,
        delivered_bps: float | None,
        rtt_s: float | None,
        scarce: bool,
    ) -> LinkView:
        """The snapshot's LinkView: the same (immutable) one while it is given the same
        objects, which the scheduler state holds from one short-term tick to the next (a
        decision per request made a new one, a frozen dataclass at about a microsecond each).
        Identity, not equality: an equal value in a new object (0.0 for -0.0, say) still gets
        a view of its own."""
        view = self._link
        if (
            view is None
            or view.bandwidth_bps is not bandwidth_bps
            or view.in_flight_bytes is not in_flight_bytes
            or view.delivered_bps is not delivered_bps
            or view.rtt_s is not rtt_s
            or view.scarce is not scarce
        ):
            view = LinkView(bandwidth_bps, in_flight_bytes, delivered_bps, rtt_s, scarce)
            self._link = view
        return view

    def snapshot(
        self,
        now: float,
        threshold: float | None,
        scarce: bool,
        link: LinkView | None = None,
        exclude: frozenset[str] = frozenset(),
    ) -> Snapshot:
        """The policy's view now; `exclude` names instances or clusters the request failed on."""
        self._sync_draining()
        return Snapshot(
            now=now,
            instances=_Instances(self, exclude),
            threshold_tokens=threshold,
            bandwidth_scarce=scarce,
            link=link,
            costs=self.costs,
            version=self.version,
            index=self,
            exclude=exclude,
        )

    def least(
        self, cluster: Cluster | None, role: str, exclude: frozenset[str]
    ) -> InstanceLoad | None:
        """`Snapshot.least_loaded` in O(log n): the top of the (cluster, role) heap once stale
        entries are dropped; excluded instances are set aside and put back."""
        changed = self._changed
        if cluster is not None and not exclude:  # a policy's usual question: one heap
            heap = self._heaps.get((cluster, role))
            while heap:
                top = heap[0]
                if changed[top[2]] == top[3]:
                    return self.load(top[2])
                heapq.heappop(heap)  # stale: the instance changed since
            return None
        best: _Entry | None = None
        for c in (cluster,) if cluster is not None else ("prfaas", "local"):
            if c in exclude:
                continue
            heap = self._heaps.get((c, role))
            if not heap:
                continue
            aside: list[_Entry] = []
            while heap:
                top = heap[0]
                if changed[top[2]] != top[3]:
                    heapq.heappop(heap)  # stale: the instance changed since
                elif top[2] in exclude:
                    aside.append(heapq.heappop(heap))
                else:
                    if best is None or top[:3] < best[:3]:
                        best = top
                    break
            for x in aside:
                heapq.heappush(heap, x)
        return self.load(best[2]) if best is not None else None

    def changed_since(self, version: int, exclude: frozenset[str]) -> tuple[InstanceLoad, ...]:
        """Instances changed after `version`, oldest change first (walks only those)."""
        out: list[InstanceLoad] = []
        for iid, changed in reversed(self._changed.items()):
            if changed <= version:
                break
            if self._visible(iid, exclude):
                out.append(self.load(iid))
        out.reverse()
        return tuple(out)

    def _visible(self, iid: str, exclude: frozenset[str]) -> bool:
        return not exclude or (iid not in exclude and self.entries[iid].cluster not in exclude)


class _Instances(Sequence[InstanceLoad]):
    """`Snapshot.instances` of a book-backed snapshot: built on first access only (a policy
    that asks `least_loaded` never pays for the whole list)."""

    def __init__(self, book: LoadBook, exclude: frozenset[str]) -> None:
        self._book, self._exclude = book, exclude
        self._items: tuple[InstanceLoad, ...] | None = None

    def _all(self) -> tuple[InstanceLoad, ...]:
        if self._items is None:
            book, exclude = self._book, self._exclude
            self._items = tuple(
                book.load(iid) for iid in book.entries if book._visible(iid, exclude)
            )
        return self._items

    @overload
    def __getitem__(self, i: int) -> InstanceLoad: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[InstanceLoad]: ...

    def __getitem__(self, i: int | slice) -> InstanceLoad | Sequence[InstanceLoad]:
        return self._all()[i]

    def __len__(self) -> int:
        return len(self._all())

    def __iter__(self) -> Iterator[InstanceLoad]:
        return iter(self._all())

    def __repr__(self) -> str:
        return f"_Instances({list(self._all())!r})"
