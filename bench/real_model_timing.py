"""Compute per decode step of the tiny real model against batch size, before and after batching,
and the time_scale this host calibrates for scenarios/real-model.yaml (issue #20).

- before: one forward per request per step, as the decode batcher ran before batching (each
  request's token through the layers on its own: the prefill path with a chunk of one token);
- after: one batched pass for the whole batch (testbed.engine.torch.batched, 32 fixed rows).

Each request has a prompt of --context tokens (default 148, the real-model workload's median).
Wall and CPU milliseconds per step are medians over --steps steps; CPU time is what this
process used (on a shared host wall time also counts the time other processes held the core).
Then the scenario's calibration: compute per prefill layer and per decode pass, and the largest
time_scale it allows (testbed.engine.torch.calibrate; cached, --recalibrate measures again).

Usage: python bench/real_model_timing.py [--context 148] [--steps 20] [--recalibrate]
                                             [--report FILE]
Needs torch (the `model` extra). Takes about 20 s on 2 idle cores.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from provenance import reported  # bench/: the script's directory is on sys.path

from testbed.engine.torch.batched import DecodeBatch
from testbed.engine.torch.calibrate import RECALIBRATE_ENV
from testbed.engine.torch.kvstate import KVState
from testbed.engine.torch.live import tiny_config
from testbed.engine.torch.model import TinyHybridLM
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.schema import load_scenario

ROOT = Path(__file__).resolve().parents[1]
BATCHES = (1, 4, 8, 20)


def _one_at_a_time(model: TinyHybridLM, state: KVState, token: int) -> int:
    """A decode step for one request as before batching: its token through every layer alone."""
    pos = state.n_tokens
    h = model.embed[torch.tensor([token])]
    for layer in range(model.config.n_layers):
        h = model._block(layer, h, state, pos)
    state.n_tokens += 1
    return model._greedy(h)


def _timed(step: Callable[[], object], steps: int) -> tuple[float, float]:
    """Median wall and CPU milliseconds of `step`."""
    wall, cpu = [], []
    step()  # warm-up: first-use allocations
    for _ in range(steps):
        w0, c0 = time.perf_counter(), time.process_time()
        step()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall) * 1e3, statistics.median(cpu) * 1e3


def calibration(again: bool) -> None:
    """What scenarios/real-model.yaml's `time_scale: auto` resolves to on this host (measured
    `again` if asked), and the load it was read under."""
    if again:
        os.environ[RECALIBRATE_ENV] = "1"
    scenario = load_scenario(ROOT / "scenarios" / "real-model.yaml")
    rp = prepare_run(scenario, RunOptions(progress=False))
    cal = rp.calibration or {}
    print()
    print(
        f"calibration ({cal.get('measured')}): prefill layer ms by prompt tokens "
        f"{cal.get('prefill_layer_ms')}, decode pass ms by context {cal.get('decode_pass_ms')}"
    )
    print(
        f"real-model.yaml time_scale: auto -> {rp.scenario.scale.time_scale:g} "
        f"(margin {cal.get('margin')}x; limited by {cal.get('limited_by')})"
    )
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context", type=int, default=148, help="prompt tokens per request")
    ap.add_argument("--steps", type=int, default=20, help="steps timed per measurement")
    ap.add_argument("--recalibrate", action="store_true", help="measure the host again")
    ap.add_argument("--report", type=Path, metavar="FILE", help="also write the tables here")
    args = ap.parse_args()
    setup = (
        f"torch {torch.__version__} on one thread; the tiny model, {args.context}-token "
        f"contexts, prompts seeded 0; calibration {'measured' if args.recalibrate else 'cached'}"
    )
    heading = "Batched decode and calibration"
    reported(args.report, "real_model_timing", heading, setup, lambda: measure(args))
    return 0


def measure(args: argparse.Namespace) -> None:
    """Print the decode step's cost against batch size, then the scenario's calibration."""
    torch.set_num_threads(1)
    model = TinyHybridLM(tiny_config(0))
    rng = random.Random(0)
    seqs: list[tuple[KVState, int]] = []
    for _ in range(max(BATCHES)):
        run = model.prefill([rng.randrange(model.config.vocab_size) for _ in range(args.context)])
        first = run.finish()
        seqs.append((run.state, first))
    print(f"decode step, {args.context}-token contexts (median of {args.steps} steps, ms)")
    print(f"{'batch':>5}  {'before wall':>11}  {'before cpu':>10}  {'after wall':>10}  "
          f"{'after cpu':>9}  {'cpu speed-up':>12}")  # fmt: skip
    for b in BATCHES:
        states = [s.copy() for s, _ in seqs[:b]]
        toks = [t for _, t in seqs[:b]]

        def before(states: list[KVState] = states, toks: list[int] = toks) -> None:
            for i, st in enumerate(states):
                toks[i] = _one_at_a_time(model, st, toks[i])

        batch = DecodeBatch(model)
        for i, (s, t) in enumerate(seqs[:b]):
            batch.add(i, s, t)
        bw, bc = _timed(before, args.steps)
        aw, ac = _timed(batch.step, args.steps)
        print(f"{b:>5}  {bw:>11.2f}  {bc:>10.2f}  {aw:>10.2f}  {ac:>9.2f}  {bc / ac:>11.1f}x")
    calibration(args.recalibrate)


if __name__ == "__main__":
    raise SystemExit(main())
