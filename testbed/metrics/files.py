"""Result files that survive whatever ends the run.

Two kinds of writing, for two kinds of file:

- `Journal`: append-only JSON lines, one line per record, flushed as each is written, so a run
  killed by SIGKILL (or a crash) still leaves every record that ended before it, minus at most
  the line being written. requests.jsonl and history.jsonl are journals while a run goes on.
- `atomic_write` / `atomic_path`: whole files (summary.json, report.md, timeline.png, and the
  final, ordered requests.jsonl) written to a temporary file beside the target and renamed over
  it, so a reader never sees half a file: the old version or the new one.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

__all__ = ["Journal", "atomic_path", "atomic_write", "jsonl_line", "write_jsonl_atomic"]

_ENCODER = json.JSONEncoder(separators=(",", ":"), check_circular=False)
_MAKE_ENCODER: Any = getattr(json.encoder, "c_make_encoder", None)  # not in typeshed
_C_ENCODE = (
    None
    if _MAKE_ENCODER is None
    else _MAKE_ENCODER(
        None,  # no circular check: a results line is a flat document
        _ENCODER.default,
        json.encoder.encode_basestring_ascii,
        None,
        _ENCODER.key_separator,
        _ENCODER.item_separator,
        False,
        False,
        True,
    )
)
"""json.dumps(doc, separators=(",", ":")) as _json's C encoder, made once: JSONEncoder.encode
makes a new one (and a float formatter) per call, a quarter of encoding a record, and the
10K-GPU hour encodes 1.8 million lines. The same bytes (tests/metrics/test_stream.py)."""


def jsonl_line(doc: dict[str, Any]) -> str:
    """One line of a JSON-lines results file: compact, as every such file is written."""
    if _C_ENCODE is None:  # a Python without the _json accelerator
        return _ENCODER.encode(doc) + "\n"
    return "".join(_C_ENCODE(doc, 0)) + "\n"


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside `path` (same suffix, so writers that go by the extension still
    work); renamed over `path` when the block ends without an exception, removed otherwise."""
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write a whole file so that readers see the old content or the new, never a part."""
    with atomic_path(path) as tmp:
        if isinstance(data, str):
            tmp.write_text(data)
        else:
            tmp.write_bytes(data)


def write_jsonl_atomic(path: Path, docs: Iterable[dict[str, Any]]) -> None:
    with atomic_path(path) as tmp, tmp.open("w") as fh:
        for doc in docs:
            fh.write(jsonl_line(doc))


class Journal:
    """An append-only JSON-lines file, flushed after every line.

    Flushing each line costs one write(2) per record (a few hundred per second at most here),
    and buys the promise that matters: what ended before a SIGKILL is on disk.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: IO[str] | None = path.open("w", buffering=1 << 16)
        self.lines = 0

    def append(self, doc: dict[str, Any]) -> None:
        if self._fh is None:
            return  # closed: the final file is being written by someone else
        self._fh.write(jsonl_line(doc))
        self._fh.flush()
        self.lines += 1

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
