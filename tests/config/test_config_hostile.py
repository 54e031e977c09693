"""Hostile scenario files end as one ConfigError line naming the file (and field), never a
traceback (issue #12 item 6): 400-digit numbers, binary or non-UTF-8 bytes, nesting deeper than
the parser recurses, and files that are not regular files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from testbed.errors import ConfigError
from testbed.scenario.schema import load_scenario

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "tiny.yaml"
HUGE = 10**400


def _with(tmp_path: Path, **top: object) -> Path:
    doc = yaml.safe_load(TINY.read_text())
    doc.update(top)
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("duration", HUGE, "duration"),
        ("seed", HUGE, "seed"),
        ("seed", -1, "seed"),
        ("scale", {"time_scale": HUGE}, "scale.time_scale"),
    ],
    ids=["duration", "seed", "negative-seed", "time-scale"],
)
def test_huge_numbers_name_the_field(
    tmp_path: Path, field: str, value: object, message: str
) -> None:
    p = _with(tmp_path, **{field: value})
    with pytest.raises(ConfigError, match=message) as exc:
        load_scenario(p)
    assert str(exc.value).startswith(str(p))
    assert "\n" not in str(exc.value)


def test_huge_link_bandwidth_names_the_field(tmp_path: Path) -> None:
    doc = yaml.safe_load(TINY.read_text())
    doc["deployments"]["prfaas-pd"]["link"]["bandwidth"] = HUGE
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=r"link\.bandwidth"):
        load_scenario(p)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\xff\xfe", "not UTF-8"),
        (b"seed: 1\ndescription: caf\xe9\n", "not UTF-8"),
        (b"a: " + b"[" * 100_000 + b"]" * 100_000 + b"\n", "nested too deeply"),
    ],
    ids=["binary", "latin-1", "deep"],
)
def test_unreadable_content_is_one_line(tmp_path: Path, content: bytes, message: str) -> None:
    p = tmp_path / "s.yaml"
    p.write_bytes(content)
    with pytest.raises(ConfigError, match=message) as exc:
        load_scenario(p)
    assert str(exc.value).startswith(str(p))


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "s.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_scenario(fifo)
