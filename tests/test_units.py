import pytest

from testbed.units import (
    UnitError,
    format_bandwidth,
    parse_bandwidth,
    parse_duration,
    parse_size,
    parse_tokens,
)


@pytest.mark.parametrize(
    ("text", "bytes_per_s"),
    [
        ("100Gbps", 12.5e9),
        ("100 Gbit/s", 12.5e9),
        ("12.5MB/s", 12.5e6),
        ("1Mbps", 125_000.0),
        ("8Kbps", 1000.0),
        ("1MiB/s", 2**20),
        (1000, 1000.0),
    ],
)
def test_bandwidth(text: object, bytes_per_s: float) -> None:
    assert parse_bandwidth(text) == pytest.approx(bytes_per_s)


@pytest.mark.parametrize(
    ("text", "n"),
    [("701.3MiB", 701.3 * 2**20), ("16.5KiB", 16.5 * 1024), ("1GB", 1e9), ("512B", 512), ("3", 3)],
)
def test_size(text: str, n: float) -> None:
    assert parse_size(text) == pytest.approx(n)


@pytest.mark.parametrize(
    ("text", "s"),
    [("25ms", 0.025), ("1.5s", 1.5), ("2m", 120.0), ("500us", 5e-4), ("500µs", 5e-4), (3, 3.0)],
)
def test_duration(text: object, s: float) -> None:
    assert parse_duration(text) == pytest.approx(s)


def test_tokens_use_decimal_k() -> None:
    # K = 1000 tokens in workload lengths: the paper's t = 19.4K is 19,400 tokens.
    assert parse_tokens("19.4K") == pytest.approx(19_400)
    assert parse_tokens("128K") == 128_000
    assert parse_tokens("1M") == 1_000_000
    assert parse_tokens(1024) == 1024


@pytest.mark.parametrize(
    ("parser", "text"),
    [
        (parse_bandwidth, "100Gbpz"),
        (parse_bandwidth, "fast"),
        (parse_size, "3 parsecs"),
        (parse_duration, "25 fortnights"),
        (parse_tokens, "19.4Ki"),
        (parse_bandwidth, True),
        (parse_size, None),
        (parse_duration, "nan s"),
    ],
)
def test_bad_units_raise_unit_error(parser: object, text: object) -> None:
    with pytest.raises(UnitError):
        parser(text)  # type: ignore[operator]


def test_format_bandwidth_round_trips() -> None:
    assert format_bandwidth(parse_bandwidth("13Gbps")) == "13Gbps"
    assert parse_bandwidth(format_bandwidth(1.5e6)) == pytest.approx(1.5e6, rel=1e-3)
