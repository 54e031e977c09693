"""The `sim` substrate: a scenario in virtual time, sharing the policies, the scheduler's loops,
the prefix cache, the workload, the nemesis, the checkers and the results pipeline with live runs
and modelling what live runs run: prefill queues and engines (the profiles' cost models),
continuous-batching decode, layer-wise KV transfers as flows sharing the link's bandwidth, and
worker faults. See docs/sim.md.

Modules: `loop` (the virtual-time asyncio loop and its Clock), `link` (fair-share flows and link
faults), `instances` (prefill FIFO, analytic decode batching), `cluster` (the router's view and
load accounting, the Cluster the scheduler loops see), `dispatch` (routing and retries),
`nemesis` (the NemesisContext of a simulated run), `run` (one run, start to records).
"""

from __future__ import annotations

from testbed.sim.loop import SimulationStalled, VirtualClock, VirtualLoop, run_virtual
from testbed.sim.run import SimInputs, SimOutput, refuse_unmodelled, simulate

__all__ = [
    "SimInputs",
    "SimOutput",
    "SimulationStalled",
    "VirtualClock",
    "VirtualLoop",
    "refuse_unmodelled",
    "run_virtual",
    "simulate",
]
