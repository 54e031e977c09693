"""`testbed link ...` subcommands: run the emulator, and shape a namespace pair with tc.

    testbed link serve [--host H] [--port P] [--config FILE] [--seed N]
    testbed link tc up|rate|show|down ...   (down --stale: what killed runs left behind)

Each subcommand sets `func(args) -> exit code`; mistakes a person can fix raise UserError,
which the main CLI prints as one line (exit code 2).

`python -m testbed.cli.link serve ...` runs these without the rest of the CLI, whose parser
imports every subcommand (about 2 CPU seconds): the local substrate starts its emulator so.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Sequence
from typing import Any

from testbed.errors import UserError
from testbed.units import UnitError, parse_bandwidth

__all__ = ["add_parser", "main"]


def _run_serve(args: argparse.Namespace) -> int:
    from testbed.lifeline import die_with_parent
    from testbed.link.server import serve

    die_with_parent()  # started by a runner: never outlive it (testbed.lifeline)
    coro = serve(
        args.host, args.port, seed=args.seed, config=args.config, listen_netns=args.listen_netns
    )
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(coro)
    else:
        uvloop.run(coro)
    return 0


def _bandwidth(text: str) -> float:
    try:
        rate = parse_bandwidth(text)
    except UnitError as exc:
        raise UserError(f"--rate: {exc}") from None
    if rate <= 0:
        raise UserError(f"--rate must be positive, got {text!r}")
    return rate


def _run_tc_up(args: argparse.Namespace) -> int:
    from testbed.link import tc

    pair = tc.create_pair(
        args.name,
        rate=_bandwidth(args.rate) if args.rate else None,
        qdisc=args.qdisc,
        both=not args.one_way,
        goodput=not args.wire,
    )
    print(pair.describe())
    return 0


def _run_tc_rate(args: argparse.Namespace) -> int:
    from testbed.link import tc

    rate = _bandwidth(args.rate)
    pair = tc.existing_pair(args.name)
    pair.set_rate(rate, qdisc=args.qdisc, both=not args.one_way, goodput=not args.wire)
    print(f"{pair.name}: rate {args.rate}")
    return 0


def _run_tc_show(args: argparse.Namespace) -> int:
    from testbed.link import tc

    print(tc.existing_pair(args.name).show())
    return 0


def _run_tc_down(args: argparse.Namespace) -> int:
    from testbed.link import tc

    removed = tc.teardown(args.name, all_mine=args.all, stale=args.stale)
    print("removed: " + (", ".join(removed) if removed else "nothing"))
    return 0


def _help(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    def show(args: argparse.Namespace) -> int:
        parser.print_help()
        return 0

    return show


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "link", help="the cross-datacenter link emulator (Toxiproxy-compatible) and tc shaping"
    )
    p.set_defaults(func=_help(p))
    lsub = p.add_subparsers(dest="link_command", metavar="SUBCOMMAND")

    s = lsub.add_parser("serve", help="run the emulator (Toxiproxy 2.x HTTP API)")
    s.add_argument("--host", default="127.0.0.1", help="API address (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=8474, help="API port (default 8474; 0 = any)")
    s.add_argument("--config", help="Toxiproxy JSON file of proxies to create at start")
    s.add_argument("--seed", type=int, help="seed for jitter and toxicity (reproducible runs)")
    s.add_argument(
        "--listen-netns",
        metavar="NS",
        help="proxies listen inside this network namespace (a kernel-shaped link, shaper tc)",
    )
    s.set_defaults(func=_run_serve)

    t = lsub.add_parser("tc", help="kernel shaping: namespaces joined by a veth pair (root)")
    t.set_defaults(func=_help(t))
    tsub = t.add_subparsers(dest="tc_command", metavar="ACTION")

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--name", default="link", help="pair name (namespaces tbl-<name>-a/-b)")
        q.add_argument("--qdisc", choices=("htb", "tbf"), default="htb", help="shaper")
        q.add_argument(
            "--one-way", action="store_true", help="shape a->b only (default: both directions)"
        )
        q.add_argument(
            "--wire",
            action="store_true",
            help="rate counts wire bytes (default: TCP payload, as the emulator counts)",
        )

    up = tsub.add_parser("up", help="create namespaces tbl-<name>-a/-b, veth and shaping")
    common(up)
    up.add_argument("--rate", help='bandwidth, e.g. "100Mbps" (omit for unshaped)')
    up.set_defaults(func=_run_tc_up)

    rate = tsub.add_parser("rate", help="change the rate of an existing pair at run time")
    common(rate)
    rate.add_argument("--rate", required=True, help='bandwidth, e.g. "10Mbps"')
    rate.set_defaults(func=_run_tc_rate)

    show = tsub.add_parser("show", help="addresses and qdisc statistics of a pair")
    show.add_argument("--name", default="link")
    show.set_defaults(func=_run_tc_show)

    down = tsub.add_parser("down", help="delete the namespaces of a pair")
    down.add_argument("--name", default="link")
    which = down.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true", help="every tbl-* namespace this tool made")
    which.add_argument(
        "--stale",
        action="store_true",
        help="the namespaces of runs whose process is gone (tbl-r<pid>-*, killed or crashed)",
    )
    down.set_defaults(func=_run_tc_down)


def main(argv: Sequence[str] | None = None) -> int:
    """`testbed link ARGS` with only this subcommand's parser."""
    from testbed.cli.dispatch import dispatch

    parser = argparse.ArgumentParser(prog="testbed")
    add_parser(parser.add_subparsers(dest="command"))
    return dispatch(parser.parse_args(["link", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
    sys.exit(main())
