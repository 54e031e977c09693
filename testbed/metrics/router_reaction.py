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
  them inside the fault's window (a prefill attempt at the instance, or a decode attempt the
  router paired with it), `null` when none arrived (a killed instance logs nothing itself: with
  the `vllm` flavour, where the decode is called only after the prefill answered, its
  client-visible failures are the trace instead: `last_failure_s`).

`control_path`: the address the router was given for each PrfaaS prefill (its control-path
proxy on the link), which its error messages name.

Times are on the load's clock (the nemesis' too): an attempt's `at` (set by the runner from its
arrival on the services' clock), a fault event's `t`. The section is absent from a run without
attempts (our own router's runs).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from testbed.metrics.records import HistoryEvent, RequestRecord

__all__ = ["reaction_lines", "router_reaction"]

_PROCESS_ACTIONS = ("kill", "pause", "restart")


def _prefill_targets(a: dict[str, Any]) -> str | None:
    """The prefill instance an attempt was sent for: its own (prefill side) or the one the
    router paired it with (decode side)."""
    if a.get("side") == "prefill":
        return a.get("instance")
    return a.get("prefill_target")


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
    records: list[RequestRecord], history: list[HistoryEvent]
) -> dict[str, Any] | None:
    """The section (see the module's doc); None without attempts."""
    attempts = [e.data for e in history if e.kind == "attempt"]
    if not attempts:
        return None
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
        sent = [float(a["at"]) for a in attempts
                if _prefill_targets(a) in cut and a.get("at") is not None
                and w["start"] <= float(a["at"]) < end]  # fmt: skip
        lost = [r.arrival for r in failed if w["start"] <= r.arrival < end]
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
                "stopped_after_s": max(sent) - w["start"] if sent else None,
                "client_failures_during": len(lost),
                "last_failure_s": max(lost) - w["start"] if lost else None,
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
