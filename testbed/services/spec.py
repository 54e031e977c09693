"""What a service process is told at start: its role, identity, profiles and the run's clock.

Passed as one JSON argument so the local and compose substrates start services the same way.
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from testbed.config.policy import PolicyConfig
from testbed.config.profiles import ProfileFile
from testbed.scheduler.spec import SchedulerSpec

__all__ = ["InstanceInfo", "SchedulerSpec", "ServiceSpec"]


class InstanceInfo(BaseModel):
    """Where the router finds an instance."""

    model_config = ConfigDict(frozen=True)

    id: str
    cluster: Literal["prfaas", "local"]
    role: Literal["prefill", "decode"]
    url: str
    switchable: bool = False
    """A role-switchable PD instance (services/pd.py): `url` is its base address; the router
    serves the active role under PREFILL_PREFIX or DECODE_PREFIX."""
    kv_host: str | None = None
    kv_port: int | None = None
    kv_link_host: str | None = None
    """Where cross-datacenter senders reach this decode instance's KV port (the link proxy)."""
    kv_link_port: int | None = None
    hardware: str | None = None
    """Its hardware profile: the router's snapshot gives each cluster's T_prefill curve."""


class ServiceSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["router", "prefill", "decode", "pd"]
    id: str
    cluster: Literal["prfaas", "local"] = "local"
    hardware: str = "h20x8"
    model: str = "internal-1t-hybrid"
    time_scale: float = Field(1.0, gt=0)
    byte_scale: float = Field(1.0, gt=0)
    t0: float = Field(default_factory=time.monotonic, description="run start, time.monotonic()")
    """The run's epoch: with time_scale, every process builds the same clock from it
    (testbed.clock.LiveClock.of)."""
    host: str = "127.0.0.1"
    port: int = 0
    kv_port: int = 0
    connections: int = 4
    tpot_slo_s: float = 0.025
    kv_timeout_s: float = 120.0
    """Wall seconds a decode instance waits for a request's KV before failing it."""
    kv_targets: list[tuple[str, int]] | None = None
    """prefill and pd: the KV receivers (host, port) this instance may send KV to: the
    deployment's decode KV ports and link routes (services/kv_targets.py). None: not known when
    it starts (pd instances start with the decode ones); the first POST /targets sets them."""
    profiles: list[ProfileFile] = Field(default_factory=list)
    """User model/hardware profiles the scenario brought (testbed.config.profiles): every
    process registers them at start, so `model` and `hardware` may name them."""
    kv_netns: str | None = None
    """prefill (PrfaaS cluster) with `link.shaper: tc` on the local substrate: the network
    namespace its KV connections are opened in, the PrfaaS side of the kernel-shaped veth
    (testbed.transfer.netns); None: this process's own namespace."""
    engine: Literal["emulated", "torch"] = "emulated"
    """torch: prefill and decode run the tiny real model (testbed.services.engines.torch); the
    router sends token ids and records the generated ones."""
    model_seed: int = 0
    model_dtype: Literal["float32", "float64"] = "float32"
    """The tiny model's weights seed and dtype: every process of a run must build the same."""
    prompt_seed: int = 0
    """engine: torch: the router draws each prompt from (prompt_seed, request id, length)."""
    unsafe_skip_kv_verify: bool = False
    """TEST-ONLY, never set by a scenario: decode admits requests without waiting for their KV
    or its checksums, so the chaos tests can show the no_unverified_decode and kv_accounted
    checkers catching a broken receiver (tests/chaos/test_broken_variants.py)."""
    unsafe_fail_prefill: bool = False
    """TEST-ONLY, never set by a scenario: prefill answers every request with an error at once
    (nothing computed, no KV sent): a deployment that cannot serve, so the chaos tests can show
    every scenario's own checkers catching it (tests/chaos/test_broken_variants.py)."""
    flush_interval_s: float = Field(0.05, ge=0)
    """decode, emulated engine: wall seconds of tokens the batcher coalesces into one streamed
    chunk; 0 streams every step's token as it is produced (`testbed up`, so a client's
    inter-token latency is the engine's)."""
    initial_role: Literal["prefill", "decode"] = "decode"
    """pd only: the role a switchable PD instance serves first."""
    role_switch_s: float = Field(5.0, ge=0)
    """pd only: real-world seconds a role switch takes (see docs/scheduler.md)."""
    facade: Literal["sglang", "vllm"] | None = None
    """prefill and decode: the router-facing worker API this instance also serves, for an
    external router run unchanged in front of the fleet (services.facade, docs/real-routers.md):
    `sglang`, SGLang's gateway's PD handshake (prefill and decode at once, meeting by bootstrap
    room); `vllm`, vllm-router's (prefill first, its kv_transfer_params handed to the decode,
    which pulls the held KV). None (the default): only our own router's API."""
    facade_decodes: list[InstanceInfo] = Field(default_factory=list)
    """prefill with a facade: the deployment's decode instances (cluster, KV port, link route),
    so the bootstrap route sends a room's KV to the direct or the link address as our router
    would (services.facade.rooms)."""
    # router only
    policy: str = "prfaas-static"
    policy_config: PolicyConfig | None = None
    """The scenario's `policy` section: a policy's own knobs (testbed.policy.make_policy)."""
    threshold_tokens: float | None = None
    instances: list[InstanceInfo] = Field(default_factory=list)
    request_timeout_s: float = 600.0
    scheduler: SchedulerSpec | None = None
    """Inputs of the short-term loop (policies that re-plan at run time)."""
    keeper_token: str | None = Field(None, min_length=16, max_length=128)
    """`testbed up`: the run's random secret a records keeper must send (header
    `X-Testbed-Keeper-Token`) to hold answers until their records are on disk
    (services.router.recorded); None (`testbed run`): no reader can be a keeper."""
    prefix_cache_bytes: dict[Literal["prfaas", "local"], float] | None = None
    """Real bytes of prefix cache per cluster for the global KVCache manager
    (testbed.kvcache.manager); None: no prefix cache, every request prefills in full."""
