"""Issue #35's link-emulator and KV-transfer targets, measured and judged on this host.

bench/sim_targets.py's `--live` runs these after its simulation rounds, so one command prints
every figure the issue asks for; `python bench/live_targets.py` runs them alone:

- the link emulator's CPU per 64-byte round trip with no toxics and per GB unshaped
  (bench/link_cpu.py's rounds: the emulator as its own process, with bench/floor_relay.py,
  the least any user-space relay pays the kernel, in the same rounds), and its unshaped rate
  against raw loopback TCP in the same round;
- the emulator's bandwidth error at 1, 10, 100 and 1,000 Mbit/s over 1 and 8 connections
  (bench/link_accuracy.py's first section);
- KV transfer's CPU per GB on the sender and the receiver with CRC32C on, and its MB/s, over
  4 connections (bench/transfer_cpu.py's rounds);
- the decode's KV receiver under bench/receiver_flood.py's three floods.

The issue's cuts ("each cut by >= 30%") compare this checkout with one from before the issue:
`--before DIR` (made with `git worktree add DIR ca12367`, the last commit before issue #35's
work) runs interleaved with this checkout, round by round. Without it, only the issue's
absolute alternatives are judged (unshaped >= 75% of raw loopback, >= 700 MB/s at 4
connections) and the cuts are printed as not judged.

    python bench/live_targets.py [--repeat 5] [--before /tmp/before]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import link_accuracy  # bench/ is on sys.path
import link_cpu
import transfer_cpu
from provenance import checkout_table

ROOT = Path(__file__).resolve().parents[1]
CUT = 0.30
"""The issue's cut: each CPU figure at most 70% of the one before."""
OF_RAW = 0.75
"""... or the emulator's unshaped rate at least this share of raw loopback."""
KV_MB_S = 700.0
"""... or KV transfer at least this many MB/s at 4 connections."""
BANDWIDTH_ERROR = 0.01
FLOOD_MIB = 16

Judged = tuple[str, str, bool | None]
"""(target, this host's figure, met; None: not judged here)."""


@dataclass
class LiveFigures:
    """Every round of every live figure, per checkout (this one first, then `--before`)."""

    link: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    kv: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    bandwidth: dict[tuple[int, int], float] = field(default_factory=dict)
    """(configured Mbit/s, connections) -> achieved Mbit/s, this checkout's emulator."""
    floods: dict[str, object] = field(default_factory=dict)
    """bench/receiver_flood.py's summary line (emulated decode)."""


def measure(repeat: int, before: Path | None, rtts: int, mib: int, kv_mib: int) -> LiveFigures:
    """Every live figure: `repeat` interleaved rounds of the link's and the KV path's CPU (this
    checkout and `before`), then one bandwidth sweep and one set of floods on this checkout."""
    srcs = [ROOT] + ([before.resolve()] if before is not None else [])
    out = LiveFigures()
    print(f"the link emulator's CPU, {repeat} rounds", flush=True)
    link_args = argparse.Namespace(repeat=repeat, src=srcs[1:], rtts=rtts, mib=mib, shaped=0.0)
    out.link = link_cpu.run(link_args)
    link_cpu.add_ratios(out.link)
    print(f"KV transfer's CPU, {repeat} rounds", flush=True)
    out.kv = transfer_cpu.run(srcs, argparse.Namespace(mib=kv_mib, connections=4), repeat)
    print("the emulator's bandwidth, 1 Mbit/s to 1 Gbit/s", flush=True)
    with link_accuracy.emulator_process(ROOT) as (url, _):
        out.bandwidth = link_accuracy.bandwidth_emulator(url)
    print("the KV receiver under floods", flush=True)
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench/receiver_flood.py")], cwd=ROOT,
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    out.floods = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def _median(rounds: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rounds)


def _cut(now: float, then: float | None) -> str:
    return "" if then is None else f" against {then:.3g} ({now / then - 1:+.0%})"


