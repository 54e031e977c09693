"""The shipped tokenizer, prompt block hashes, and the emulated engine's output words.

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

This module sits below both OpenAI fronts (services.router, services.facade) and imports only
the tokenizer library, so a tokenizing worker process (services.tokenize_pool) loads it without
loading the router. `measure_text` is what such a worker runs: it encodes a long prompt in
pieces cut where the tokenizer's pre-tokenizer cuts anyway (the ids are exactly the whole text's),
so a worker's memory is one piece's, not the prompt's (~430 bytes per token in the tokenizer),
and it stops counting past a cap.
"""

from __future__ import annotations

import array
import functools
import hashlib
import sys
from collections.abc import Iterator, Sequence
from importlib import resources
from pathlib import Path

from tokenizers import Tokenizer

from testbed.kvcache import BLOCK_TOKENS

__all__ = [
    "CHUNK_CHARS",
    "TOKENIZER_DIR",
    "BlockHasher",
    "TextCodec",
    "block_hashes",
    "codec",
    "measure_text",
    "pieces",
]

TOKENIZER_DIR = Path(str(resources.files("testbed") / "data" / "tokenizer"))
"""The shipped tokenizer's directory (tokenizer.json, tokenizer_config.json)."""

_FILLER_MAX = 64
"""Whole-word tokens the emulated output cycles through."""

CHUNK_CHARS = 1 << 16
"""Characters `measure_text` encodes at a time (about 30 MB of tokenizer memory)."""

_CUT_AFTER = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_CUT_BEFORE = frozenset(chr(c) for c in range(33, 127))
"""A piece may end on a printable ASCII character (never whitespace) and the next start with a
space and one of _CUT_AFTER."""
assert array.array("I").itemsize == 4, "block hashes pack token ids as 4-byte integers"


class BlockHasher:
    """`block_hashes` fed piece by piece: only the last partial block's ids are kept."""

    def __init__(self, block: int = BLOCK_TOKENS) -> None:
        self.block = block
        self.hashes: list[int] = []
        self._parent = b""
        self._pending = array.array("I")

    def add(self, ids: Sequence[int]) -> BlockHasher:
        """Hash every whole block the ids complete (OverflowError: an id outside 0..2^32-1)."""
        self._pending.extend(array.array("I", ids))
        whole = len(self._pending) // self.block * self.block
        if whole:
            self._hash(self._pending[:whole])
            del self._pending[:whole]
        return self

    def done(self) -> tuple[int, ...]:
        """Every block's hash, the last (partial) block's included."""
        if self._pending:
            self._hash(self._pending)
            self._pending = array.array("I")
        return tuple(self.hashes)

    def _hash(self, ids: array.array[int]) -> None:
        if sys.byteorder != "little":
            ids = array.array("I", ids)
            ids.byteswap()
        data = memoryview(ids).cast("B")
        step = 4 * self.block
        for start in range(0, len(data), step):
            h = hashlib.blake2b(digest_size=8)
            h.update(self._parent)
            h.update(data[start : start + step])
            self._parent = h.digest()
            self.hashes.append(int.from_bytes(self._parent, "little", signed=True))


def block_hashes(ids: Sequence[int], block: int = BLOCK_TOKENS) -> tuple[int, ...]:
    """One signed 64-bit hash per `block`-token block of `ids` (the last may be partial), each
    over the previous block's hash and this block's ids (4 bytes each, little-endian), so equal
    hashes mean equal prefixes."""
    return BlockHasher(block).add(ids).done()


def pieces(text: str, size: int = CHUNK_CHARS) -> Iterator[str]:
    """`text` in pieces of about `size` characters, each cut before a space that follows a
    printable ASCII character and precedes an ASCII letter or digit: the byte-level
    pre-tokenizer (GPT-2's pattern) starts a new pre-token there whatever follows, and BPE
    never merges across pre-tokens, so the pieces' ids, concatenated, are the whole text's.
    A text with no such place (no spaces) is one piece."""
    start = 0
    n = len(text)
    while n - start > size:
        cut = text.find(" ", start + size)
        while cut != -1 and not _safe_cut(text, cut):
            cut = text.find(" ", cut + 1)
        if cut == -1:
            break
        yield text[start:cut]
        start = cut
    yield text[start:]


def _safe_cut(text: str, i: int) -> bool:
    return i + 1 < len(text) and text[i + 1] in _CUT_AFTER and text[i - 1] in _CUT_BEFORE


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


def measure_text(text: str, cap: int) -> tuple[int, tuple[int, ...]]:
    """A text prompt's token count and block hashes; past `cap` tokens it stops and returns
    the count so far (more than `cap`) and no hashes. An empty prompt counts one token (id 0):
    it still prefills one. Returns only numbers, so little crosses a worker's pipe."""
    enc = codec()
    hasher = BlockHasher()
    n = 0
    for piece in pieces(text, CHUNK_CHARS):
        ids = enc.encode(piece)
        n += len(ids)
        if n > cap:
            return n, ()
        hasher.add(ids)
    if n == 0:
        hasher.add([0])
        n = 1
    return n, hasher.done()
