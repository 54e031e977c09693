import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from testbed.config import WorkloadConfig
from testbed.errors import ConfigError
from testbed.workload.generate import RequestSpec, generate_requests
from testbed.workload.trace import read_trace

SHARED_TRACE = (
    Path(__file__).resolve().parents[3] / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"
)


def workload(**kw: Any) -> WorkloadConfig:
    return WorkloadConfig.model_validate(kw)


@pytest.fixture
def shared_trace() -> Path:
    if not SHARED_TRACE.exists():
        pytest.skip(f"shared Mooncake trace not present at {SHARED_TRACE}")
    return SHARED_TRACE


@pytest.fixture
def small_trace(tmp_path: Path) -> Path:
    p = tmp_path / "small.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 100, "output_length": 5, "hash_ids": [0]},
        {"timestamp": 1000, "input_length": 600, "output_length": 6, "hash_ids": [0, 1]},
        {"timestamp": 3000, "input_length": 50, "output_length": 7, "hash_ids": [2]},
        {"timestamp": 4000, "input_length": 900, "output_length": 8, "hash_ids": [0, 1, 3]},
    ]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_synthetic_requests_are_deterministic_and_well_formed() -> None:
    wl = workload(arrivals={"process": "poisson", "rate": 2}, output_tokens="1K")
    a = generate_requests(wl, rate_rps=2.0, duration_s=100.0, seed=7)
    b = generate_requests(wl, rate_rps=2.0, duration_s=100.0, seed=7)
    assert a == b
    assert 150 < len(a) < 250
    assert [r.id for r in a[:3]] == ["r000001", "r000002", "r000003"]
    assert len({r.id for r in a}) == len(a)
    assert all(isinstance(r, RequestSpec) and isinstance(r.input_tokens, int) for r in a)
    assert all(128 <= r.input_tokens <= 128_000 for r in a)
    assert all(r.output_tokens == 1000 and r.hash_ids == () for r in a)
    assert all(x.arrival <= y.arrival for x, y in itertools.pairwise(a))
    assert a[-1].arrival < 100.0
    assert generate_requests(wl, rate_rps=2.0, duration_s=100.0, seed=8) != a


def test_length_sequence_does_not_depend_on_rate_or_process() -> None:
    base = generate_requests(
        workload(arrivals={"process": "poisson", "rate": 1}), rate_rps=1.0, duration_s=200, seed=3
    )
    faster = generate_requests(
        workload(arrivals={"process": "poisson", "rate": 1}), rate_rps=3.0, duration_s=200, seed=3
    )
    bursty = generate_requests(
        workload(
            arrivals={"process": "onoff", "rate": 1, "on_duration": "5s", "off_duration": "15s"}
        ),
        rate_rps=1.0,
        duration_s=200,
        seed=3,
    )
    n = min(len(base), len(faster), len(bursty))
    assert n > 100
    lengths = [r.input_tokens for r in base[:n]]
    assert [r.input_tokens for r in faster[:n]] == lengths
    assert [r.input_tokens for r in bursty[:n]] == lengths
    assert [r.arrival for r in faster[:n]] != [r.arrival for r in base[:n]]


def test_lengths_follow_the_distribution() -> None:
    wl = workload(arrivals={"process": "uniform", "rate": 100})
    reqs = generate_requests(wl, rate_rps=100.0, duration_s=200.0, seed=1)
    assert len(reqs) == 20_000
    assert np.mean([r.input_tokens for r in reqs]) == pytest.approx(27_300, rel=0.03)


def test_fixed_lengths_round_and_stay_positive() -> None:
    wl = workload(
        arrivals={"process": "uniform", "rate": 1},
        lengths={"kind": "fixed", "tokens": 0.4},
        output_tokens=1.6,
    )
    reqs = generate_requests(wl, rate_rps=1.0, duration_s=5.0, seed=0)
    assert [r.arrival for r in reqs] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert all(r.input_tokens == 1 and r.output_tokens == 2 for r in reqs)


def test_max_requests_caps_the_list() -> None:
    wl = workload(arrivals={"process": "poisson", "rate": 10}, max_requests=17)
    assert len(generate_requests(wl, rate_rps=10.0, duration_s=100.0, seed=0)) == 17


def test_rate_required_for_synthetic_arrivals() -> None:
    wl = workload(arrivals={"process": "poisson", "rate": 1})
    with pytest.raises(ConfigError, match="needs an arrival rate"):
        generate_requests(wl, rate_rps=None, duration_s=10.0, seed=0)


def test_trace_process_needs_a_trace() -> None:
    with pytest.raises(ConfigError, match="no trace was given"):
        generate_requests(
            workload(arrivals={"process": "trace"}), rate_rps=None, duration_s=10, seed=0
        )


