"""Sizes that use up the machine are refused before they allocate, and the sites issue #33's
fuzz found end in one line (exit 2), never a traceback: each through the CLI, on `testbed plan`
and on `testbed run --substrate sim` (the shared prepare path every substrate takes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from testbed.cli import main
from testbed.config import WorkloadConfig
from testbed.workload.generate import generate_requests
from testbed.workload.lengths import TruncatedLognormal

ROOT = Path(__file__).resolve().parents[2]
TINY = (ROOT / "tests" / "data" / "tiny.yaml").read_text()

# (id, text replaced in tiny.yaml, its replacement, what the one line names)
SITES = [
    ("rate-1e6", "rate: 1.0}", "rate: 1.0e6}", "workload.arrivals.rate"),
    ("rate-1e5", "rate: 1.0}", "rate: 1.0e5}", "workload.arrivals.rate"),
    ("lengths-max-1e12", "max: 64K}", "max: 1e12}", "workload.lengths.max"),
    ("duration-1ns", "duration: 40s", "duration: 1ns", "duration"),
    ("time-scale-1e-9", "time_scale: 20", "time_scale: 1.0e-9", "scale.time_scale"),
    ("time-scale-1e6", "time_scale: 20", "time_scale: 1.0e6", "scale.time_scale"),
    ("byte-scale-0.5", "byte_scale: 2000", "byte_scale: 0.5", "scale.byte_scale"),
    ("seed-int-tag", "seed: 3", "seed: !!int 12abc", ":3: "),
    ("seed-float-tag", "seed: 3", "seed: !!float 1x", ":3: "),
    ("bool-tag", "seed: 3", "seed: !!bool 13", ":3: "),
    ("timestamp-tag", "seed: 3", "seed: !!timestamp x", ":3: "),
    ("list-key", "seed: 3", "? [a, b]\n: 3", ":3: "),
    ("sigma-3000", "sigma: 1.0", "sigma: 3000", "workload.lengths.sigma"),
    ("mu-minus-300", "mu: 9.0", "mu: -300", "workload.lengths.mu"),
    ("mu-200", "mu: 9.0", "mu: 200", "workload.lengths.mu"),
    ("mu-far-from-window", "mu: 9.0, sigma: 1.0", "mu: 60, sigma: 1.0", "workload.lengths"),
    ("slo-1e-308", "decode_tokens_per_s: 40", "decode_tokens_per_s: 1.0e-308", "slo.decode"),
    ("load-2-63", "rate: 1.0}", "load: 9223372036854775808}", "workload.arrivals.load"),
    (
        "load-uniform",
        "{process: poisson, rate: 1.0}",
        "{process: uniform, load: 9223372036854775808}",
        "workload.arrivals.load",
    ),
    ("output-tokens-tiny", "output_tokens: 64", "output_tokens: 1e-320", "output_tokens"),
    (
        "threshold-step-tiny",
        "policy: {",
        "planner: {threshold_step: 1e-300}\npolicy: {",
        "threshold_step",
    ),
    (
        "threshold-grid",  # 64K thresholds: 128 to 64K tokens in steps of 1
        "policy: {",
        "planner: {threshold_step: 1}\npolicy: {",
        "planner.threshold_step",
    ),
    (
        "onoff-windows",
        "{process: poisson, rate: 1.0}",
        "{process: onoff, rate: 1.0, on_duration: 1ns, off_duration: 1ns}",
        "workload.arrivals.on_duration",
    ),
    (
        "burstiness-huge",
        "{process: poisson, rate: 1.0}",
        "{process: gamma, rate: 1.0, burstiness: 1e300}",
        "burstiness",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("old", "new", "field"), [s[1:] for s in SITES], ids=[s[0] for s in SITES])
@pytest.mark.parametrize("command", [["plan"], ["run", "--substrate", "sim", "--quiet"]])
def test_each_site_is_one_line_exit_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: list[str],
    old: str,
    new: str,
    field: str,
) -> None:
    assert old in TINY
    path = tmp_path / "s.yaml"
    path.write_text(TINY.replace(old, new, 1))
    rc = main([command[0], str(path), *command[1:], "--max-requests", "1000000"])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"testbed: error: {path}"), err
    assert field in lines[0], err


def test_max_requests_flag_of_run_and_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The cap is the default 1M; `--max-requests N` lowers or raises it, on plan and run."""
    path = tmp_path / "s.yaml"
    path.write_text(TINY.replace("rate: 1.0}", "rate: 100}"))  # 4,000 requests in 40 s
    assert main(["plan", str(path)]) == 0
    assert main(["plan", str(path), "--max-requests", "3999"]) == 2
    assert "above the cap of 3,999" in capsys.readouterr().err
    assert main(["run", str(path), "--substrate", "sim", "--max-requests", "100"]) == 2
    assert "4,000 requests, above the cap of 100" in capsys.readouterr().err
    big = tmp_path / "big.yaml"
    big.write_text(TINY.replace("rate: 1.0}", "rate: 1.0e5}").replace("40s", "20s"))
    assert main(["plan", str(big)]) == 2  # 2M requests
    assert main(["plan", str(big), "--max-requests", "2100000"]) == 0
    with pytest.raises(SystemExit):
        main(["plan", str(big), "--max-requests", "0"])


def test_max_requests_draws_no_more_than_it_keeps() -> None:
    """`workload.max_requests` stops the draw (a high rate with a small cap allocates nothing
    more), and the requests kept are the same as drawing everything and cutting."""
    for process in ("poisson", "uniform", "gamma", "onoff"):
        arrivals = {"process": process, "rate": 50.0}
        full = generate_requests(
            WorkloadConfig.model_validate({"arrivals": arrivals}),
            rate_rps=50.0,
            duration_s=60.0,
            seed=4,
        )
        cut = generate_requests(
            WorkloadConfig.model_validate({"arrivals": arrivals, "max_requests": 37}),
            rate_rps=50.0,
            duration_s=60.0,
            seed=4,
        )
        assert cut == full[:37], process
    huge = WorkloadConfig.model_validate(
        {"arrivals": {"rate": 1e6}, "max_requests": 5}
    )  # 1e12 arrivals over 1e6 s if drawn
    assert len(generate_requests(huge, rate_rps=1e6, duration_s=1e6, seed=0)) == 5


def test_lengths_of_no_request_and_impossible_windows() -> None:
    dist = TruncatedLognormal(9.0, 1.0, 128, 64_000)
    assert dist.sample(np.random.default_rng(0), 0).shape == (0,)  # was a ValueError
    with pytest.raises(ValueError, match="holds none"):
        TruncatedLognormal(-300.0, 1.0, 128, 64_000)


def test_bs_max_of_extreme_slos() -> None:
    from testbed.profiles import MODELS

    decode = next(iter(MODELS.values())).decode["h20x8"]
    assert decode.bs_max(1e308) == decode.max_batch  # was an OverflowError
    assert decode.bs_max(float("inf")) == decode.max_batch
    assert decode.bs_max(-1e308) == 1
