"""NVIDIA AIPerf against `testbed up`: do an outside benchmark client and the testbed agree?

Creates .venv-aiperf (AIPerf pins its own prometheus-client and pulls in transformers, so it
lives apart from the project's .venv; `make aiperf` runs this script), stands up
scenarios/burst.yaml with `testbed up --no-faults` (time_scale 1), and runs AIPerf twice with the
shipped tokenizer (testbed/data/tokenizer), streaming, server-metrics collection on:

  (a) synthetic prompts on /v1/chat/completions (--isl, --osl, --concurrency, --requests);
  (b) AIPerf's Mooncake-trace dataset mode on scenarios/traces/mooncake-small.jsonl on
      /v1/completions, replayed on the trace's own timestamps (--trace-requests of them).

Then it stops the deployment (SIGINT), reads the testbed's requests.jsonl, takes each phase's
requests (the router's /history between the phases) and prints, per phase, AIPerf's TTFT and
ITL p50/p90 next to the testbed's own records of the same requests, and whether AIPerf's
server-metrics export found our vLLM-named series. Exit 1 if a figure differs by more than 5%.

`--router PRESET[:POLICY]` (sglang-router, vllm-router): the same through an external router,
`testbed up --router` (docs/real-routers.md), one standing deployment per phase (the router
keeps no history, so a phase's requests are all that deployment's records). AIPerf talks to the
router; the testbed's figures are the decode halves' server-side ones (the records joined from
the workers' attempts: TTFT from the first attempt's arrival at a worker to the decode's first
token, ITL from its first to its last token). The server-metrics check is left out (the
router's /metrics are its own). `--report FILE` writes the tables, with the provenance header
(bench/provenance.py), as a section of FILE (bench/reports/aiperf.md), replacing the section of
the same router if there is one.

Usage: python bench/aiperf_drive.py [--out results/aiperf] [--requests 60] [--trace-requests 150]
                                    [--router PRESET[:POLICY]] [--report FILE]
Takes about 4 minutes on 2 cores (plus the one-time AIPerf install).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from testbed.metrics.window import percentile

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv-aiperf"
AIPERF_PIN = "aiperf==0.13.0"
TOKENIZER = ROOT / "testbed" / "data" / "tokenizer"
TRACE = ROOT / "scenarios" / "traces" / "mooncake-small.jsonl"
TOLERANCE = 0.05


def ensure_aiperf() -> Path:
    exe = VENV / "bin" / "aiperf"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        pip = [str(VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "--upgrade", "pip"], check=True)
        subprocess.run([*pip, AIPERF_PIN], check=True)
    return exe


HUB_NAME = "prfaas-testbed/tokenizer-512"
"""The name the shipped tokenizer goes by in the private hub cache `hub_cache` lays out."""


def hub_cache(out: Path) -> Path:
    """The shipped tokenizer laid out as a Hugging Face hub cache entry (no network).

    AIPerf 0.13's prompt-synthesis workers (Mooncake hash_ids) run with HF_HUB_OFFLINE=1 and
    then resolve every tokenizer name through the hub cache, which refuses a filesystem path;
    so AIPerf gets the tokenizer by a hub name whose cache entry is the shipped directory's
    files, and runs offline throughout."""
    cache = out / "hf-cache"
    entry = cache / ("models--" + HUB_NAME.replace("/", "--"))
    commit = "0" * 40
    snap = entry / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    for f in TOKENIZER.iterdir():
        (snap / f.name).write_bytes(f.read_bytes())
    (entry / "refs").mkdir(exist_ok=True)
    (entry / "refs" / "main").write_text(commit)
    return cache


def start_up(
    out: Path, router: str | None = None, tag: str = "testbed"
) -> tuple[subprocess.Popen[str], str]:
    testbed = Path(sys.executable).parent / "testbed"
    cmd = [str(testbed), "up", str(ROOT / "scenarios" / "burst.yaml"), "--no-faults"]
    cmd += ["--out", str(out / tag), *(["--router", router] if router else [])]
    log = (out / f"{tag}-up.log").open("w")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT)
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    banner = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise SystemExit(f"testbed up ended early; see {out}/{tag}-up.log")
        banner.append(line)
        print("  " + line.rstrip())
        if line.startswith("serving at"):
            break
    m = re.search(r"OpenAI base URL:\s+(\S+)/v1", "".join(banner))
    if m is None:
        raise SystemExit("no OpenAI base URL in the banner")
    return proc, m.group(1)


def history_ids(router: str, page: int = 10_000) -> list[str]:
    """Every record's id, a /history page at a time (the router's HISTORY_PAGE); a standing
    router keeps the last 10,000 journaled records, so a phase longer than that is a 410."""
    ids: list[str] = []
    for _ in range(1000):  # bounded: 10M records
        url = f"{router}/history?after={len(ids)}&limit={page}"
        with urllib.request.urlopen(url, timeout=30) as resp:
            docs = json.load(resp)
        ids += [r["id"] for r in docs]
        if len(docs) < page:
            break
    return ids


def aiperf(exe: Path, router: str, art: Path, extra: list[str]) -> None:
    cmd = [
        str(exe), "profile", "--model", "internal-1t-hybrid", "--tokenizer", HUB_NAME,
        "--url", router, "--streaming", "--artifact-dir", str(art), "--ui", "none",
        "--random-seed", "7", *extra,
    ]  # fmt: skip
    print("  $ " + " ".join(cmd[1:]))
    env = {
        **os.environ,
        "HF_HUB_CACHE": str(hub_cache(art.parent)),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    with (art.parent / f"{art.name}.log").open("w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, env=env)


def aiperf_stats(art: Path) -> dict[str, dict[str, float]]:
    """AIPerf's summary (profile_export_aiperf.json): TTFT and ITL percentiles, in ms."""
    doc = json.loads(next(art.rglob("profile_export_aiperf.json")).read_text())
    metrics = doc.get("records", doc)
    out = {}
    for key in ("time_to_first_token", "inter_token_latency"):
        m = metrics[key]
        out[key] = {"p50": float(m["p50"]), "p90": float(m["p90"]), "n": float(m.get("count", 0))}
    return out


