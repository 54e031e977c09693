"""The tiny real model: the hybrid layout, chunk-independent maths, bit-exact cache hits and a
lossless KV codec. Needs torch (the `model` extra); without it these fail at import, loudly."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

try:
    import torch
except ImportError as exc:  # fail, do not skip: CI installs the model extra for these tests
    raise ImportError(
        "the torch tests need torch: pip install -e '.[dev,model]' (or `make test`)"
    ) from exc

from testbed.clock import LiveClock
from testbed.engine.torch import (
    CpuPacer,
    KVFormatError,
    KVState,
    PrefillRun,
    ProfileBudget,
    TinyConfig,
    TinyHybridLM,
    TorchDecodeEngine,
    TorchPrefillEngine,
    TorchPrefixCache,
    decode_layers,
    encode_layer,
    generate,
)
from testbed.engine.torch import __all__ as exported
from testbed.engine.torch.prefix import block_hash_ids
from testbed.profiles import MODELS

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def model() -> TinyHybridLM:
    return TinyHybridLM(TinyConfig(seed=3))


def _prompt(n: int, seed: int, vocab: int = 512) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def _prefill(
    model: TinyHybridLM,
    tokens: list[int],
    state: KVState | None = None,
    snapshot_at: int | None = None,
) -> PrefillRun:
    run = model.prefill(tokens, state, snapshot_at=snapshot_at)
    for _ in run:
        pass
    return run


def test_every_export_resolves() -> None:
    import testbed.engine.torch as pkg

    for name in exported:
        assert getattr(pkg, name) is not None


def test_layout_mirrors_the_paper_three_linear_to_one_full() -> None:
    cfg = TinyConfig()
    assert cfg.layer_kinds == ("linear",) * 3 + ("full",) + ("linear",) * 3 + ("full",)
    assert TinyConfig(full_every=2).layer_kinds.count("full") == 4
    # linear layers carry a fixed state; full layers grow by the latent width per token
    short, long = cfg.layer_sizes(0, 10), cfg.layer_sizes(0, 1000)
    for kind, a, b in zip(cfg.layer_kinds, short, long, strict=True):
        if kind == "linear":
            assert a == b
        else:
            assert b - a == 990 * cfg.latent_width * cfg.itemsize


def test_linear_state_tensor_is_fixed_size_and_latents_grow(model: TinyHybridLM) -> None:
    a = _prefill(model, _prompt(20, 1)).state
    b = _prefill(model, _prompt(70, 1)).state
    for layer in a.linear:
        assert a.linear[layer].shape == b.linear[layer].shape
    for layer in a.latents:
        assert a.latent_rows(layer).shape[0] == 20
        assert b.latent_rows(layer).shape[0] == 70


def test_greedy_generation_is_deterministic_and_context_dependent(model: TinyHybridLM) -> None:
    p = _prompt(40, 2)
    out = generate(model, p, 12)
    assert out == generate(TinyHybridLM(TinyConfig(seed=3)), p, 12)
    assert len(out) == 12 and len(set(out)) > 1
    assert generate(model, _prompt(40, 5), 12) != out


@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_chunked_prefill_is_the_same_maths(chunk: int) -> None:
    """Chunking changes the order of float operations only: in float64 the greedy tokens of
    any chunk size agree, so the chunked attention and recurrence are right, not just stable."""
    p = _prompt(50, 7)
    ref = generate(TinyHybridLM(TinyConfig(dtype="float64", chunk_tokens=16)), p, 10)
    assert generate(TinyHybridLM(TinyConfig(dtype="float64", chunk_tokens=chunk)), p, 10) == ref


def test_prefix_cache_hit_is_bit_identical_to_a_cold_prefill(model: TinyHybridLM) -> None:
    cfg = model.config
    cache = TorchPrefixCache(cfg, capacity_bytes=1 << 24, block_tokens=32)
    first = _prompt(70, 11)
    snap = cache.snapshot_point(len(first))
    run = _prefill(model, first, snapshot_at=snap)
    assert cache.store(first, run.state, run.snapshot) == 2
    longer = [*first, *_prompt(25, 12)]
    hit = cache.lookup(longer)
    assert hit.tokens == 64 and hit.state is not None
    warm = _prefill(model, longer, state=hit.state)
    cold = _prefill(model, longer)
    assert warm.start == 64 and cold.start == 0
    assert warm.first_token == cold.first_token
    for layer in cold.state.linear:
        assert torch.equal(warm.state.linear[layer], cold.state.linear[layer])
    for layer in cold.state.latents:
        assert torch.equal(warm.state.latent_rows(layer), cold.state.latent_rows(layer))
    assert warm.first_token is not None
    assert model.decode(warm.state, warm.first_token, 10) == generate(model, longer, 10)


def test_prefix_cache_refuses_blocks_that_are_not_chunk_aligned() -> None:
    with pytest.raises(ValueError, match="multiple"):
        TorchPrefixCache(TinyConfig(chunk_tokens=16), 1 << 20, block_tokens=24)


def test_prefix_cache_state_is_exact_length_only(model: TinyHybridLM) -> None:
    """The pool keeps a request's linear state at its last full block only: a prompt sharing
    fewer blocks has no state at its length and must miss (the paper's exact-match rule)."""
    cache = TorchPrefixCache(model.config, capacity_bytes=1 << 24, block_tokens=16)
    first = _prompt(64, 13)
    run = _prefill(model, first, snapshot_at=cache.snapshot_point(64))
    cache.store(first, run.state, run.snapshot)
    assert cache.lookup([*first[:32], *_prompt(20, 14)]).tokens == 0
    assert cache.lookup([*first, 1]).tokens == 64
    assert block_hash_ids(first, 16) == block_hash_ids([*first, 9, 9], 16)


def test_codec_round_trip_is_bit_exact(model: TinyHybridLM) -> None:
    cfg = model.config
    p = _prompt(45, 17)
    run = _prefill(model, p)
    layers = [bytearray(encode_layer(cfg, run.state, i)) for i in range(cfg.n_layers)]
    assert [len(b) for b in layers] == cfg.layer_sizes(0, 45)
    back = decode_layers(cfg, layers)
    assert back.n_tokens == 45
    for layer in run.state.linear:
        assert torch.equal(back.linear[layer], run.state.linear[layer])
    for layer in run.state.latents:
        assert torch.equal(back.latent_rows(layer), run.state.latent_rows(layer))
    assert run.first_token is not None
    assert model.decode(back, run.first_token, 8) == generate(model, p, 8)


def test_codec_sends_only_rows_the_decode_side_lacks(model: TinyHybridLM) -> None:
    """With kv_start, full layers carry only new latent rows; the decode side supplies the
    prefix from its own cache and still decodes exactly."""
    cfg = model.config
    cache = TorchPrefixCache(cfg, capacity_bytes=1 << 24, block_tokens=16)
    first = _prompt(48, 19)
    run = _prefill(model, first, snapshot_at=48)
    cache.store(first, run.state, run.snapshot)
    longer = [*first, *_prompt(10, 20)]
    full = _prefill(model, longer)
    layers = [encode_layer(cfg, full.state, i, start=48) for i in range(cfg.n_layers)]
    assert sum(map(len, layers)) < sum(cfg.layer_sizes(0, 58))
    prefix = cache.lookup(longer).state
    with pytest.raises(KVFormatError, match="prefix"):
        decode_layers(cfg, layers)
    state = decode_layers(cfg, layers, prefix)
    assert full.first_token is not None
    assert model.decode(state, full.first_token, 8) == generate(model, longer, 8)


def test_codec_refuses_kv_that_does_not_fit(model: TinyHybridLM) -> None:
    cfg = model.config
    run = _prefill(model, _prompt(20, 21))
    layers = [bytearray(encode_layer(cfg, run.state, i)) for i in range(cfg.n_layers)]
    with pytest.raises(KVFormatError, match="layers"):
        decode_layers(cfg, layers[:-1])
    with pytest.raises(KVFormatError, match="bytes"):
        decode_layers(cfg, [*layers[:-1], layers[-1][:-4]])
    with pytest.raises(KVFormatError, match="another model"):
        decode_layers(TinyConfig(seed=4), layers)
    swapped = [layers[1], layers[0], *layers[2:]]
    with pytest.raises(KVFormatError, match="header says layer"):
        decode_layers(cfg, swapped)


async def test_engines_pad_to_the_profile_and_record_late_steps(model: TinyHybridLM) -> None:
    budget = ProfileBudget(MODELS["internal-1t-hybrid"], "h200x8", "h20x8", model.config.n_layers)
    # time_scale 1e6: every budget is microseconds, so the CPU is always late
    fast = CpuPacer(LiveClock(time_scale=1e6))
    pre = TorchPrefillEngine(model, pacer=fast, budget=budget)
    res = await pre.run(_prompt(30, 23))
    st = fast.kinds["prefill_layer"]
    assert st.steps == model.config.n_layers and st.late_steps == st.steps and st.late_s > 0
    # time_scale 2: a prefill layer is ~25 ms of wall time, far above the compute
    slow = CpuPacer(LiveClock(time_scale=2.0))
    pre = TorchPrefillEngine(model, pacer=slow, budget=budget)
    t0 = time.monotonic()
    await pre.run(_prompt(30, 23))
    modelled = MODELS["internal-1t-hybrid"].prefill_time("h200x8", 30) / 2.0
    assert time.monotonic() - t0 >= modelled * 0.95
    assert slow.kinds["prefill_layer"].padded_steps > 0
    dec = TorchDecodeEngine(model, pacer=fast, budget=budget)
    out = await dec.generate(res.state, res.first_token, 4)
    assert len(out) == 4 and fast.kinds["decode_step"].steps == 3
    assert set(fast.stats()) == {"time_scale", "prefill_layer", "decode_step"}


async def test_prefill_emits_layers_in_order_while_computing(model: TinyHybridLM) -> None:
    seen: list[tuple[int, int, float]] = []

    async def sink(layer: int, data: bytes) -> None:
        seen.append((layer, len(data), time.monotonic()))
        await asyncio.sleep(0)

    res = await TorchPrefillEngine(model).run(_prompt(40, 29), sink)
    assert [s[0] for s in seen] == list(range(model.config.n_layers))
    assert [s[1] for s in seen] == model.config.layer_sizes(0, 40) == res.layer_sizes
