"""Batched decode of the tiny model: one pass for a whole batch gives every sequence exactly the
tokens it gets alone (the single-process reference), whatever the batch size, the row it sits
in, the other sequences' lengths, or when it joins and leaves. Needs torch (`model` marker)."""

from __future__ import annotations

import random

import pytest

try:
    import torch
except ImportError as exc:  # fail, do not skip: CI installs the model extra for these tests
    raise ImportError(
        "the torch tests need torch: pip install -e '.[dev,model]' (or `make test`)"
    ) from exc

from testbed.engine.torch.batched import BLOCK, ROWS, DecodeBatch
from testbed.engine.torch.config import TinyConfig
from testbed.engine.torch.kvstate import KVState
from testbed.engine.torch.model import TinyHybridLM

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def model() -> TinyHybridLM:
    torch.set_num_threads(1)
    return TinyHybridLM(TinyConfig(seed=5))


def _prefilled(model: TinyHybridLM, n: int, seed: int) -> tuple[KVState, int]:
    rng = random.Random(seed)
    run = model.prefill([rng.randrange(model.config.vocab_size) for _ in range(n)])
    for _ in run:
        pass
    assert run.first_token is not None
    return run.state, run.first_token


def test_any_batch_gives_each_sequence_its_single_sequence_tokens(model: TinyHybridLM) -> None:
    # lengths on both sides of block boundaries, so the batch's blocks are ragged
    lengths = [3, 17, BLOCK - 1, BLOCK, BLOCK + 1, 100, 2 * BLOCK, 200, 5, 33, 150, 64, 77, 9]
    seqs = [_prefilled(model, n, i) for i, n in enumerate(lengths)]
    n_out = 6
    alone = [model.decode(state, tok, n_out) for state, tok in seqs]
    rng = random.Random(0)
    for trial in range(2):  # sequences join at random steps, in random rows, and leave
        batch = DecodeBatch(model)
        order = list(range(len(seqs)))
        rng.shuffle(order)
        outs: dict[int, list[int]] = {}
        rows: dict[int, int] = {}
        while order or rows:
            for _ in range(rng.randint(0, 4)):
                if order:
                    i = order.pop()
                    rows[i] = batch.add(i, seqs[i][0], seqs[i][1])
                    outs[i] = [seqs[i][1]]
            if not rows:
                continue
            step = batch.step()
            for i, row in list(rows.items()):
                outs[i].append(step[row])
                if len(outs[i]) == n_out:
                    batch.remove(row)
                    del rows[i]
        assert [outs[i] for i in range(len(seqs))] == alone, trial


def test_a_full_pass_of_rows_is_exact_and_the_row_state_round_trips(model: TinyHybridLM) -> None:
    seqs = [_prefilled(model, 10 + 7 * i, 100 + i) for i in range(ROWS)]
    batch = DecodeBatch(model)
    rows = [batch.add(i, s, t) for i, (s, t) in enumerate(seqs)]
    assert batch.free_rows() == 0
    with pytest.raises(ValueError):
        batch.add(99, *seqs[0])
    first = batch.step()
    for (state, tok), row in zip(seqs, rows, strict=True):
        assert model.decode(state, tok, 2)[1] == first[row]
        after = batch.state(row)
        assert after.n_tokens == state.n_tokens + 1
        for layer in state.latents:  # the cached rows are the received ones, bit for bit
            assert torch.equal(after.latent_rows(layer)[:-1], state.latent_rows(layer))


def test_batched_decode_is_the_same_maths_as_the_prefill_path() -> None:
    """In float64 the batched (absorbed-MLA) decode gives the tokens a prefill of the longer
    prompt gives: decoding is the model's maths, not a different model."""
    m = TinyHybridLM(TinyConfig(dtype="float64", seed=2))
    rng = random.Random(4)
    prompt = [rng.randrange(512) for _ in range(70)]
    state, tok = _prefilled_tokens(m, prompt)
    out = m.decode(state, tok, 4)
    for k in range(1, 4):  # token k is the greedy next token after prompt + out[:k]
        _, nxt = _prefilled_tokens(m, [*prompt, *out[:k]])
        assert nxt == out[k]


def _prefilled_tokens(model: TinyHybridLM, tokens: list[int]) -> tuple[KVState, int]:
    run = model.prefill(tokens)
    for _ in run:
        pass
    assert run.first_token is not None
    return run.state, run.first_token


def test_a_context_that_is_full_is_refused(model: TinyHybridLM) -> None:
    state, tok = _prefilled(model, 4, 1)
    full = KVState(model.config.max_positions, state.linear, state.latents)
    with pytest.raises(ValueError, match="context is full"):
        DecodeBatch(model).add(0, full, tok)
