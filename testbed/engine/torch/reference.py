"""The single-process reference of a live `engine: torch` run, for the token_exact checker.

The checker (testbed.checkers.token_exact) compares; this recomputes: it rebuilds each prompt
from (scenario seed, request id, length) exactly as the router drew it (`live.prompt_ids`) and
generates greedily with the same tiny model in one process. Torch is imported by `prepare`, only
when the check runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from testbed.engine.torch import live

if TYPE_CHECKING:
    from testbed.engine.torch.model import TinyHybridLM

__all__ = ["TorchReference"]


class TorchReference:
    """testbed.checkers.TokenReference for a run of the tiny model."""

    def __init__(self, prompt_seed: int, model_seed: int = 0, dtype: str = "float32") -> None:
        self.prompt_seed = prompt_seed
        self.config = live.tiny_config(model_seed, dtype)
        self._model: TinyHybridLM | None = None

    def prepare(self) -> None:
        """Build the model (torch, one thread); ImportError with the install hint without it."""
        try:
            import torch

            from testbed.engine.torch.model import TinyHybridLM
        except ImportError:
            raise ImportError(live.MODEL_EXTRA_HINT) from None
        torch.set_num_threads(1)
        self._model = TinyHybridLM(self.config)

    def _prompt(self, request_id: str, n_tokens: int) -> list[int]:
        return live.prompt_ids(self.prompt_seed, request_id, n_tokens, self.config.vocab_size)

    def prompt_digest(self, request_id: str, n_tokens: int) -> str:
        return live.ids_digest(self._prompt(request_id, n_tokens))

    def generate(self, request_id: str, n_tokens: int, n_out: int) -> list[int]:
        from testbed.engine.torch.model import generate

        if self._model is None:
            self.prepare()
        assert self._model is not None
        return generate(self._model, self._prompt(request_id, n_tokens), n_out)
