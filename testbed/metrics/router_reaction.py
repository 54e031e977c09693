"""How an external router reacted to the faults of a run (summary.json's `router_reaction`).

An external router keeps no record we can read, so its reaction is read from what the workers
journaled (the `attempt` history events: every call the router made to a prefill or a decode
half, with its arrival and outcome) and from what its clients saw (the records):

- `failures`: client-visible failures by the router's reason, as the client got it.
- `attempts`: the workers' attempts by side and outcome; `retried_requests`: requests that
  reached a side more than once (the router retried; SGLang's gateway also re-sends the decode
  half with each retry); `orphans`: released attempts (a half the router closed or abandoned),
  by side and reason.
- per fault (`faults`): the instances it cut off (a process fault's targets; for a link fault,
  the PrfaaS prefill instances, whose calls cross the link's control path), and the time from
  the fault's start until the router stopped sending to them: the last attempt arriving for
  them inside the fault's window, `null` when none arrived. An attempt is for an instance when
  it arrived there, or, for a decode half, the router paired it with that prefill. A killed
  instance logs nothing itself, so the trace is its partner's half:
  - a killed prefill: the decode halves the `sglang` gateway paired with it; with the `vllm`
    flavour, where the decode is called only after the prefill answered, none, and its
    client-visible failures are the trace instead (`last_failure_s`);
  - a killed decode (`unpaired`): the prefill halves whose room no decode journaled, the
    router's other half having gone to the dead decode (`sglang`: sent at once with it; `vllm`:
    the prefill that answered before the router's decode call failed). Inferred, not named:
    a prefill attempt does not say which decode it was paired with;
  - a paused instance (`held`): it holds the router's connections and reads them only when it
    resumes, journaling their arrival then. An attempt it journaled after the window for a
    request the client sent inside it counts, at that client arrival (a lower bound of when the
    router sent it; the instance's own clock reading stood for the resume).
  Client failures during a fault: the requests that arrived inside its window and failed, plus
  the streams it broke (`broken_streams`: requests that arrived before it and failed with their
  last token less than a second before its start or inside it: a decode killed mid-stream).

`control_path`: the address the router was given for each PrfaaS prefill (its control-path
proxy on the link), which its error messages name.

Times are on the load's clock (the nemesis' too): an attempt's `at` (set by the runner from its
arrival on the services' clock), a fault event's `t`. The section is absent from a run without
attempts (our own router's runs).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from testbed.metrics.history import events
from testbed.metrics.records import HistoryEvent, RequestRecord

__all__ = ["reaction_lines", "router_reaction"]

_PROCESS_ACTIONS = ("kill", "pause", "restart")


def _prefill_targets(a: dict[str, Any]) -> str | None:
    """The prefill instance an attempt was sent for: its own (prefill side) or the one the
    router paired it with (decode side)."""
    if a.get("side") == "prefill":
        return a.get("instance")
    return a.get("prefill_target")


def _unpaired_prefills(attempts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Prefill attempts whose room no decode attempt carries: their decode half never reached a
    worker that journaled it."""
    met = {a.get("room") for a in attempts if a.get("side") == "decode"}
    return [a for a in attempts
            if a.get("side") == "prefill" and a.get("room") is not None
            and a["room"] not in met]  # fmt: skip


def _sent_for(
    w: dict[str, Any],
    cut: list[str],
    attempts: list[dict[str, Any]],
    arrivals: dict[str, float],
) -> tuple[list[float], int, int]:
    """When the router sent each call for the cut-off instances inside the fault's window (see
    the module's doc), and how many of those calls were `unpaired` and `held`."""
    end = w["end"] if w["end"] is not None else float("inf")
    decode_cut = w["action"] in _PROCESS_ACTIONS and any("-decode-" in i for i in cut)
    unpaired = {id(a) for a in _unpaired_prefills(attempts)} if decode_cut else set()
    sent: list[float] = []
    n_unpaired = n_held = 0
    for a in attempts:
        if a.get("at") is None:
            continue
        t = float(a["at"])
        if w["start"] <= t < end:
            if _prefill_targets(a) in cut or a.get("instance") in cut:
                sent.append(t)
            elif id(a) in unpaired:
                sent.append(t)
                n_unpaired += 1
        elif t >= end and w["action"] == "pause" and a.get("instance") in cut:
            sent_at = arrivals.get(str(a.get("request")))
            if sent_at is not None and w["start"] <= sent_at < end:
                sent.append(sent_at)
                n_held += 1
    return sent, n_unpaired, n_held


_STREAM_GAP_S = 1.0
"""A failed stream whose last token came less than this before a fault's start was still
flowing when the fault struck (its tokens come tens of milliseconds apart): the fault broke it."""


def _client_failures(
    failed: list[RequestRecord], start: float, end: float
) -> tuple[list[float], int]:
    """The client failures a fault's window accounts for, each at its time after the start: the
    requests that arrived inside it, and the streams it broke (they arrived before: a decode
    killed mid-stream), at their last token (0 if just before the start); and how many of them
    were broken streams."""
    times = [r.arrival - start for r in failed if start <= r.arrival < end]
    broken = [max(0.0, r.last_token - start) for r in failed
              if r.arrival < start and r.tokens_out > 0 and r.last_token is not None
              and start - _STREAM_GAP_S <= r.last_token < end]  # fmt: skip
    return times + broken, len(broken)


