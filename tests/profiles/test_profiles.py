import pytest

from testbed.profiles import MODELS

MIB = 2**20
KI = 1024


@pytest.fixture
def hybrid():  # type: ignore[no-untyped-def]
    return MODELS["internal-1t-hybrid"]


@pytest.mark.parametrize(
    ("ki_tokens", "mib", "seconds", "gbps"),
    [
        (1, 190.8, 0.44, 3.61),
        (8, 308.9, 0.72, 3.59),
        (32, 701.3, 1.84, 3.19),
        (128, 2316.3, 7.40, 2.62),
    ],
)
def test_table5_points_are_reproduced(hybrid, ki_tokens, mib, seconds, gbps) -> None:  # type: ignore[no-untyped-def]
    tokens = ki_tokens * KI
    assert hybrid.kv_bytes(tokens) == pytest.approx(mib * MIB)
    assert hybrid.prefill_time("h200x8", tokens) == pytest.approx(seconds)
    # Table 5's KV throughput column, to the paper's rounding.
    assert hybrid.kv_throughput("h200x8", tokens) * 8 / 1e9 == pytest.approx(gbps, abs=0.04)


def test_h20_prefill_matches_table6_operating_points(hybrid) -> None:  # type: ignore[no-untyped-def]
    assert hybrid.prefill_time("h20x8", 10_200) == pytest.approx(1.83, rel=0.01)
    assert hybrid.prefill_time("h20x8", 27_300) == pytest.approx(4.27, rel=0.01)
    # An H20 instance is 2.2-2.8x slower than an H200 one across the range.
    for tokens in (1024, 10_000, 30_000, 100_000):
        ratio = hybrid.prefill_time("h20x8", tokens) / hybrid.prefill_time("h200x8", tokens)
        assert 2.2 <= ratio <= 2.8


def test_decode_operating_point(hybrid) -> None:  # type: ignore[no-untyped-def]
    decode = hybrid.decode["h20x8"]
    assert decode.bs_max(1 / 40) == 20
    assert decode.step_time(20) == pytest.approx(0.025)
    assert decode.step_time(40) > decode.step_time(20)


def test_layer_split_sums_to_kv_size_and_separates_state(hybrid) -> None:  # type: ignore[no-untyped-def]
    short, long = hybrid.layer_bytes(1000), hybrid.layer_bytes(100_000)
    assert sum(long) == round(hybrid.kv_bytes(100_000))
    assert sum(short) == round(hybrid.kv_bytes(1000))
    kinds = hybrid.layer_kinds
    assert kinds.count("linear") == 3 * kinds.count("full")
    for i, kind in enumerate(kinds):
        if kind == "linear":  # fixed-size recurrent state: independent of length
            assert short[i] == long[i]
        else:  # full-attention KV grows with length
            assert long[i] > short[i]


def test_state_part_is_about_170_mib(hybrid) -> None:  # type: ignore[no-untyped-def]
    assert 165 * MIB < hybrid.state_bytes < 180 * MIB


def test_table3_kv_throughput_rows() -> None:
    dense, linear = MODELS["minimax-m2.5"], MODELS["kimi-linear-48b"]
    for ki, g_dense, g_lin in [
        (1, 4.94, 1.19),
        (8, 32.87, 2.29),
        (32, 59.93, 3.87),
        (128, 47.82, 4.88),
    ]:
        assert dense.kv_throughput("h200x8", ki * KI) * 8 / 1e9 == pytest.approx(g_dense)
        assert linear.kv_throughput("h200x8", ki * KI) * 8 / 1e9 == pytest.approx(g_lin)
    assert dense.state_bytes == 0
    assert set(dense.layer_kinds) == {"full"}
    # the point of hybrid models: ~15x less KV on the wire at 32K
    assert dense.kv_bytes(32 * KI) / linear.kv_bytes(32 * KI) > 10
