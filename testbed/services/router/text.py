"""Text in and out of the OpenAI surface: the shipped tokenizer, prompt block hashes, output text.

The tokenizer is the one `scripts/build_tokenizer.py` builds and the package ships in
`testbed/data/tokenizer/` (byte-level BPE, 512 ids: the tiny torch model's vocabulary). Clients
that count tokens themselves (AIPerf, GuideLLM) load the same directory by path
(`TOKENIZER_DIR`), so their counts and the router's `usage` agree.

Text prompts get prefix-cache block hashes from their token ids, one per 512-token block
(kvcache.BLOCK_TOKENS, as vLLM's prefix caching blocks them), each hash chained on the previous
block's as vLLM chains them: two prompts share the hashes of exactly their common whole-block
prefix, so a client replaying a Mooncake trace as text exercises the prefix cache.

Output text of the emulated engine (which generates counts, not words) is a cycle of whole-word
tokens chosen so that decoding n of them and encoding the text again gives n tokens back: a
client that counts output tokens from the text counts what the router counted.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from tokenizers import Tokenizer

from testbed.kvcache import BLOCK_TOKENS

__all__ = ["TOKENIZER_DIR", "TextCodec", "block_hashes", "codec"]

TOKENIZER_DIR = Path(str(resources.files("testbed") / "data" / "tokenizer"))
"""The shipped tokenizer's directory (tokenizer.json, tokenizer_config.json)."""

_FILLER_MAX = 64
"""Whole-word tokens the emulated output cycles through."""


def block_hashes(ids: Sequence[int], block: int = BLOCK_TOKENS) -> tuple[int, ...]:
    """One signed 64-bit hash per `block`-token block of `ids` (the last may be partial), each
    over the previous block's hash and this block's ids, so equal hashes mean equal prefixes."""
    out: list[int] = []
    parent = b""
    for start in range(0, len(ids), block):
        h = hashlib.blake2b(digest_size=8)
        h.update(parent)
        h.update(b"".join(int(t).to_bytes(4, "little") for t in ids[start : start + block]))
        parent = h.digest()
        out.append(int.from_bytes(parent, "little", signed=True))
    return tuple(out)


class TextCodec:
    """The shipped tokenizer, and the emulated engine's output words."""

    def __init__(self, path: Path = TOKENIZER_DIR / "tokenizer.json") -> None:
        self.tokenizer = Tokenizer.from_file(str(path))
        self.vocab_size = self.tokenizer.get_vocab_size()
        self.filler = self._filler()

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def filler_text(self, start: int, n: int) -> str:
        """The emulated engine's output tokens start .. start + n - 1 as text."""
        words = self.filler
        return "".join(words[(start + i) % len(words)] for i in range(n))

    def _filler(self) -> list[str]:
        """Words (" the", " link", ...) that each encode to one id, alone and in sequence."""
        words = []
        for token, _id in sorted(self.tokenizer.get_vocab().items(), key=lambda kv: kv[1]):
            word = self.tokenizer.decode([_id])
            if (
                token.startswith("Ġ")
                and len(word) > 2
                and word[1:].isalpha()
                and len(self.encode(word)) == 1
            ):
                words.append(word)
            if len(words) == _FILLER_MAX:
                break
        if not words or len(self.encode("".join(words))) != len(words):
            raise RuntimeError("the shipped tokenizer has no whole-word tokens to emit")
        return words


@functools.cache
def codec() -> TextCodec:
    """The shipped tokenizer, loaded once per process (a read-only table, not run state)."""
    return TextCodec()
