"""Helpers for the tests that kill a run and inspect what it left: its JSON-lines files and its
child processes (tests/scenario/test_durable_results.py, test_up_durable.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any


def jsonl_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of a JSON-lines file, each of which must parse ([] if there is no file)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def children(pid: int) -> set[int]:
    """The process ids whose parent is `pid`."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def descendants(pid: int) -> set[int]:
    """Every process below `pid`: its children and theirs (a run's services are children of
    its service zygote: testbed.services.zygote)."""
    found: set[int] = set()
    todo = [pid]
    for _ in range(10_000):  # bounded: a process tree is far smaller
        if not todo:
            break
        for child in children(todo.pop()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie has exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