def test_trace_replay_keeps_everything_and_cuts_at_duration(small_trace: Path) -> None:
    wl = workload(arrivals={"process": "trace"}, trace=str(small_trace))
    reqs = generate_requests(wl, rate_rps=None, duration_s=3.0, seed=0)
    assert reqs == [
        RequestSpec("r000001", 0.0, 100, 5, (0,)),
        RequestSpec("r000002", 1.0, 600, 6, (0, 1)),
    ]
    # The argument overrides the config, and a trace replay ignores the seed.
    other = generate_requests(
        workload(arrivals={"process": "trace"}),
        rate_rps=None,
        duration_s=10.0,
        seed=5,
        trace_path=str(small_trace),
    )
    assert [r.arrival for r in other] == [0.0, 1.0, 3.0, 4.0]


def test_trace_replay_rescaled_to_a_rate(small_trace: Path) -> None:
    # Natural rate: 3 gaps over 4 s = 0.75 req/s; at 1.5 req/s the clock runs twice as fast.
    wl = workload(arrivals={"process": "trace", "rate": 1.5}, trace=str(small_trace))
    reqs = generate_requests(wl, rate_rps=1.5, duration_s=100.0, seed=0)
    assert [r.arrival for r in reqs] == pytest.approx([0.0, 0.5, 1.5, 2.0])
    assert [r.input_tokens for r in reqs] == [100, 600, 50, 900]


def test_trace_that_cannot_be_rescaled(tmp_path: Path) -> None:
    p = tmp_path / "same.jsonl"
    p.write_text('{"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": []}\n' * 2)
    wl = workload(arrivals={"process": "trace"}, trace=str(p))
    with pytest.raises(ConfigError, match=r"cannot be\s+rescaled"):
        generate_requests(wl, rate_rps=2.0, duration_s=10.0, seed=0)


def test_trace_content_with_synthetic_arrivals(small_trace: Path) -> None:
    wl = workload(arrivals={"process": "uniform", "rate": 10}, trace=str(small_trace))
    reqs = generate_requests(wl, rate_rps=10.0, duration_s=100.0, seed=0)
    # Four requests in trace order on a 0.1 s grid; then the trace runs out.
    assert [r.arrival for r in reqs] == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert [(r.input_tokens, r.output_tokens, r.hash_ids) for r in reqs] == [
        (100, 5, (0,)),
        (600, 6, (0, 1)),
        (50, 7, (2,)),
        (900, 8, (0, 1, 3)),
    ]


def test_replays_the_shared_mooncake_trace(shared_trace: Path) -> None:
    trace = read_trace(shared_trace)
    wl = workload(arrivals={"process": "trace"}, trace=str(shared_trace))
    reqs = generate_requests(wl, rate_rps=None, duration_s=120.0, seed=0)
    expected = [t for t in trace.requests if t.timestamp_s < 120.0]
    assert len(reqs) == len(expected) > 100
    for r, t in zip(reqs, expected, strict=True):
        assert (r.arrival, r.input_tokens, r.output_tokens, r.hash_ids) == (
            t.timestamp_s,
            t.input_length,
            t.output_length,
            t.hash_ids,
        )
    # Rescaled to 10 req/s, the whole trace fits in ~400 s at that mean rate.
    fast = generate_requests(wl, rate_rps=10.0, duration_s=10_000.0, seed=0)
    assert len(fast) == len(trace)
    assert (len(fast) - 1) / (fast[-1].arrival - fast[0].arrival) == pytest.approx(10.0)
    assert [r.hash_ids for r in fast] == [t.hash_ids for t in trace.requests]


def test_trace_lengths_config_is_used_for_trace_process(shared_trace: Path) -> None:
    wl = workload(
        arrivals={"process": "trace"}, lengths={"kind": "trace", "path": str(shared_trace)}
    )
    reqs = generate_requests(wl, rate_rps=None, duration_s=30.0, seed=0)
    assert reqs and reqs[0].input_tokens == 40160 and reqs[0].hash_ids


def test_empirical_lengths_from_the_shared_trace(shared_trace: Path) -> None:
    # No trace replay: synthetic arrivals, lengths drawn from the trace's empirical distribution.
    wl = workload(
        arrivals={"process": "poisson", "rate": 50},
        lengths={"kind": "trace", "path": str(shared_trace)},
    )
    reqs = generate_requests(wl, rate_rps=50.0, duration_s=200.0, seed=2)
    assert all(r.hash_ids == () for r in reqs)
    assert np.mean([r.input_tokens for r in reqs]) == pytest.approx(15_325, rel=0.05)
