"""What the router, the runner and the checkers share to run `engine: torch` live; torch-free.

A live run of the tiny model needs three things every process agrees on, without importing
torch where it computes nothing (the router and the runner's planning step):

- the model: `tiny_config(seed, dtype)`, so every prefill and decode process builds the same
  weights (the KV header's fingerprint refuses KV from any other config);
- the prompts: `prompt_ids(seed, request_id, n)` draws a request's token ids from (scenario seed,
  request id, length) alone, so a run is reproducible and a checker can recompute, after the run,
  exactly the prompt the router sent, and compare the generated tokens with a single-process
  reference (`check_token_exact`);
- one clear line when torch is missing (`require_torch`);
- a time_scale the host can honour (`resolve_time_scale`): `auto` becomes the largest the
  calibrated compute allows (engine.torch.calibrate), a requested one above it is refused.
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from testbed.config import DeploymentConfig, ScaleConfig
from testbed.engine.torch.config import TinyConfig
from testbed.errors import UserError
from testbed.profiles import MODELS

if TYPE_CHECKING:
    from testbed.workload.generate import RequestSpec

__all__ = [
    "MODEL_EXTRA_HINT",
    "check_live_run",
    "ids_digest",
    "prompt_ids",
    "require_torch",
    "resolve_time_scale",
    "tiny_config",
]

MODEL_EXTRA_HINT = (
    "engine: torch needs torch, the optional model extra: "
    "pip install 'prfaas-testbed[model]' (or run `make test` once, which installs it)"
)


def tiny_config(seed: int = 0, dtype: str = "float32") -> TinyConfig:
    """The live model: TinyConfig defaults with the scenario's model seed and dtype."""
    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype must be float32 or float64, not {dtype!r}")
    return TinyConfig(seed=seed, dtype=dtype)  # type: ignore[arg-type]


def prompt_ids(seed: int, request_id: str, n_tokens: int, vocab_size: int) -> list[int]:
    """The prompt of one request: n_tokens ids drawn from (seed, request id, length).

    The request id is hashed (not parsed), so any id the router accepts works; the length is
    part of the key so a replayed id with another length gets another prompt. PCG64 streams
    are stable across numpy versions and platforms, so the checker recomputes the same ids.
    """
    if n_tokens < 1:
        raise ValueError("a prompt needs at least one token")
    key = int.from_bytes(hashlib.blake2b(request_id.encode(), digest_size=8).digest(), "little")
    rng = np.random.default_rng(np.random.SeedSequence([seed & 0xFFFFFFFF, key, n_tokens]))
    return [int(t) for t in rng.integers(0, vocab_size, n_tokens)]


def ids_digest(ids: Sequence[int]) -> str:
    """A short digest of token ids, recorded so a checker can confirm it rebuilt the same prompt."""
    raw = b"".join(int(t).to_bytes(4, "little") for t in ids)
    return hashlib.blake2b(raw, digest_size=8).hexdigest()


def check_live_run(requests: Sequence[tuple[str, int, int]]) -> None:
    """Refuse, with one line, a torch run that cannot work: no torch, or a request (id, input,
    output tokens) longer than the model's context (trace lengths are only known once the trace
    is read, so the config check cannot catch them). Whether the substrate runs torch at all is
    its fact (testbed.substrates), asked by the run plan before this."""
    require_torch()
    ctx = TinyConfig().max_positions
    for rid, n_in, n_out in requests:
        if n_in + n_out > ctx:
            raise UserError(
                f"request {rid}: {n_in} prompt + {n_out} output tokens exceed the tiny model's "
                f"context of {ctx} positions (engine: torch); shorten the workload"
            )


def require_torch() -> None:
    """Raise a one-line UserError if torch cannot be imported (checked before anything starts)."""
    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a half-installed or deliberately blocked torch
        found = False
    if not found:
        raise UserError(MODEL_EXTRA_HINT)


def resolve_time_scale(
    scale: ScaleConfig,
    dep: DeploymentConfig,
    tpot_slo_s: float,
    threshold_tokens: float | None,
    requests: Sequence[RequestSpec],
) -> tuple[ScaleConfig, dict[str, Any]]:
    """The run's scale with `auto` resolved, and the calibration the report shows.

    Every prefill the run plans is checked on the hardware its route runs on (above the
    threshold: PrfaaS; both when the policy has no threshold), decode at the longest context and
    the largest batch. A requested time_scale above the largest that works is refused with one
    line naming it. Needs torch (calibration runs the model once per config and host, cached).
    """
    from testbed.engine.torch.batched import ROWS
    from testbed.engine.torch.calibrate import calibration_for, largest_time_scale

    cfg = tiny_config(dep.tiny_model.seed, dep.tiny_model.dtype)
    cal = calibration_for(cfg)
    profile = MODELS[dep.model]
    local_hw = dep.local.hardware
    remote_hw = dep.prfaas.hardware if dep.prfaas is not None else local_hw
    prefills: list[tuple[str, int]] = []
    for r in requests:
        if dep.kind == "naive":
            hws = [remote_hw]
        elif dep.kind == "homogeneous":
            hws = [local_hw]
        elif threshold_tokens is None:
            hws = [local_hw, remote_hw]
        else:
            hws = [remote_hw if r.input_tokens > threshold_tokens else local_hw]
        prefills += [(hw, r.input_tokens) for hw in hws]
    choice = largest_time_scale(
        cal,
        profile,
        cfg.n_layers,
        prefills,
        local_hw,
        profile.decode[local_hw].bs_max(tpot_slo_s),
        max(r.input_tokens + r.output_tokens for r in requests),
        ROWS,
    )
    if not scale.auto and scale.time_scale > choice.largest:
        raise UserError(
            f"scale.time_scale: {scale.time_scale:g} is more than this host can run the tiny "
            f"model at (engine: torch); the largest that works is {choice.largest:g} "
            f"(limited by {choice.limit}), or write `time_scale: auto`"
        )
    resolved = scale.resolved(choice.largest) if scale.auto else scale
    report = {
        "time_scale": resolved.time_scale,
        "requested": "auto" if scale.auto else scale.time_scale,
        **choice.to_json(),
        "prefill_layer_ms": {n: round(s * 1e3, 3) for n, s in cal.prefill_layer_s.items()},
        "decode_pass_ms": {n: round(s * 1e3, 3) for n, s in cal.decode_pass_s.items()},
        "measured": "cached " + cal.measured_at if cal.cached else "now",
    }
    return resolved, report
