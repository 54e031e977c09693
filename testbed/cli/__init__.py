"""The `testbed` command: one entry point, one subcommand per job (`python -m testbed.cli` too).

Each subcommand is a module of this package with an `add_parser(subparsers)` function (`plan`,
`run` and `scenarios`, `up`, `link`, `verify-model`, `policy-vectors`, ...), so this file only
wires them together. Every user error (bad config, bad arguments, a missing file) ends as one
line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from testbed import __version__
from testbed.cli.dispatch import dispatch

COMMANDS: dict[str, str] = {
    "plan": "plan",
    "run": "run",
    "scenarios": "run",
    "timeline": "timeline",
    "up": "up",
    "link": "link",
    "verify-model": "verify",
    "profile": "profile",
    "sweep": "sweep",
    "hindsight": "hindsight",
    "scorecard": "scorecard",
    "policy-vectors": "policy_vectors",
}
"""Each subcommand and the module of this package that adds it, in `--help`'s order. A command
line naming one imports only its module: a sim run then never loads what `up` or the live
runner need (aiohttp, the services), a third of its start-up."""


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser, or, given the command line, one holding only the subcommand it names
    (with the full one when it names none: `--help`, a typo)."""
    parser = argparse.ArgumentParser(
        prog="testbed",
        description="Live emulation testbed for cross-datacenter prefill/decode LLM serving.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    modules = list(dict.fromkeys(COMMANDS.values()))
    named = next((a for a in argv or () if not a.startswith("-")), None)
    if named in COMMANDS:
        modules = [COMMANDS[named]]
    for name in modules:
        importlib.import_module(f"testbed.cli.{name}").add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    return dispatch(build_parser(args).parse_args(args))
