"""What KV transfer costs in CPU on each side: seconds per GB for the sender and the receiver,
checksums on (CRC32C), over loopback, and the MB/s it reached.

CPU, not wall: the machine is shared, so wall throughput follows the other jobs more than the
code. Each round runs one child per checkout (this file's `--child` mode, with PYTHONPATH set to
the checkout): a receiver process (spawned, as decode instances are their own processes) and a
sender in the child, `--mib` MiB of 32 MiB requests of 61 layers, 4 in flight, over
`--connections` connections, 256 KiB frames; each side reads its own process CPU
(time.process_time) over the transfer.

`--src DIR` (repeatable) also runs another checkout, interleaved with this one round by round so
a before/after pair sees the same load; the median of `--repeat` rounds is printed per checkout.

    python bench/transfer_cpu.py [--repeat 5] [--src /tmp/before] \\
        [--report bench/reports/transfer.md]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"


def child(mib: int, connections: int) -> None:
    """One measurement with whatever `testbed` is first on the path; prints one JSON line."""
    sys.path.insert(0, str(BENCH))
    import transfer_throughput as tt

    from testbed.transfer import ChecksumAlgo, PayloadSource

    with tt.receiver(True) as (parent, port):
        n = max(1, (mib << 20) // tt.REQUEST_BYTES)
        ids = [f"cpu-{i}" for i in range(n)]
        parent.send(ids)
        assert parent.recv() == "ready"
        source = PayloadSource(64 << 20, seed=0)
        wall, sender_cpu = tt._run(
            tt._send_batch(port, connections, ChecksumAlgo.CRC32C, ids, source), True
        )
        received, receiver_cpu = parent.recv()
        assert received == n * tt.REQUEST_BYTES, received
    gb = received / 1e9
    print(
        json.dumps(
            {
                "sender_s_per_gb": sender_cpu / gb,
                "receiver_s_per_gb": receiver_cpu / gb,
                "mb_s": received / wall / 1e6,
            }
        )
    )


def one(src: Path, args: argparse.Namespace) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(src))
    out = subprocess.run(
        [sys.executable, __file__, "--child", "--mib", str(args.mib),
         "--connections", str(args.connections)],
        cwd=src, env=env, capture_output=True, text=True, timeout=600, check=True,
    ).stdout  # fmt: skip
    return dict(json.loads(out.strip().splitlines()[-1]))


def run(
    srcs: list[Path], args: argparse.Namespace, repeat: int
) -> dict[str, list[dict[str, float]]]:
    """`repeat` rounds, each measuring every checkout in turn (who goes first alternates)."""
    results: dict[str, list[dict[str, float]]] = {str(s): [] for s in srcs}
    for r in range(repeat):
        for src in srcs if r % 2 == 0 else srcs[::-1]:
            results[str(src)].append(one(src, args))
            print(f"round {r + 1} {src}: {results[str(src)][-1]}", file=sys.stderr, flush=True)
    return results


FIGURES = {
    "sender_s_per_gb": ("sender CPU s per GB", "{:.3f}"),
    "receiver_s_per_gb": ("receiver CPU s per GB", "{:.3f}"),
    "mb_s": ("wall MB/s", "{:.0f}"),
}
"""Figure key -> (label, format), in the table's order (provenance.checkout_table)."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--mib", type=int, default=768)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--src", action="append", default=[], help="another checkout to run")
    parser.add_argument("--report", type=Path, help="replace this file's transfer_cpu section")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.mib, args.connections)
        return 0
    sys.path.insert(0, str(BENCH))
    from provenance import checkout_table, provenance, write_section

    load = os.getloadavg()
    results = run([ROOT, *(Path(s).resolve() for s in args.src)], args, args.repeat)
    lines = checkout_table(results, FIGURES)
    head = provenance(
        "bench/transfer_cpu.py",
        sys.argv[1:],
        load,
        f"KV sender -> receiver (own process) over 127.0.0.1, CRC32C, {args.connections} "
        f"connections, {args.mib} MiB a round; median of {args.repeat} interleaved rounds",
    )
    text = head + "\n" + "\n".join(lines) + "\n"
    print(text)
    if args.report is not None:
        write_section(args.report, "transfer_cpu", "CPU per GB on each side", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
