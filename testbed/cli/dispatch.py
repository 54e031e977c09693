"""Run a parsed `testbed` subcommand the way every entry point does: a UserError is one line
and exit 2, never a traceback (the whole CLI, and `python -m testbed.cli.link`)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from testbed.errors import UserError

__all__ = ["dispatch"]


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