def testbed_stats(records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """The testbed's own records of the same requests, the same statistics, in ms."""

    def pct(values: list[float]) -> dict[str, float]:
        a = np.asarray(values) * 1000.0
        return {"p50": float(np.percentile(a, 50)), "p90": percentile(list(a), 90) or 0.0,
                "n": float(len(a))}  # fmt: skip

    done = [r for r in records if r["status"] == "completed"]
    ttft = [r["first_token"] - r["arrival"] for r in done]
    itl = [
        (r["last_token"] - r["first_token"]) / (r["tokens_out"] - 1)
        for r in done
        if r["tokens_out"] > 1
    ]
    return {"time_to_first_token": pct(ttft), "inter_token_latency": pct(itl)}


def server_metrics(art: Path) -> list[str]:
    """vLLM-named series AIPerf's server-metrics export found at our /metrics."""
    names: set[str] = set()
    for f in art.rglob("server_metrics_export*.json"):
        names.update(re.findall(r"vllm:[a-z0-9_]+", f.read_text()))
    return sorted(names)


def table(
    title: str, ours: dict[str, Any], theirs: dict[str, Any], ours_name: str = "testbed records"
) -> tuple[str, bool]:
    rows = [f"**{title}**", "", f"| metric | AIPerf (ms) | {ours_name} (ms) | difference |",
            "|---|---|---|---|"]  # fmt: skip
    ok = True
    for key, label in (("time_to_first_token", "TTFT"), ("inter_token_latency", "ITL")):
        for p in ("p50", "p90"):
            a, b = theirs[key][p], ours[key][p]
            diff = abs(a - b) / b if b else float("inf")
            ok &= diff <= TOLERANCE
            rows.append(f"| {label} {p} | {a:.1f} | {b:.1f} | {diff * 100:.1f}% |")
    n = (int(theirs["time_to_first_token"]["n"]), int(ours["time_to_first_token"]["n"]))
    rows.append(f"\nrequests: AIPerf {n[0]}, testbed {n[1]}")
    return "\n".join(rows), ok


PHASES = {"synthetic": "(a) synthetic, chat", "mooncake": "(b) Mooncake trace, completions"}


def phase_args(name: str, args: argparse.Namespace, trace: Path) -> list[str]:
    if name == "synthetic":
        return ["--endpoint-type", "chat", "--isl", str(args.isl), "--osl", str(args.osl),
                "--concurrency", str(args.concurrency),
                "--request-count", str(args.requests)]  # fmt: skip
    return ["--endpoint-type", "completions", "--input-file", str(trace),
            "--custom-dataset-type", "mooncake_trace", "--fixed-schedule"]  # fmt: skip


def stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=180)


def through_router(exe: Path, args: argparse.Namespace, trace: Path) -> tuple[list[str], bool]:
    """`--router`: each phase against its own `testbed up --router` (see the module's doc)."""
    report, ok = [], True
    for name, title in PHASES.items():
        proc, router = start_up(args.out, args.router, f"testbed-{name}")
        try:
            aiperf(exe, router, args.out / name, phase_args(name, args, trace))
        finally:
            stop(proc)
        recs = list(_records(args.out / f"testbed-{name}" / "requests.jsonl").values())
        failed = sum(r["status"] != "completed" for r in recs)
        text, good = table(f"{title}, through {args.router}", testbed_stats(recs),
                           aiperf_stats(args.out / name), "testbed, server-side")  # fmt: skip
        text += f" ({failed} failed)"
        if gaps := ttft_gaps(args.out / name, args.out / f"testbed-{name}"):
            g = np.asarray(gaps)
            text += (
                f"\n\nper request ({len(g)} joined by AIPerf's X-Request-Id): AIPerf's TTFT minus "
                f"the server-side one, p10 {np.percentile(g, 10):.1f} ms, p50 "
                f"{np.percentile(g, 50):.1f} ms, p90 {percentile(list(g), 90) or 0.0:.1f} ms, max "
                f"{g.max():.1f} ms"
            )
        ok &= good and not failed
        report.append(text)
    return report, ok


