"""A run's records and history without holding them: the sim's 10K-GPU hour (bench/sim_scale.py).

- `RecordStream`: requests.jsonl written as records finish, in submission order (a record that
  finishes before an earlier-submitted one waits in a small buffer until that one is written),
  each record summarised into a `RecordTable` (testbed.metrics.table) and dropped. The file is
  byte for byte what writing the whole list at the end gives (write_jsonl_atomic: the same
  lines, renamed into place when the run ends).
- the history: `RunHistory` (testbed.metrics.history), its queue samples kept as columns.
- `RecordFile`: the records of a requests.jsonl as a sequence read back from the file, for the
  checkers of a streamed run too large to keep them.

A run of at most `KEEP` records keeps them too (the table's `records`): the checkers then read
them without parsing the file back, which was a quarter of a 4K-request command's CPU outside
the simulation.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, overload

from testbed.metrics.files import jsonl_line
from testbed.metrics.records import RequestRecord
from testbed.metrics.table import RecordTable

__all__ = ["KEEP", "RecordFile", "RecordStream"]

KEEP = 100_000
"""Records a run keeps in memory for its checkers; past it they are read back from the file."""


class RecordStream:
    """requests.jsonl written as the run goes, in submission order, and its `RecordTable`."""

    def __init__(self, path: Path, keep: int = KEEP) -> None:
        self.path = path
        self.table = RecordTable()
        self._kept: list[RequestRecord] | None = []
        self._keep = keep
        self._tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
        self._fh: IO[str] | None = self._tmp.open("w", buffering=1 << 20)
        self._index: dict[str, int] = {}
        self._pending: dict[int, RequestRecord] = {}
        self._submitted = 0
        self._next = 0
        self.received = 0
        """Distinct submitted requests that have a record."""
        self.lines = 0

    def submitted(self, request_id: str) -> None:
        """`request_id` is the next request submitted (its record's place in the file)."""
        self._index[request_id] = self._submitted
        self._submitted += 1

    def put(self, rec: RequestRecord) -> None:
        """A request's record (its last: a later record of the same id replaces one not yet
        written, as the sim's dict of records did)."""
        idx = self._index.pop(rec.id, None)
        if idx is None:
            for i, held in self._pending.items():  # a second record of a request still held
                if held.id == rec.id:
                    self._pending[i] = rec
            return
        self.received += 1
        self._pending[idx] = rec
        self._flush()

    def _flush(self) -> None:
        pending, table = self._pending, self.table
        while self._next in pending:
            rec = pending.pop(self._next)
            self._write(rec)
            table.add(rec)
            self._next += 1

    def _write(self, rec: RequestRecord) -> None:
        assert self._fh is not None
        self._fh.write(jsonl_line(rec.to_json()))
        self.lines += 1
        if self._kept is not None:
            self._kept.append(rec)
            if len(self._kept) > self._keep:
                self._kept = None  # a large run: its checkers read the file back

    def close(self) -> None:
        """Write what is held in submission order (requests without a record are left out, as
        before) and rename the file into place."""
        if self._fh is None:
            return
        for idx in sorted(self._pending):
            rec = self._pending.pop(idx)
            self._write(rec)
            self.table.add(rec)
        self._fh.close()
        self._fh = None
        os.replace(self._tmp, self.path)
        self.table.records = self._kept

    def abort(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        with contextlib.suppress(FileNotFoundError):
            self._tmp.unlink()


class RecordFile(Sequence[RequestRecord]):
    """The records of a requests.jsonl, read from the file on each pass: what the checkers of a
    run past `KEEP` records read (a smaller run's stream kept them, `RecordStream`)."""

    def __init__(self, path: Path, lines: int) -> None:
        self.path = path
        self.lines = lines

    def __len__(self) -> int:
        return self.lines

    def __iter__(self) -> Iterator[RequestRecord]:
        return self._read()

    def _read(self) -> Iterator[RequestRecord]:
        with self.path.open() as fh:
            for line in fh:
                if line.strip():
                    yield RequestRecord.from_json(json.loads(line))

    @overload
    def __getitem__(self, i: int) -> RequestRecord: ...
    @overload
    def __getitem__(self, i: slice) -> list[RequestRecord]: ...
    def __getitem__(self, i: int | slice) -> RequestRecord | list[RequestRecord]:
        if isinstance(i, slice):
            return list(itertools.islice(iter(self), *i.indices(len(self))))
        n = len(self)
        j = i if i >= 0 else n + i
        if not 0 <= j < n:
            raise IndexError(i)
        return next(itertools.islice(iter(self), j, None))
