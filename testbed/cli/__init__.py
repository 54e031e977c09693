"""The `testbed` command: one entry point, one subcommand per job (`python -m testbed.cli` too).

Each subcommand is a module of this package with an `add_parser(subparsers)` function (`plan`,
`run` and `scenarios`, `up`, `link`, `verify-model`, `policy-vectors`, ...), so this file only
wires them together. Every user error (bad config, bad arguments, a missing file) ends as one
line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence

from testbed import __version__
from testbed.errors import UserError


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


def dispatch(args: argparse.Namespace) -> int:
    """Run a parsed subcommand: a UserError is one line and exit 2, never a traceback."""
    try:
        rc: int = args.func(args)
    except UserError as exc:
        print(f"testbed: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("testbed: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `testbed scenarios | head`: the reader left; not an error of ours
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return rc
