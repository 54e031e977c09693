"""Acceptance of `link.shaper: tc` (issue #14): `testbed run scenarios/bandwidth-drop.yaml --shaper
tc --policy prfaas-static` (what `make scenario NAME=bandwidth-drop ARGS=...` runs), on local
and on compose, against the same run with the emulator shaping.

- nothing lost, and every checker that passes with the emulator passes with tc. The emulator's
  run is on local, once for both substrates (the same program shapes the link in compose's link
  container; a full run of this scenario costs 30-45 s of the suite's budget). The TTFT-ratio
  checker sits near its bound for prfaas-static (measured 3.6-3.8x against 3.5x with the
  emulator, 2.9-3.8x with tc), so its verdict is not compared when the tc run's ratio is within
  10% of the bound; a tc run may pass it where the emulator's fails (compose: kernel TCP over
  a FIFO queue finishes transfers closer to first-come-first-served than the emulator's even
  sharing, docs/link.md);
- the kernel's counters moved (qdisc bytes, overlimits during the drop) and the rate measured
  from their deltas over windows of at least 1 s (wall) never exceeds the qdisc's cap by more
  than 5%, and reaches at least 90% of it during the drop;
- the run header, summary.json (`link.shaper`) and report.md say which shaper ran;
- no namespace is left behind.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.tc, pytest.mark.slow, pytest.mark.timeout(900)]

SCENARIO = "scenarios/bandwidth-drop.yaml"
DROP = (60.0, 120.0)  # real-world seconds of the scenario's bandwidth action
WINDOW_WALL_S = 1.0


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _run(out: Path, substrate: str, shaper: str) -> tuple[subprocess.CompletedProcess[str], Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "testbed.cli", "run", SCENARIO, "--substrate", substrate,
         "--shaper", shaper, "--policy", "prfaas-static", "--out", str(out), "--quiet"],
        capture_output=True, text=True, timeout=800,
    )  # fmt: skip
    assert (out / "summary.json").exists(), proc.stderr[-3000:]
    return proc, json.loads((out / "summary.json").read_text())


def rate_windows(history: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Non-overlapping windows of >= 1 s wall between kernel link samples over which the qdisc's
    rate stayed the same: (start, end) real-world, measured wire rate and cap (bytes/s wall).
    Durations are the reads' own wall times (`qdisc_at`)."""
    samples = [e for e in history if e["kind"] == "link" and "qdisc_bytes" in e]
    out, i = [], 0
    while i < len(samples) - 1:
        j = i + 1
        while j < len(samples) and samples[j]["qdisc_at"] - samples[i]["qdisc_at"] < WINDOW_WALL_S:
            j += 1
        if j == len(samples):
            break
        span = samples[i : j + 1]
        if len({s["qdisc_rate"] for s in span}) == 1:
            wall = samples[j]["qdisc_at"] - samples[i]["qdisc_at"]
            out.append(
                {
                    "start": samples[i]["t"],
                    "end": samples[j]["t"],
                    "rate": (samples[j]["qdisc_bytes"] - samples[i]["qdisc_bytes"]) / wall,
                    "cap": samples[i]["qdisc_rate"],
                }
            )
        i = j
    return out


def _ttft_ratio(summary: dict[str, Any]) -> float | None:
    for c in summary["checks"]:
        m = re.search(r"ttft p90 ([\d.]+)s \(bound ([\d.]+)s", c.get("detail", ""))
        if c["name"].startswith("ttft_") and m:
            return float(m.group(1)) / float(m.group(2))
    return None


@pytest.fixture(scope="module")
def emulator_summary(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same scenario and seed with the emulator shaping, on local: the verdicts tc runs are
    compared with."""
    proc, summary = _run(tmp_path_factory.mktemp("emulator"), "local", "emulator")
    assert "link shaper: emulator" in proc.stderr
    assert summary["link"]["shaper"] == "emulator" and summary["link"]["kernel"] is None
    return summary


@pytest.mark.parametrize("substrate", ["local", pytest.param("compose", marks=pytest.mark.compose)])
def test_bandwidth_drop_with_the_kernel_shaper(
    substrate: str, tmp_path: Path, emulator_summary: dict[str, Any]
) -> None:
    before = _namespaces()
    proc, tc_sum = _run(tmp_path / "tc", substrate, "tc")
    assert "link shaper: tc" in proc.stderr
    assert tc_sum["link"]["shaper"] == "tc"
    assert "Shaper: tc (kernel qdisc)" in (tmp_path / "tc" / "report.md").read_text()
    assert tc_sum["requests"]["failed"] == 0
    assert tc_sum["requests"]["completed"] == tc_sum["requests"]["submitted"] > 0

    history = [json.loads(line) for line in (tmp_path / "tc" / "history.jsonl").open()]
    kernel = tc_sum["link"]["kernel"]
    assert kernel["bytes"] > 0 and kernel["packets"] > 0 and kernel["overlimits"] > 0
    windows = rate_windows(history)
    drop = [w for w in windows if DROP[0] <= w["start"] and w["end"] <= DROP[1]]
    assert len(drop) >= 2, windows  # the drop is 6 s wall; compose reads at most once a second
    caps = {w["cap"] for w in drop}
    assert len(caps) == 1 and caps < {w["cap"] for w in windows if w["end"] < DROP[0]} | caps
    worst = max(w["rate"] / w["cap"] for w in windows)
    best_in_drop = max(w["rate"] / w["cap"] for w in drop)
    mean_in_drop = sum(w["rate"] for w in drop) / len(drop) / drop[0]["cap"]
    print(
        f"{substrate} tc: {len(windows)} windows; max rate/cap {worst:.3f}; during the drop "
        f"max {best_in_drop:.3f}, mean {mean_in_drop:.3f} of {drop[0]['cap'] / 1e6:.2f} MB/s"
    )
    assert worst <= 1.05
    assert best_in_drop >= 0.90

    emu_sum = emulator_summary
    verdicts = {c["name"]: c["verdict"] for c in tc_sum["checks"]}
    emulator = {c["name"]: c["verdict"] for c in emu_sum["checks"]}
    assert verdicts.keys() == emulator.keys()
    ratios = (_ttft_ratio(tc_sum), _ttft_ratio(emu_sum))
    print(f"{substrate}: verdicts tc {verdicts}; emulator {emulator}; ttft p90/bound {ratios}")
    tc_ratio = ratios[0]
    near_bound = tc_ratio is not None and abs(tc_ratio - 1.0) <= 0.10
    for name, verdict in emulator.items():
        if verdict != "ok" or (name.startswith("ttft_") and near_bound):
            continue
        assert verdicts[name] == "ok", (name, tc_sum["checks"], emu_sum["checks"])
    assert _namespaces() <= before  # the run's namespaces went with it
