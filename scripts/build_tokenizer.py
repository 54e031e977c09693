"""Build the tokenizer shipped in testbed/data/tokenizer/ (deterministic; no network).

    python scripts/build_tokenizer.py [--out testbed/data/tokenizer]

The tiny torch model (testbed.engine.torch) has a vocabulary of 512 ids and no tokenizer of its
own; clients that count tokens themselves (AIPerf, GuideLLM, the router's OpenAI surface) need
one whose ids are the model's. This writes an HF `tokenizer.json` (byte-level BPE: the 256 byte
symbols, one special token `<|endoftext|>` and 255 merges learned from the English text below,
so 512 ids exactly) plus `tokenizer_config.json`, so `tokenizers.Tokenizer.from_file` and
`transformers.AutoTokenizer.from_pretrained(DIR)` both load it by path.

Byte-level means every string encodes (no unknown token) and every id decodes. The corpus is
part of this file so the output depends on nothing else; rerunning it rewrites the same bytes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

VOCAB_SIZE = 512
"""The tiny model's vocabulary (testbed.engine.torch.config.TinyConfig.vocab_size)."""
EOS = "<|endoftext|>"

CORPUS = """
The testbed stands up emulated datacenters with prefill and decode workers, moves real KV
bytes across a shaped link, drives them with realistic workloads, injects faults on a timeline,
and reports whether the scheduler kept its promises. A request arrives at the router, which asks
the policy for a route; the prefill instance computes the prompt and sends its cache layer by
layer to the decode instance, which streams tokens back to the client. When the link between
the datacenters is slow or cut, the scheduler moves work to the local cluster. The model is a
hybrid of linear attention and full attention layers, and the time to first token grows with
the length of the prompt. Users read the report and the timeline to see how the system behaved
under load, how many requests met their service level objective, and what the throughput was.
This is the way we test what we build: with the same inputs, the same seeds and the same
checks every time, so that a change in the numbers is a change in the system and not in luck.
Engineers who run serving at scale want to know, before production, what happens when the
network between sites gets slow, when traffic bursts, and when a worker dies in the middle of
a long request. They measure latency and throughput, they compare one policy with another, and
they keep the results next to the code that produced them.
"""


def build() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS] * 8, trainer=trainer)
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise SystemExit(f"built {tok.get_vocab_size()} ids, want {VOCAB_SIZE}")
    return tok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="testbed/data/tokenizer", type=Path)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    build().save(str(args.out / "tokenizer.json"), pretty=False)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS,
        "bos_token": EOS,
        "unk_token": EOS,
        "model_max_length": 10_000_000,
        "clean_up_tokenization_spaces": False,
    }
    (args.out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"wrote {args.out}/tokenizer.json ({VOCAB_SIZE} ids) and tokenizer_config.json")


if __name__ == "__main__":
    main()
