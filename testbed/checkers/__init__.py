"""Checkers: invariants every run must keep, judged from its request records and history alone.

They are the testbed's promises, checked after every run (faults or not) rather than trusted.
The built-in invariants (`invariants`) always run: nothing_lost, kv_accounted,
no_unverified_decode, and generator_count when the runner passes the load generator's count.

A scenario adds its own (`checkers:`), one file each here, each a function registered with the
model of its entries (`@checker(Model)`, testbed.checkers.base), so adding one is one file
(docs/extending.md):

- ttft / tpot / e2e (`latency`): a percentile of completed requests stays under a bound.
- failures: at most a fraction of submitted requests failed (each with a reason).
- reroute: after a fault starts, a request whose path avoids the faulty target starts prefill
  within `within`.
- recover: after a fault ends, TTFT is back under `ttft` within `within`.
- throughput: completions per second in a window against the planner's optimum.
- token_exact (`engine: torch` runs): every completed request's token ids equal a
  single-process generation of the same prompt, recomputed after the run.

Each result carries a one-line detail with the counts and the first few offending ids, which is
what a person needs to start debugging from the report, and a verdict: ok, failed, or vacuous.
A vacuous check exercised nothing, so it neither passed nor failed: a fault during which no
request needed re-routing, a fault that never applied or never ended, fewer requests after a
fault's end than the recovery streak, a percentile over zero completed requests (or with no
pre-fault value to compare with), nothing submitted, completed or decoded for the built-ins.
It does not fail the run (a run that breaks everything is caught by a `failures` bound, which
every library scenario carries), but it is shown as such, and the chaos suite asserts that its
own scenarios are never vacuous. What can be known before the run (a fault past the duration,
a checker about a fault the timeline lacks) is refused then instead: `checkers_fit` here and
`testbed.nemesis.check_timeline_fits`, called by the runner's prepare_run.
"""

from __future__ import annotations

from testbed.checkers.base import (
    CHECKERS,
    Checker,
    CheckerConfig,
    CheckInput,
    TokenReference,
    checker,
    checker_union,
)
from testbed.checkers.failures import check_failures
from testbed.checkers.invariants import (
    check_generator_count,
    check_kv_accounted,
    check_no_unverified_decode,
    check_nothing_lost,
)
from testbed.checkers.latency import check_latency
from testbed.checkers.recover import check_recover
from testbed.checkers.reroute import check_reroute
from testbed.checkers.result import CheckResult, Verdict
from testbed.checkers.run import checkers_fit, run_checker, run_checkers
from testbed.checkers.throughput import check_throughput
from testbed.checkers.token_exact import check_token_exact

__all__ = [
    "CHECKERS",
    "CheckInput",
    "CheckResult",
    "Checker",
    "CheckerConfig",
    "TokenReference",
    "Verdict",
    "check_failures",
    "check_generator_count",
    "check_kv_accounted",
    "check_latency",
    "check_no_unverified_decode",
    "check_nothing_lost",
    "check_recover",
    "check_reroute",
    "check_throughput",
    "check_token_exact",
    "checker",
    "checker_union",
    "checkers_fit",
    "run_checker",
    "run_checkers",
]
