"""The SLO's two fields decide which completed requests count as goodput (summary.json
`goodput_rps`, `slo_attainment`): each one, moved alone, moves the count."""

from __future__ import annotations

from testbed.clock import Scale
from testbed.config import SloConfig
from testbed.metrics.records import RequestRecord
from testbed.metrics.summary import summarize


def done(i: int, ttft: float, tpot: float) -> RequestRecord:
    r = RequestRecord(id=f"r{i}", input_tokens=100, output_tokens=11, arrival=float(i))
    r.status, r.tokens_out = "completed", 11
    r.first_token = r.arrival + ttft
    r.last_token = r.first_token + 10 * tpot
    return r


RECORDS = [done(1, 1.0, 0.02), done(2, 5.0, 0.02), done(3, 1.0, 0.05)]


def good(slo: SloConfig) -> float:
    s = summarize(RECORDS, [], duration_s=10.0, slo=slo, scale=Scale(1.0, 1.0))
    return float(s["slo_attainment"])


def test_ttft_and_decode_speed_set_what_counts_as_good() -> None:
    base = SloConfig(ttft="2s", decode_tokens_per_s=40)  # TPOT 25 ms
    assert good(base) == 1 / 3
    assert good(base.model_copy(update={"ttft": 10.0})) == 2 / 3
    assert good(base.model_copy(update={"decode_tokens_per_s": 10.0})) == 2 / 3
