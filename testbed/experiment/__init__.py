"""Experiments as a typed API (issue #37): a bench declares its grid and its table here.

`Grid` is scenario x `--set` paths x policies x seeds on one substrate, every variant validated
as `--set` is; `run_experiment` runs it (the sweep's process pool or Ray on the sim) into typed
`Row`s through a measure; the window metrics (steady window, completion rate, TTFT percentile
over a window) are testbed.metrics.window's and a summary's headline figures
testbed.metrics.scorecard's, re-exported; the hindsight yardstick is
testbed.scenario.hindsight's. docs/experiments.md shows a bench written on it.
"""

from testbed.experiment.grid import SUBSTRATES, Grid, Setting, Substrate, setting_text, settings_of
from testbed.experiment.run import Row, Run, run_experiment, run_scenario_once
from testbed.metrics.scorecard import headline
from testbed.metrics.window import (
    STEADY_SKIP,
    backlog,
    completion_rate,
    in_window,
    percentile,
    steady_window,
    ttft_p90,
    ttft_percentile,
)

__all__ = [
    "STEADY_SKIP",
    "SUBSTRATES",
    "Grid",
    "Row",
    "Run",
    "Setting",
    "Substrate",
    "backlog",
    "completion_rate",
    "headline",
    "in_window",
    "percentile",
    "run_experiment",
    "run_scenario_once",
    "setting_text",
    "settings_of",
    "steady_window",
    "ttft_p90",
    "ttft_percentile",
]
