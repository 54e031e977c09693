"""Substrates: where a deployment's services run (`local` processes, `compose` containers).

Every substrate that starts services implements testbed.substrate.base.Substrate; which ones
there are, what each supports and where its class lives are its entry in testbed.substrates
(the `sim`, which starts none, is an entry there too). `make_substrate` makes the one a run asks
for, importing its module only then, so a local run does not load the Docker SDK.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from testbed.errors import UserError
from testbed.substrates import load_attr, substrate_facts, substrates_with

if TYPE_CHECKING:  # the base pulls in the link's client (aiohttp): a sim run never needs it
    from testbed.substrate.base import Substrate

__all__ = ["SUBSTRATES", "make_substrate"]

SUBSTRATES = substrates_with(lambda s: s.services is not None)
"""The substrates that start services (`make_substrate` makes them)."""


def make_substrate(name: str, log_dir: Path) -> Substrate:
    """The substrate `name`, its services logging under `log_dir`."""
    services = substrate_facts(name).services
    if services is None:
        raise UserError(
            f"substrate {name!r} starts no services; use one of {', '.join(SUBSTRATES)}"
        )
    made: Substrate = load_attr(services)(log_dir)
    return made