def ttft_gaps(art: Path, testbed: Path) -> list[float]:
    """Per request, AIPerf's TTFT minus the record's server-side one (ms), for the requests
    joined by AIPerf's X-Request-Id: SGLang's gateway passes a client's X-Request-Id to the
    decode half (its attempt's `router_id`), vllm-router replaces it (nothing joins)."""
    rooms = {}
    for line in (testbed / "history.jsonl").read_text().splitlines():
        a = json.loads(line)
        if a.get("kind") == "attempt" and a.get("side") == "decode" and a.get("router_id"):
            rooms[a["router_id"]] = f"room-{a['room']}"
    recs = _records(testbed / "requests.jsonl")
    gaps = []
    for line in next(art.rglob("profile_export.jsonl")).read_text().splitlines():
        doc = json.loads(line)
        rec = recs.get(rooms.get(doc["metadata"].get("x_request_id"), ""))
        ttft = doc["metrics"].get("time_to_first_token")
        if rec is not None and rec["status"] == "completed" and ttft is not None:
            gaps.append(float(ttft["value"]) - (rec["first_token"] - rec["arrival"]) * 1000.0)
    return gaps


def write_section(path: Path, heading: str, body: str) -> None:
    """`body` under `heading` in `path`: the section of that heading replaced, else appended."""
    text = path.read_text() if path.exists() else ""
    start = text.find(heading + "\n")
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + heading + "\n\n" + body
    else:
        end = text.find("\n## ", start + len(heading))
        text = text[:start] + heading + "\n\n" + body + (text[end:] if end >= 0 else "")
    path.write_text(text.rstrip("\n") + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "aiperf")
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--isl", type=int, default=2000)
    parser.add_argument("--osl", type=int, default=64)
    parser.add_argument("--trace-requests", type=int, default=150)
    parser.add_argument("--router", metavar="PRESET[:POLICY]",
                        help="through an external router (testbed up --router)")  # fmt: skip
    parser.add_argument("--report", type=Path, metavar="FILE",
                        help="write the tables as a section of FILE, with provenance")  # fmt: skip
    args = parser.parse_args()
    load_before = os.getloadavg()
    args.out.mkdir(parents=True, exist_ok=True)
    exe = ensure_aiperf()
    trace = args.out / "mooncake-head.jsonl"
    lines = TRACE.read_text().splitlines()[: args.trace_requests]
    trace.write_text("\n".join(lines) + "\n")
    if args.router:
        report, ok = through_router(exe, args, trace)
        return finish(args, report, ok, load_before)
    proc, router = start_up(args.out)
    phases: dict[str, list[str]] = {}
    try:
        seen = set(history_ids(router))
        aiperf(exe, router, args.out / "synthetic", phase_args("synthetic", args, trace))
        ids = history_ids(router)
        phases["synthetic"] = [i for i in ids if i not in seen]
        seen.update(ids)
        aiperf(exe, router, args.out / "mooncake", phase_args("mooncake", args, trace))
        phases["mooncake"] = [i for i in history_ids(router) if i not in seen]
    finally:
        stop(proc)
    recs = _records(args.out / "testbed" / "requests.jsonl")
    ok = True
    report = []
    for name, ids in phases.items():
        text, good = table(
            PHASES[name],
            testbed_stats([recs[i] for i in ids if i in recs]),
            aiperf_stats(args.out / name),
        )
        found = server_metrics(args.out / name)
        text += f"; AIPerf server metrics found {len(found)} vllm: series ({', '.join(found)})"
        ok &= good and bool(found)
        report.append(text)
    return finish(args, report, ok, load_before)


def finish(args: argparse.Namespace, report: list[str], ok: bool, load_before: Any) -> int:
    """Print the tables, write comparison.md (and the report's section); the exit code."""
    verdict = f"within {TOLERANCE:.0%}: {'yes' if ok else 'NO'}"
    print("\n\n".join(report))
    (args.out / "comparison.md").write_text("\n\n".join(report) + "\n")
    print(f"\n{verdict}; artifacts in {args.out}")
    if args.report is not None:
        from provenance import provenance  # bench/provenance.py, beside this script

        setup = ("local; scenarios/burst.yaml --no-faults (4 PrfaaS + 3 PD-P + 5 PD-D), "
                 "time_scale 1, byte_scale as the scenario; AIPerf --random-seed 7")  # fmt: skip
        head = provenance("bench/aiperf_drive.py", sys.argv[1:], load_before, setup)
        heading = f"## Through {args.router}" if args.router else "## Through our router"
        write_section(args.report, heading, head + "\n" + "\n\n".join(report) + f"\n\n{verdict}\n")
    return 0 if ok else 1


def _records(path: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            out[r["id"]] = r
    return out


if __name__ == "__main__":
    raise SystemExit(main())
