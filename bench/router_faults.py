"""The fault matrix for external routers (issue #32 (iii)): how sglang-router and vllm-router,
each with round_robin and its default cache_aware, react to a prefill kill and pause, a decode
kill, a link partition and a bandwidth drop, next to our own `prfaas` and `prfaas-predict` on
the same fleet, seed and time_scale.

Every run is the library's `partition` scenario (its workload, SLO, seed 13) on the short
deployment (2 PrfaaS + 1 PD-P + 3 PD-D, 100 Gbps / 20 ms / 2 ms jitter) at time_scale 1,
byte_scale 2000, `--duration 60s`, with one fault from 20 s to 40 s (real-world):

- kill: prfaas-prefill-0 SIGKILLed, restarted at the end;
- pause: prfaas-prefill-0 SIGSTOPped, SIGCONTed at the end (it holds the router's connections
  and answers none, its health checks included);
- decode-kill: local-decode-0 SIGKILLed, restarted at the end;
- partition: the link's proxies disabled (mode disable): the KV path and, for an external
  router, its control path to the PrfaaS prefills;
- bandwidth: the link drops from 100 Gbps to 5 Gbps (2.5 Gbps after the short deployment's
  scaling by PrfaaS instances, as the chaos suite scales it).

The external runs use the planner's static PD split (policy prfaas-static: an external router
cannot follow role switches); ours run the named policy. For each run: nothing lost from the
testbed's view (nothing_lost, kv_accounted, no_unverified_decode), SLO attainment, TTFT p90
(client-side: through the router), failures and, for the external routers, the reaction
figures (summary.json's router_reaction). One live run at a time; 83-164 s of wall each in the
last matrix (its `wall` column, bench/reports/real_routers.md).
The matrix is the section `router_faults` of bench/reports/real_routers.md, with its provenance
(`--out FILE` elsewhere; `--only`/`--faults` runs a part, which replaces the section).

    .venv/bin/python bench/router_faults.py [--only vllm-router:round_robin,prfaas] [--faults kill]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from provenance import provenance, write_section  # bench/provenance.py, on sys.path

from testbed.config import ScaleConfig
from testbed.config.router import ExternalRouterConfig
from testbed.experiment import headline
from testbed.scenario.external_run import run_external
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.runner import run_scenario
from testbed.scenario.schema import scenario_from_data
from testbed.scenario.short import short_variant

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "bench" / "reports" / "real_routers.md"
BASE = ROOT / "testbed" / "library" / "partition.yaml"
SEED = 13
DURATION_S = 60.0
FAULTS: dict[str, dict[str, Any]] = {
    "kill": {"action": "kill", "at": "20s", "for": "20s", "target": "prfaas-prefill-0"},
    "pause": {"action": "pause", "at": "20s", "for": "20s", "target": "prfaas-prefill-0"},
    "decode-kill": {"action": "kill", "at": "20s", "for": "20s", "target": "local-decode-0"},
    "partition": {"action": "partition", "at": "20s", "for": "20s", "mode": "disable"},
    "bandwidth": {"action": "bandwidth", "at": "20s", "for": "20s", "bandwidth": "5Gbps"},
}
RUNS = [
    "sglang-router:round_robin",
    "sglang-router:cache_aware",
    "vllm-router:round_robin",
    "vllm-router:cache_aware",
    "prfaas",
    "prfaas-predict",
]
CHECKS = ("nothing_lost", "kv_accounted", "no_unverified_decode")


async def one_run(who: str, fault: str, out: Path) -> dict[str, Any]:
    """One cell of the matrix: `who` is PRESET:POLICY (an external router) or our policy."""
    data = yaml.safe_load(BASE.read_text())
    data["nemesis"] = [FAULTS[fault]]
    data["checkers"] = []  # the built-in ones (nothing lost, KV accounted) still run
    external = ":" in who
    data["policy"] = {"name": "prfaas-static" if external else who, "threshold": "auto"}
    sc = scenario_from_data(data, BASE)
    updates: dict[str, Any] = {
        "scale": ScaleConfig(time_scale=1, byte_scale=2000),
        "duration": DURATION_S,
        "seed": SEED,
    }
    if external:
        preset, policy = who.split(":")
        updates["router"] = ExternalRouterConfig(preset=preset, policy=policy)
    sc = short_variant(sc, **updates)
    opts = RunOptions(out_dir=out, progress=False, drain_timeout_s=120, timeline=False)
    begun = time.perf_counter()
    rp = prepare_run(sc, opts)
    result = await (run_external(rp, opts) if external else run_scenario(rp, opts))
    s = result.summary
    checks = {c.name: c.verdict for c in result.checks}
    reaction = s.get("router_reaction") or {}
    (row,) = reaction.get("faults") or [None]
    return {
        "who": who,
        "fault": fault,
        "wall_s": time.perf_counter() - begun,
        **headline(s),
        "checks": {n: checks.get(n, "absent") for n in CHECKS},
        "prfaas_routed": s["routes"].get("prfaas", 0),
        "retries": s["retries"],
        "failures": s["failures"],
        "reaction": row,
        "orphans": sum(sum(c.values()) for c in reaction.get("orphans", {}).values()),
        "retried_requests": reaction.get("retried_requests"),
    }


def _f(v: float | None, unit: str = " s") -> str:
    return "-" if v is None else f"{v:.2f}{unit}"


def _calls(x: dict[str, Any]) -> str:
    """The calls during the fault, saying how many were inferred (a killed decode's unpaired
    prefill halves) or read by a paused instance only when it resumed (held)."""
    if not x:
        return "-"
    how = [f"{x[k]} {k}" for k in ("unpaired", "held") if x.get(k)]
    return f"{x['attempts_during']}" + (f" ({', '.join(how)})" if how else "")


def _lost(x: dict[str, Any]) -> str:
    """The client failures during the fault, saying how many were streams it broke."""
    if not x:
        return "-"
    n = x["client_failures_during"]
    return f"{n} ({x['broken_streams']} broken streams)" if x.get("broken_streams") else f"{n}"


def _reasons(failures: dict[str, int]) -> str:
    return "; ".join(f"{n} x {r[:300]}" for r, n in failures.items()) or "-"


def render(rows: list[dict[str, Any]], prov: str) -> str:
    """The matrix's section: its provenance, the table, the clients' failure reasons."""
    lines = [
        prov,
        "### Per router policy and fault",
        "",
        "Nothing lost: `nothing_lost`, `kv_accounted`, `no_unverified_decode` all ok (every "
        "client request ended completed or failed with the router's reason, every completed "
        "one's KV accounted and verified). TTFT is the client's (through the router). "
        "Reaction (external routers only, testbed.metrics.router_reaction): calls the router "
        "sent for the cut-off instances during the 20 s fault (prefill attempts there, or "
        "decode halves paired with them; for a killed decode, the prefill halves no decode "
        "journaled: `unpaired`; for a paused prefill, the calls it read only on resuming, "
        "counted at their client's arrival: `held`), the last one's delay after the fault "
        "started, and the client failures during the fault (requests that arrived in it, and "
        "streams it broke) with the last one's delay.",
        "",
        "| router policy | fault | requests | completed | failed | nothing lost | SLO "
        "attainment | TTFT p90 | via PrfaaS | retries | orphan halves | calls during fault | "
        "router stopped after | client failures during | last failure after | wall |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['who']} | {r['fault']} | error: {r['error']} |" + " |" * 13)
            continue
        lost_ok = all(v == "ok" for v in r["checks"].values())
        x = r["reaction"] or {}
        att = r["slo_attainment"]
        lines.append(
            f"| {r['who']} | {r['fault']} | {r['requests']} | {r['completed']} | "
            f"{r['failed']} | {'ok' if lost_ok else r['checks']} | "
            f"{'-' if att is None else f'{att:.1%}'} | {_f(r['ttft_p90_s'])} | "
            f"{r['prfaas_routed']} | {r['retries']} | {r['orphans'] if x else '-'} | "
            f"{_calls(x)} | {_f(x.get('stopped_after_s'))} | "
            f"{_lost(x)} | {_f(x.get('last_failure_s'))} | "
            f"{r['wall_s']:.0f} s |"
        )
    lines += ["", "### Failure reasons (as the clients got them)", ""]
    for r in rows:
        if r.get("failures"):
            lines.append(f"- {r['who']}, {r['fault']}: {_reasons(r['failures'])}")
    return "\n".join(lines) + "\n"


def setup_line() -> str:
    return (
        f"local; the short deployment at time_scale 1, byte_scale 2000, "
        f"duration {DURATION_S:g} s; seed {SEED}"
    )


def write_report(out: Path, text: str) -> None:
    """`text` as the section `router_faults` of `out` (in place of the last run's; the rest of
    the report, the routers' burst samples, is kept)."""
    write_section(out, "router_faults", "The fault matrix", text)
    print(f"wrote {out}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated router policies (default: all)")
    ap.add_argument("--faults", help=f"comma-separated, of {', '.join(FAULTS)} (default: all)")
    ap.add_argument("--out", type=Path, default=REPORT)
    args = ap.parse_args()
    who = args.only.split(",") if args.only else RUNS
    faults = args.faults.split(",") if args.faults else list(FAULTS)
    load_before = os.getloadavg()
    rows: list[dict[str, Any]] = []
    tmp = tempfile.mkdtemp(prefix="router-faults-")  # kept: each run's results and logs
    print(f"runs under {tmp}", flush=True)
    for w in who:
        for f in faults:
            out = Path(tmp) / f"{w.replace(':', '-')}-{f}"
            try:
                row = asyncio.run(one_run(w, f, out))
            except Exception as exc:  # one cell's failure is shown, not the bench's end
                row = {"who": w, "fault": f, "error": f"{type(exc).__name__}: {exc}"[:300]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    text = render(
        rows, provenance("bench/router_faults.py", sys.argv[1:], load_before, setup_line())
    )
    write_report(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
