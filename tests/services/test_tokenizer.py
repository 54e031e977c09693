"""The shipped tokenizer (issue #17 item 2): an HF tokenizer.json whose vocabulary is the tiny
torch model's, rebuilt byte for byte by its script, loadable by path with no network; the
emulated output text re-tokenizes to the count the router reports; block hashes chain."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tokenizers import Tokenizer

from testbed.engine.torch.config import TinyConfig
from testbed.kvcache import BLOCK_TOKENS
from testbed.services.router.text import TOKENIZER_DIR, TextCodec, block_hashes

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_tokenizer_has_the_tiny_models_vocabulary() -> None:
    tok = Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json"))
    assert tok.get_vocab_size() == TinyConfig().vocab_size == 512
    assert sorted(tok.get_vocab().values()) == list(range(512))
    text = "Any text at all: ünïcode, 数字 and \t tabs."
    assert tok.decode(tok.encode(text).ids) == text  # byte-level: nothing unknown
    config = json.loads((TOKENIZER_DIR / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert TOKENIZER_DIR.is_relative_to(ROOT / "testbed")  # package data, found by path


def test_the_build_script_rebuilds_the_shipped_file(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build_tokenizer.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / name).read_bytes() == (TOKENIZER_DIR / name).read_bytes(), name


def test_filler_text_counts_back_to_the_tokens_generated() -> None:
    codec = TextCodec()
    for start, n in ((0, 1), (3, 17), (60, 200)):
        assert len(codec.encode(codec.filler_text(start, n))) == n
    # streamed in chunks, the concatenation still counts the same
    chunks = [codec.filler_text(s, k) for s, k in ((0, 1), (1, 3), (4, 2))]
    assert len(codec.encode("".join(chunks))) == 6


def test_block_hashes_are_per_512_tokens_and_chained() -> None:
    ids = list(range(500)) * 3  # 1500 tokens: 2 whole blocks and a partial one
    h = block_hashes(ids)
    assert len(h) == 3 == -(-len(ids) // BLOCK_TOKENS)
    assert all(-(2**63) <= x < 2**63 for x in h)
    assert block_hashes(ids[:1024]) == h[:2]  # a shared prefix shares its hashes
    other = [7, *ids[1:]]
    assert block_hashes(other)[0] != h[0] and block_hashes(other)[1] != h[1]  # chained
    assert block_hashes([]) == ()