def _fault_windows(history: list[HistoryEvent]) -> list[dict[str, Any]]:
    """Each fault's start (and end, if it ended) on the load's clock, by its index."""
    starts: dict[int, dict[str, Any]] = {}
    for e in sorted((e for e in history if e.kind == "fault"), key=lambda e: e.t):
        idx = int(e.data.get("index", -1))
        if e.data.get("phase") == "start":
            starts[idx] = {"index": idx, "action": e.data.get("action"),
                           "target": e.data.get("target"), "start": e.t, "end": None}  # fmt: skip
        elif idx in starts:
            starts[idx]["end"] = e.t
    return [starts[i] for i in sorted(starts)]


def router_reaction(
    records: Sequence[RequestRecord], history: Sequence[HistoryEvent]
) -> dict[str, Any] | None:
    """The section (see the module's doc); None without attempts (found without building a
    `RunHistory`'s queue samples: the sim's runs have none)."""
    attempts = [e.data for e in events(history, "attempt")]
    if not attempts:
        return None
    history = list(history)
    by_side: dict[str, Counter[str]] = defaultdict(Counter)
    orphans: dict[str, Counter[str]] = defaultdict(Counter)
    per_request: dict[str, Counter[str]] = defaultdict(Counter)
    far: set[str] = set()
    for a in attempts:
        side = str(a.get("side"))
        by_side[side][str(a.get("outcome"))] += 1
        if a.get("outcome") == "released":
            orphans[side][str(a.get("reason") or "unknown")] += 1
        if a.get("request") is not None:
            per_request[str(a["request"])][side] += 1
        if side == "prefill" and a.get("cluster") == "prfaas" and a.get("instance"):
            far.add(str(a["instance"]))
    failed = [r for r in records if r.status != "completed"]
    arrivals = {r.id: r.arrival for r in records}
    proxies: dict[str, str] = {}
    for e in history:
        if e.kind == "control_path":
            proxies.update(e.data.get("proxies") or {})
    faults = []
    for w in _fault_windows(history):
        if w["action"] in _PROCESS_ACTIONS:
            cut = sorted(str(w["target"] or "").split(",")) if w["target"] else []
        elif w["target"] == "link" and w["action"] != "burst":
            cut = sorted(far)
        else:
            continue
        end = w["end"] if w["end"] is not None else float("inf")
        sent, unpaired, held = _sent_for(w, cut, attempts, arrivals)
        lost, broken = _client_failures(failed, w["start"], end)
        faults.append(
            {
                "index": w["index"],
                "action": w["action"],
                "target": w["target"],
                "start_s": w["start"],
                "end_s": w["end"],
                "window_s": end - w["start"] if w["end"] is not None else None,
                "instances": cut,
                "attempts_during": len(sent),
                "unpaired": unpaired,
                "held": held,
                "stopped_after_s": max(sent) - w["start"] if sent else None,
                "client_failures_during": len(lost),
                "broken_streams": broken,
                "last_failure_s": max(lost) if lost else None,
            }
        )
    return {
        "failures": dict(sorted(Counter(r.failure_reason or "unknown" for r in failed).items())),
        "attempts": {s: dict(sorted(c.items())) for s, c in sorted(by_side.items())},
        "retried_requests": {
            side: sum(1 for c in per_request.values() if c[side] > 1) for side in sorted(by_side)
        },
        "orphans": {s: dict(sorted(c.items())) for s, c in sorted(orphans.items())},
        "faults": faults,
        "control_path": dict(sorted(proxies.items())),
    }


def _s(v: float | None) -> str:
    return "none" if v is None else f"{v:.2f} s"


def reaction_lines(section: dict[str, Any] | None) -> list[str]:
    """The report's "Router reaction" section (Markdown lines), empty without one."""
    if not section:
        return []
    lines = ["", "## Router reaction", ""]
    attempts = section["attempts"]
    lines.append(
        "- attempts the workers saw: "
        + "; ".join(f"{side} {dict(c)}" for side, c in attempts.items())
    )
    lines.append(f"- requests the router sent to a side more than once: "
                 f"{section['retried_requests']}")  # fmt: skip
    orphans = sum(sum(c.values()) for c in section["orphans"].values())
    lines.append(f"- orphan halves (released): {orphans} {section['orphans'] or ''}".rstrip())
    if section.get("control_path"):
        lines.append(
            "- the router reached the PrfaaS prefills through the link's control path (its "
            "errors name these addresses): "
            + ", ".join(f"{i} = {u}" for i, u in section["control_path"].items())
        )
    fails = section["failures"]
    lines.append(f"- client-visible failures: {sum(fails.values())}")
    lines += [f"  - {n} x {reason}" for reason, n in fails.items()]
    if section["faults"]:
        lines += [
            "",
            "| fault | from | instances | attempts during | router stopped after | "
            "client failures during | last failure after |",
            "|---|---|---|---|---|---|---|",
        ]
        for f in section["faults"]:
            lines.append(
                f"| {f['action']} {f['target']} | {f['start_s']:.1f} s | "
                f"{', '.join(f['instances']) or '-'} | {f['attempts_during']} | "
                f"{_s(f['stopped_after_s'])} | {f['client_failures_during']} | "
                f"{_s(f['last_failure_s'])} |"
            )
    return lines
