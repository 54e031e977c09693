"""`testbed verify-model --prompts N`: the real tiny model's KV path is token-exact.

torch is an optional extra (`prfaas-testbed[model]`), so this module imports it, and the model
engine, only when the command runs: `testbed --help` and every other subcommand work without it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from typing import Any

from testbed.errors import UserError
from testbed.units import UnitError, parse_bandwidth, parse_duration


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1 (a count), else one line naming the value."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return v


def _render(report: dict[str, Any]) -> str:
    n = report["prompts"]
    lines = [f"verify-model: {n} prompts, tiny hybrid model {report['model']['layers']}"]
    for key in (
        "token_exact",
        "prefix_hit_exact",
        "reset_retried_exact",
        "corrupt_detected",
        "corrupt_retried_exact",
    ):
        lines.append(f"  {key:<22} {report[key]}/{n}")
    lines.append(f"  {'elapsed':<22} {report['elapsed_s']}s")
    lines.extend(f"  FAILED: {f}" for f in report["failures"])
    lines.append("OK: every remote path is token-exact" if report["ok"] else "NOT EXACT")
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    try:
        import torch

        from testbed.engine.torch.config import TinyConfig
        from testbed.engine.torch.verify import VerifyOptions, run_verify
    except ImportError as exc:
        raise UserError(
            f"verify-model needs torch ({exc}); install the model extra: "
            "pip install 'prfaas-testbed[model]'"
        ) from None
    try:
        bandwidth = parse_bandwidth(args.bandwidth)
        latency_ms = round(parse_duration(args.latency) * 1000)
        jitter_ms = round(parse_duration(args.jitter) * 1000)
        opts = VerifyOptions(
            prompts=args.prompts,
            seed=args.seed,
            max_new_tokens=args.max_new_tokens,
            bandwidth=bandwidth,
            latency_ms=latency_ms,
            jitter_ms=jitter_ms,
            time_scale=args.time_scale,
            model=TinyConfig(dtype=args.dtype, seed=args.seed),
        )
    except (UnitError, ValueError) as exc:
        raise UserError(str(exc)) from None
    # The tiny model is all per-op overhead: a second intra-op thread only spins against the
    # event loop for the same cores. This process is ours, so set it here, not at import.
    torch.set_num_threads(1)
    # KVReceiver keeps ACKing into connections the link has just cut; asyncio then logs
    # "socket.send() raised exception." once per cut. Expected here, so keep stderr clean.
    logging.getLogger("asyncio").setLevel(logging.ERROR)
    report = asyncio.run(run_verify(opts))
    print(json.dumps(report, indent=2) if args.json else _render(report))
    return 0 if report["ok"] else 1


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "verify-model",
        help="check the real tiny model's remote prefill is token-exact (needs torch)",
        description="For N random prompts, compare single-process greedy generation with "
        "prefill -> KV bytes -> KVSender -> shaped link -> KVReceiver -> decode, also with a "
        "prefix-cache hit, a connection cut mid-transfer (retried) and a flipped byte (caught "
        "by the checksum). Exit code 0 only if everything is exact.",
    )
    p.add_argument("--prompts", type=positive_int, default=50, help="random prompts (50)")
    p.add_argument("--seed", type=int, default=0, help="prompts, weights and link jitter (0)")
    p.add_argument(
        "--max-new-tokens", type=positive_int, default=8, help="tokens generated per prompt (8)"
    )
    p.add_argument("--bandwidth", default="160Mbps", help="link cap, shared (160Mbps)")
    p.add_argument("--latency", default="5ms", help="one-way link latency (5ms)")
    p.add_argument("--jitter", default="2ms", help="+/- latency jitter (2ms)")
    p.add_argument(
        "--time-scale",
        type=float,
        default=10.0,
        help="pad steps to the paper profile's time / this (10; 0 = no pacing)",
    )
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--json", action="store_true", help="print the JSON report")
    p.set_defaults(func=_run)
