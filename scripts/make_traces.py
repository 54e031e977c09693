"""Generate the small Mooncake-format traces shipped in scenarios/traces/ (deterministic).

    python scripts/make_traces.py [--source ../shared/traces/mooncake_synthetic_trace.jsonl]

- mooncake-small.jsonl: the first 300 requests of the Mooncake FAST'25 synthetic trace
  (kvcache-ai/Mooncake, Apache-2.0), timestamps, lengths and hash ids unchanged; the
  `mooncake-trace` scenario replays it (or the full trace, with `testbed run --trace PATH`).
- cache-skew.jsonl: 400 requests whose prompts start with one of 8 shared documents picked with
  Zipf-like skew (the hottest is about half of all requests), then a unique suffix; 512-token
  blocks as in Mooncake. The `cache-skew` scenario replays its content under controlled load.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "scenarios" / "traces"
BLOCK = 512


def mooncake_small(source: Path, n: int = 300) -> list[dict[str, object]]:
    lines = [line for line in source.read_text().splitlines() if line.strip()][:n]
    return [json.loads(line) for line in lines]


def cache_skew(n: int = 400, docs: int = 8, seed: int = 11) -> list[dict[str, object]]:
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, docs + 1) ** 1.2
    weights /= weights.sum()
    doc_blocks = [int(b) for b in rng.integers(20, 80, size=docs)]
    next_id = sum(doc_blocks)
    starts = np.cumsum([0, *doc_blocks[:-1]])
    t = 0.0
    out: list[dict[str, object]] = []
    for _ in range(n):
        t += float(rng.exponential(500.0))  # ms; 2 requests/s before rescaling
        d = int(rng.choice(docs, p=weights))
        suffix = int(rng.integers(1, 12))
        ids = list(range(int(starts[d]), int(starts[d]) + doc_blocks[d]))
        ids += list(range(next_id, next_id + suffix))
        next_id += suffix
        length = (len(ids) - 1) * BLOCK + int(rng.integers(1, BLOCK + 1))
        out.append(
            {
                "timestamp": round(t),
                "input_length": length,
                "output_length": int(rng.integers(64, 512)),
                "hash_ids": ids,
            }
        )
    return out


def _write(path: Path, docs: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(d, separators=(", ", ": ")) + "\n" for d in docs))
    print(f"{path.relative_to(ROOT)}: {len(docs)} requests")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--source",
        type=Path,
        default=ROOT.parent / "shared" / "traces" / "mooncake_synthetic_trace.jsonl",
    )
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    _write(OUT / "mooncake-small.jsonl", mooncake_small(args.source))
    _write(OUT / "cache-skew.jsonl", cache_skew())


if __name__ == "__main__":
    main()
