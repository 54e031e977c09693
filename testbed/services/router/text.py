"""Text in and out of the router's OpenAI surface: the shipped tokenizer, prompt block hashes and
the emulated engine's output words.

They live in services.tokenizer, below both OpenAI fronts, so a tokenizing worker process
(services.tokenize_pool) loads them without loading the router; the names stay importable from
here for the router's output text and for the callers that already import them (the load
generator, the CLI, tests).
"""

from __future__ import annotations

from testbed.services.tokenizer import TOKENIZER_DIR, TextCodec, block_hashes, codec

__all__ = ["TOKENIZER_DIR", "TextCodec", "block_hashes", "codec"]
