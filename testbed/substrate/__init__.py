"""Substrates: where a deployment's services run (`local` processes, `compose` containers).

Every substrate implements testbed.substrate.base.Substrate; `make_substrate` picks one by the
name a run asks for. The substrates are imported only when asked for, so a local run does not
load the Docker SDK.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from testbed.errors import UserError

if TYPE_CHECKING:  # the base pulls in the link's client (aiohttp): a sim run never needs it
    from testbed.substrate.base import Substrate

__all__ = ["SUBSTRATES", "make_substrate"]

SUBSTRATES = ("local", "compose")


def make_substrate(name: str, log_dir: Path) -> Substrate:
    """The substrate `name`, its services logging under `log_dir`."""
    if name == "local":
        from testbed.substrate.local import LocalSubstrate

        return LocalSubstrate(log_dir)
    if name == "compose":
        from testbed.substrate.compose import ComposeSubstrate

        return ComposeSubstrate(log_dir)
    raise UserError(f"substrate {name!r} is not available; use 'local' or 'compose'")