def verdicts(fig: LiveFigures) -> list[Judged]:
    """The issue's live targets, each with this host's figure."""
    mine, *others = fig.link
    link, link_before = fig.link[mine], fig.link[others[0]] if others else None
    kv, kv_before = fig.kv[mine], fig.kv[others[0]] if others else None
    out: list[Judged] = []

    rtt = _median(link, "rtt_us")
    rtt_then = _median(link_before, "rtt_us") if link_before else None
    out.append((
        "link emulator, CPU µs per round trip with no toxics cut by >= 30%",
        f"{rtt:.1f} µs{_cut(rtt, rtt_then)}; the floor relay {_median(link, 'floor_rtt_us'):.1f}",
        None if rtt_then is None else rtt <= (1 - CUT) * rtt_then,
    ))  # fmt: skip
    gb, of_raw = _median(link, "s_per_gb"), _median(link, "of_raw")
    gb_then = _median(link_before, "s_per_gb") if link_before else None
    out.append((
        "link emulator, CPU s per GB unshaped cut by >= 30%, or unshaped >= 75% of raw loopback",
        f"{gb:.3f} s{_cut(gb, gb_then)}; unshaped {of_raw:.0%} of raw",
        of_raw >= OF_RAW or (gb_then is not None and gb <= (1 - CUT) * gb_then),
    ))  # fmt: skip
    errors = {k: v / k[0] - 1 for k, v in fig.bandwidth.items()}
    worst = max(errors, key=lambda k: abs(errors[k]))
    out.append((
        "link emulator, bandwidth error <= 1% from 1 Mbit/s to 1 Gbit/s (1 and 8 connections)",
        f"worst {errors[worst]:+.2%} ({worst[0]} Mbit/s, {worst[1]} conn)",
        abs(errors[worst]) <= BANDWIDTH_ERROR,
    ))  # fmt: skip
    sides = ("sender_s_per_gb", "receiver_s_per_gb")
    now = {s: _median(kv, s) for s in sides}
    then = {s: _median(kv_before, s) if kv_before else None for s in sides}
    rate = _median(kv, "mb_s")
    cut = all(t is not None and now[s] <= (1 - CUT) * t for s, t in then.items())
    out.append((
        "KV transfer (CRC32C), CPU s per GB on each side cut by >= 30%, or >= 700 MB/s at 4 "
        "connections",
        f"sender {now[sides[0]]:.3f} s{_cut(now[sides[0]], then[sides[0]])}, receiver "
        f"{now[sides[1]]:.3f} s{_cut(now[sides[1]], then[sides[1]])}; {rate:.0f} MB/s",
        rate >= KV_MB_S or cut,
    ))  # fmt: skip
    over = fig.floods.get("floods_over_16MiB")
    out.append((
        f"KV receiver, each of bench/receiver_flood.py's floods grows RSS < {FLOOD_MIB} MiB",
        f"{over} floods over",
        over == 0,
    ))  # fmt: skip
    return out


def tables(fig: LiveFigures) -> str:
    """The rounds behind the verdicts, per checkout."""
    parts = ["The link emulator (bench/link_cpu.py's figures), median per checkout:\n"]
    parts += [link_cpu.table(fig.link)]
    parts += ["", "KV transfer, 4 connections, CRC32C (bench/transfer_cpu.py's figures):\n"]
    parts += checkout_table(fig.kv, transfer_cpu.FIGURES)
    parts += ["", "The emulator's bandwidth (Mbit/s, achieved):\n",
              "| configured | connections | achieved | error |", "|---|---|---|---|"]  # fmt: skip
    parts += [f"| {m} | {n} | {v:.2f} | {v / m - 1:+.2%} |" for (m, n), v in fig.bandwidth.items()]
    parts += ["", f"The KV receiver under floods: `{json.dumps(fig.floods)}`"]
    return "\n".join(parts) + "\n"


def add_options(ap: argparse.ArgumentParser) -> None:
    """The live figures' options, shared with bench/sim_targets.py."""
    ap.add_argument("--before", type=Path, help="a checkout from before issue #35, for the cuts")
    # the CPU is read in 10 ms clock ticks (link_cpu.cpu_ns): 100,000 round trips of ~15 us
    # are ~150 ticks, where link_cpu.py's default of 20,000 left a tick at 3% of the figure
    ap.add_argument("--rtts", type=int, default=100_000, help="round trips a round")
    ap.add_argument("--mib", type=int, default=1024, help="MiB pushed unshaped a round")
    ap.add_argument("--kv-mib", type=int, default=768, help="MiB of KV a round")


def check_options(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.before is not None and not (args.before / "testbed").is_dir():
        ap.error(f"--before {args.before}: not a checkout of this project (no testbed/ in it)")
    if min(args.rtts, args.mib, args.kv_mib) < 1:
        ap.error("--rtts, --mib and --kv-mib must be at least 1")


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeat", type=int, default=5, help="rounds of the CPU figures")
    add_options(ap)
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    check_options(ap, args)
    fig = measure(args.repeat, args.before, args.rtts, args.mib, args.kv_mib)
    found = verdicts(fig)
    for target, figure, met in found:
        print(f"{'not judged' if met is None else 'met' if met else 'NOT met':>10}  {target}: "
              f"{figure}")  # fmt: skip
    print(tables(fig))
    return 0


if __name__ == "__main__":
    sys.exit(main())
