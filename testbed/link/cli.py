"""`testbed link ...` subcommands (placeholder until the link emulator lands)."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("link", help="the cross-datacenter link emulator")
    p.set_defaults(func=lambda args: (p.print_help(), 0)[1])
