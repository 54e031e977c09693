import json
import os
from pathlib import Path

import pytest

from testbed.errors import ConfigError
from testbed.workload.trace import read_trace

GOOD = {"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [1, 2]}


def write(tmp_path: Path, lines: list[str]) -> Path:
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


def doc(**kw: object) -> str:
    return json.dumps({**GOOD, **kw})


def test_reads_records_as_frozen_dataclasses(tmp_path: Path) -> None:
    p = write(
        tmp_path, [doc(), "", doc(timestamp=1500, input_length=7, hash_ids=[]), doc(timestamp=1500)]
    )
    t = read_trace(p)
    assert len(t) == 3
    first, second = t.requests[0], t.requests[1]
    assert (first.timestamp_s, first.input_length, first.output_length) == (0.0, 1000, 10)
    assert first.hash_ids == (1, 2) and first.line == 1
    assert second.timestamp_s == 1.5 and second.line == 3 and second.hash_ids == ()
    assert t.span_s == 1.5 and t.mean_rate_rps == pytest.approx(2 / 1.5)
    with pytest.raises(AttributeError):
        first.input_length = 5  # type: ignore[misc]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        (
            json.dumps({"input_length": 5, "output_length": 1, "hash_ids": []}),
            "missing field 'timestamp'",
        ),
        (
            json.dumps({"timestamp": 5, "output_length": 1, "hash_ids": []}),
            "missing field 'input_length'",
        ),
        (
            json.dumps({"timestamp": 5, "input_length": 1, "hash_ids": []}),
            "missing field 'output_length'",
        ),
        (
            json.dumps({"timestamp": 5, "input_length": 1, "output_length": 1}),
            "missing field 'hash_ids'",
        ),
        (doc(timestamp=5, input_length=0), "input_length must be positive"),
        (doc(timestamp=5, input_length=-3), "input_length must be positive"),
        (doc(timestamp=5, output_length=0), "output_length must be positive"),
        (doc(timestamp=5, input_length=2.5), "input_length must be a whole number"),
        (doc(timestamp=5, input_length="100"), "input_length must be a number"),
        (doc(timestamp=-1), "timestamp must not be negative"),
        (doc(timestamp=5, hash_ids=[1, "x"]), r"hash_ids\[1\] must be an integer"),
        (doc(timestamp=5, hash_ids=[1, 2.0]), r"hash_ids\[1\] must be an integer"),
        (doc(timestamp=5, hash_ids=[True]), r"hash_ids\[0\] must be an integer"),
        (doc(timestamp=5, hash_ids=7), "hash_ids must be a list"),
        # hostile numbers and shapes (issue #12 item 6): one ConfigError line, no traceback
        (doc(timestamp=5, input_length=10**400), "input_length must be at most 10000000"),
        (doc(timestamp=5, output_length=-(10**400)), "output_length must be positive"),
        (doc(timestamp=10**400), "timestamp must be at most"),
        (doc(timestamp=5, hash_ids=[2**64]), r"hash_ids\[0\] must fit in a signed 64-bit"),
        ('{"timestamp": ' + "9" * 5000 + "}", "a number is too long"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ],
    ids=lambda v: v[:30] if isinstance(v, str) else None,
)
def test_bad_line_names_file_line_and_problem(tmp_path: Path, bad: str, message: str) -> None:
    p = write(tmp_path, [doc(), doc(timestamp=1), bad, doc(timestamp=9)])
    with pytest.raises(ConfigError, match=message) as exc:
        read_trace(p)
    assert f"{p}:3:" in str(exc.value)


def test_timestamps_going_backwards_name_both_lines(tmp_path: Path) -> None:
    p = write(tmp_path, [doc(timestamp=0), doc(timestamp=2000), "", doc(timestamp=1000)])
    with pytest.raises(ConfigError, match="goes backwards") as exc:
        read_trace(p)
    assert f"{p}:4:" in str(exc.value) and "line 2" in str(exc.value)


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such trace file"):
        read_trace(tmp_path / "absent.jsonl")
    with pytest.raises(ConfigError, match="no requests"):
        read_trace(write(tmp_path, ["", "  "]))


@pytest.mark.parametrize(
    "content",
    [
        b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)),
        b'{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": []}\n'
        + "caf\u00e9".encode("latin-1"),
    ],
    ids=["binary", "latin-1"],
)
def test_binary_or_non_utf8_file_is_one_config_error(tmp_path: Path, content: bytes) -> None:
    p = tmp_path / "t.jsonl"
    p.write_bytes(content)
    with pytest.raises(ConfigError, match="not UTF-8 text") as exc:
        read_trace(p)
    assert str(exc.value).startswith(f"{p}:")


def test_a_fifo_or_directory_is_refused_without_reading(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it for reading would block for ever
    with pytest.raises(ConfigError, match="not a regular file"):
        read_trace(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        read_trace(tmp_path)


def test_reads_the_shared_mooncake_trace() -> None:
    path = (
        Path(__file__).resolve().parents[3] / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"
    )
    if not path.exists():
        pytest.skip(f"shared Mooncake trace not present at {path}")
    t = read_trace(path)
    assert len(t) == 3993
    assert t.requests[0].input_length == 40160 and len(t.requests[0].hash_ids) == 79
    assert t.span_s == pytest.approx(1022.025)
