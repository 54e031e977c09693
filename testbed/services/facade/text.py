"""The shipped tokenizer and the emulated output text, for the router-facing API.

They are our router's (services.router.text), imported when a worker with a facade builds its
app rather than at import time: the router package imports the prefill and decode modules
(through services.pd), which import this package.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from testbed.services.spec import ServiceSpec

__all__ = ["Codec", "check_engine", "codec", "tokenizer_dir"]


class Codec(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def filler_text(self, start: int, n: int) -> str: ...


def codec() -> Codec:
    """The shipped tokenizer, loaded once per process."""
    from testbed.services.router.text import codec as router_codec

    return router_codec()


def tokenizer_dir() -> Path:
    """Where the shipped tokenizer lies: the `model_path` the gateway loads it from."""
    from testbed.services.router.text import TOKENIZER_DIR

    return TOKENIZER_DIR


def check_engine(spec: ServiceSpec) -> None:
    """The router-facing API serves the emulated engine only, so far: the torch engine's first
    token travels through our router (the control path), which an external router does not."""
    if spec.engine != "emulated":
        raise ValueError(
            f"{spec.id}: the router-facing API (facade: {spec.facade}) runs the emulated engine "
            f"only, not {spec.engine!r}"
        )
