"""The `testbed` command: one entry point, one subcommand per job (`python -m testbed.cli` too).

Each subcommand is a module of this package with an `add_parser(subparsers)` function (`plan`,
`run` and `scenarios`, `up`, `link`, `verify-model`, `policy-vectors`, ...), so this file only
wires them together. Every user error (bad config, bad arguments, a missing file) ends as one
line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from testbed import __version__
from testbed.cli.dispatch import dispatch


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="testbed",
        description="Live emulation testbed for cross-datacenter prefill/decode LLM serving.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    from testbed.cli import (
        hindsight,
        link,
        plan,
        policy_vectors,
        profile,
        run,
        scorecard,
        sweep,
        up,
        verify,
    )

    plan.add_parser(sub)
    run.add_parser(sub)
    up.add_parser(sub)
    link.add_parser(sub)
    verify.add_parser(sub)
    profile.add_parser(sub)
    sweep.add_parser(sub)
    hindsight.add_parser(sub)
    scorecard.add_parser(sub)
    policy_vectors.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return dispatch(build_parser().parse_args(argv))
