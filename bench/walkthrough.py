"""The outputs docs/validate-your-scheduler.md shows, from its own commands: the example
scheduler (examples/least-ttft) as a plugin and as an HTTP service, checked with
`testbed policy-vectors` and scored with `testbed scorecard` on the sim and live.

Each step prints the command it ran and what the command printed (the tutorial's walk-through
has the service on port 9000; here it runs on a free loopback port, which the output shows as
9000 so the two read alike). The plugin is named by module and class
(`least_ttft.plugin:LeastTTFT`, examples/least-ttft on PYTHONPATH) rather than by the entry
point `pip install -e examples/least-ttft` registers: the same class, without installing it.

Usage: python bench/walkthrough.py [--only vectors|sim|live] [--report FILE]
About 3 minutes on 2 cores (the live step: 8 runs of two short scenarios).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from provenance import TESTBED, reported  # bench/: the script's directory is on sys.path
from sample_run import ROOT, run_child, served

EXAMPLE = ROOT / "examples" / "least-ttft"
PLUGIN = "least_ttft.plugin:LeastTTFT"
SHOWN_URL = "http://127.0.0.1:9000/route"
STEPS = ("vectors", "sim", "live")


def _run(args: list[str], url: str, out: Path | None = None, cache: str | None = None) -> int:
    """`testbed ARGS` with the example importable: prints the command and its output, and
    returns its exit status. The service's URL, the results directory and the cache read as
    the walk-through's (port 9000, results/scorecard, the default cache)."""
    status, printed = run_child([*TESTBED, *args])
    text = " ".join(a if " " not in a and "&" not in a else f"'{a}'" for a in args)
    text = f"$ testbed {text}\n{printed.rstrip()}\n"
    shown = {url: SHOWN_URL}
    shown |= {str(out): "results/scorecard"} if out is not None else {}
    shown |= {cache: "results/.scorecard-cache"} if cache is not None else {}
    for real, alias in shown.items():
        text = text.replace(real, alias)
    print(text)
    return status


def vectors(url: str) -> int:
    return _run(["policy-vectors", url], url)


def scorecards(url: str, substrate: str) -> int:
    """The plugin's and the service's scorecards against prfaas-static, one seed: the whole
    library on the sim, burst and prefill-crash live."""
    timeout = "1s" if substrate == "sim" else "100ms"
    extra = ["--scenarios", "burst,prefill-crash"] if substrate == "local" else []
    status = 0
    with tempfile.TemporaryDirectory() as cache:  # the baseline's sim runs: reused by the second
        for policy in (PLUGIN, f"{url}#timeout={timeout}&fallback=prfaas-nolongterm"):
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "scorecard"
                argv = ["scorecard", "--policy", policy, "--baseline", "prfaas-static"]
                argv += ["--seeds", "1", "--no-hindsight", "--substrate", substrate, *extra]
                argv += ["--cache", cache, "--out", str(out)]
                status = max(status, _run(argv, url, out, cache))
    return status


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--only", choices=STEPS)
    ap.add_argument("--report", type=Path, metavar="FILE", help="also write the output here")
    args = ap.parse_args()
    # the children import the example plugin by module (PLUGIN) from its checkout
    os.environ["PYTHONPATH"] = f"{EXAMPLE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    steps = [s for s in STEPS if args.only in (None, s)]
    status = 0
    for step in steps:
        setup = {
            "vectors": "the example service on loopback",
            "sim": "sim; every library scenario, seed 1 each",
            "live": "local (live); burst and prefill-crash, seed 1 each",
        }[step]
        heading = {
            "vectors": "policy-vectors against the example service",
            "sim": "Scorecards on the sim: plugin and service",
            "live": "Scorecards live: plugin and service",
        }[step]

        def measure(step: str = step) -> int:
            with served("least-ttft") as url:
                if step == "vectors":
                    return vectors(url)
                return scorecards(url, "sim" if step == "sim" else "local")

        status = max(status, reported(args.report, f"walkthrough-{step}", heading, setup, measure))
    return status


if __name__ == "__main__":
    raise SystemExit(main())
