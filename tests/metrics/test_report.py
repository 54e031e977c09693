import time
from pathlib import Path

import numpy as np
import pytest

from testbed.checkers import run_checkers
from testbed.clock import Scale
from testbed.config import SloConfig
from testbed.metrics.records import HistoryEvent, RequestRecord, Route
from testbed.metrics.report import write_report
from testbed.metrics.summary import summarize
from testbed.metrics.timeline import write_timeline

SLO = SloConfig(ttft="6s", decode_tokens_per_s=40)
INSTANCES = [
    ("p0", "prfaas", "prefill"),
    ("p1", "prfaas", "prefill"),
    ("l0", "local", "prefill"),
    ("d0", "local", "decode"),
]


def run_data(
    n: int = 300, duration: float = 120.0
) -> tuple[list[RequestRecord], list[HistoryEvent]]:
    """A plausible run: the link is down at 60-70 s (prfaas fails), then prfaas backs up."""
    rng = np.random.default_rng(0)
    records: list[RequestRecord] = []
    for i, t in enumerate(np.sort(rng.uniform(0, duration, n))):
        route: Route = "prfaas" if rng.random() < 0.5 else "local"
        r = RequestRecord(
            id=f"r{i + 1:06d}",
            input_tokens=int(rng.integers(128, 100_000)),
            output_tokens=64,
            arrival=float(t),
            route=route,
        )
        if route == "prfaas" and 60 <= t < 70:
            r.failure_reason = "link down"
        else:
            ttft = float(rng.gamma(4, 0.5)) + (4.0 if route == "prfaas" and 70 <= t < 80 else 0)
            r.status, r.first_token, r.tokens_out = "completed", float(t) + ttft, 64
            r.last_token = r.first_token + 63 * 0.025
            r.kv_wire_bytes_expected = r.kv_wire_bytes_sent = r.kv_wire_bytes_received = 70_000
            r.kv_verified, r.cross_dc = True, route == "prfaas"
        records.append(r)
    history: list[HistoryEvent] = []
    wire = 0
    for k in range(1, int(duration) + 1):
        t = float(k)
        configured = 0.0 if 60 <= t < 70 else 100.0
        gbps = 0.0 if configured == 0 else float(13 + 6 * np.sin(t / 7) + rng.normal(0, 1))
        wire += int(gbps * 1e9 / 8 / 1000)
        history.append(
            HistoryEvent(
                t, "link", {"wire_bytes": wire, "gbps": gbps, "configured_gbps": configured}
            )
        )
        for j, (inst, cluster, role) in enumerate(INSTANCES):
            depth = int(rng.poisson(6 if cluster == "prfaas" and 70 <= t < 80 else 2))
            data = {"instance": inst, "cluster": cluster, "role": role, "depth": depth}
            history.append(HistoryEvent(t + 0.2 * j, "queue", data))
    history.append(HistoryEvent(60.0, "fault", {"action": "link-down"}))
    history.append(HistoryEvent(70.0, "fault", {"action": "link-up"}))
    history.append(HistoryEvent(0.0, "policy", {"threshold_tokens": 19400.0}))
    history.append(
        HistoryEvent(
            duration,
            "engine",
            {
                "instance": "p0",
                "steps": 1234,
                "lateness_mean_s": 0.0012,
                "lateness_p99_s": 0.0093,
                "timing_error": 0.031,
            },
        )
    )
    return records, history


def test_report_contains_the_key_numbers(tmp_path: Path) -> None:
    records, history = run_data()
    summary = summarize(
        records,
        history,
        duration_s=120.0,
        slo=SLO,
        scale=Scale(8.0, 1000.0),
        extra={"deployment": "prfaas-pd (4/3/5)", "policy": "prfaas-static"},
    )
    checks = run_checkers(records, [r.id for r in records])
    path = write_report(tmp_path / "out", "link-flap", summary, checks, ["a note about the run"])
    assert path == tmp_path / "out" / "report.md"
    text = path.read_text()
    req = summary["requests"]
    assert text.startswith("# link-flap\n")
    assert f"**{req['completed']}/{req['submitted']} requests completed" in text
    assert "time_scale 8" in text and "byte_scale 1000" in text
    assert "deployment: prfaas-pd (4/3/5)" in text and "policy: prfaas-static" in text
    assert f"| goodput (within SLO) | {summary['goodput_rps']:.4g} req/s |" in text
    assert f"| failed | {req['failed']} (link down: {req['failed']}) |" in text
    assert f"{summary['ttft_s']['p90']:.4g} s" in text
    assert "| prfaas |" in text and "| local |" in text
    assert f"{summary['link']['peak_gbps']:.4g} Gbps" in text
    assert "| p0 | 1234 |" in text and "3.1%" in text
    assert "t = 60 s: link-down" in text
    assert "| nothing_lost | PASS |" in text
    assert "all checks passed" in text
    assert "- a note about the run" in text
    assert "timeline" not in text.lower().split("## notes")[0].split("## checks")[1]


def test_report_marks_failed_checks_and_embeds_an_existing_timeline(tmp_path: Path) -> None:
    records, history = run_data(n=40)
    records[0].failure_reason, records[0].status = None, "failed"
    summary = summarize(records, history, duration_s=120.0, slo=SLO, scale=Scale(1, 1))
    checks = run_checkers(records, [r.id for r in records])
    write_timeline(tmp_path / "timeline.png", records, history, title="t")
    text = write_report(tmp_path, "broken", summary, checks, []).read_text()
    assert "| nothing_lost | **FAIL** | " in text
    assert "failed without a reason: r000001" in text
    assert "1 FAILED" in text
    assert "![timeline](timeline.png)" in text


def test_timeline_png_is_written_and_non_trivial(tmp_path: Path) -> None:
    records, history = run_data()
    path = write_timeline(
        tmp_path / "sub" / "timeline.png",
        records,
        history,
        title="link-flap: prfaas-pd, prfaas-static",
        ttft_slo_s=6.0,
    )
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 50_000


def test_timeline_with_no_data(tmp_path: Path) -> None:
    path = write_timeline(tmp_path / "empty.png", [], [], title="empty")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_importing_the_timeline_module_does_not_import_matplotlib() -> None:
    import subprocess
    import sys

    code = "import sys, testbed.metrics.timeline; print('matplotlib' in sys.modules)"
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
    assert time.monotonic() - t0 < 60  # sanity only; not a speed test


@pytest.fixture(autouse=True)
def _no_pyplot_figures_left() -> object:
    yield
    import sys

    if "matplotlib.pyplot" in sys.modules:
        assert not sys.modules["matplotlib.pyplot"].get_fignums()
