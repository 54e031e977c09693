"""A tiny hybrid-attention decoder with seeded random weights: real tensors, greedy decoding.

Layers (pre-norm residual blocks, each with a SwiGLU MLP) follow the paper's model family:
- linear attention, KDA style: a gated delta rule with a per-channel decay alpha_t,
      S_t = S_{t-1} Diag(alpha_t) (I - beta_t k_t k_t^T) + beta_t v_t k_t^T,   o_t = S_t q_t,
  so its whole memory of the prompt is the fixed-size matrix S (heads x d_v x d_k);
- full attention, MLA style: per token only a low-rank latent c_t (plus one small rotary key
  shared by the heads) is cached; keys and values are up-projected from the latents at attention
  time, so the cache grows by `latent_width` values per token per layer.

Why the code is shaped like this, not just "a model":
- Prefill runs layer by layer (all chunks through layer l, then layer l+1), so layer l's KV is
  final as soon as layer l is done and can be streamed while layer l+1 computes: the paper's
  layer-wise pipelining, with real tensors.
- Prefill is chunked on absolute positions (multiples of `chunk_tokens`). A prefill resumed from
  a cached block boundary therefore runs the very same tensor operations, on the same shapes and
  the same bytes, as the tail of a cold prefill, so the outputs are bit-identical by
  construction, not merely within a tolerance. Decode is batched (engine.torch.batched): one
  pass for a whole batch, built so a sequence gets the same bits in any batch. Rotary angles come
  from a table for the same reason (a vectorised cos and a scalar cos may differ in the last bit).
- Nothing is modified in place, so states and caches can share tensors safely.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from testbed.engine.torch.config import TinyConfig
from testbed.engine.torch.kvstate import KVState

__all__ = ["PrefillRun", "TinyHybridLM", "generate"]

_EPS = 1e-6
_GATE_BIAS = 3.0  # sigmoid(3) ~ 0.95: the linear layers' memory decays slowly by default


# Written out rather than F.rms_norm / F.normalize: at these sizes the fused kernels cost more
# in dispatch than the four elementwise ops do.
def _rms_norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + _EPS)


def _l2_norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + _EPS)


@dataclass
class _LinearWeights:
    wx: torch.Tensor  # d_model -> [q | k | v | alpha (heads x d_k each) | beta (heads)]
    wo: torch.Tensor


@dataclass
class _FullWeights:
    wx: torch.Tensor  # d_model -> [q (heads x (d_nope + d_rope)) | latent | rope key]
    wukv: torch.Tensor  # d_latent -> [k_nope (heads x d_nope) | v (heads x d_v)]
    wo: torch.Tensor


@dataclass
class _MlpWeights:
    w13: torch.Tensor  # d_model -> [gate | up]
    w2: torch.Tensor


@dataclass
class PrefillRun:
    """One prefill in progress: iterate to run it layer by layer (yields finished layers).

    After iteration: `state` holds the KV of every token, `first_token` the greedy first output
    token, `snapshot` the linear states at `snapshot_at` tokens (for a prefix cache), if asked.
    """

    model: TinyHybridLM
    tokens: list[int]
    state: KVState
    start: int
    """Tokens already covered by the state it started from (a prefix-cache hit), not computed."""
    snapshot_at: int | None = None
    first_token: int | None = None
    snapshot: dict[int, torch.Tensor] = field(default_factory=dict)

    def __iter__(self) -> Iterator[int]:
        return self.model._prefill_layers(self)

    def finish(self) -> int:
        """Run the prefill to its end (every layer); the first token."""
        for _ in self:
            pass
        assert self.first_token is not None
        return self.first_token


class TinyHybridLM:
    """The model: weights drawn from `config.seed`, CPU only, greedy decoding."""

    def __init__(self, config: TinyConfig | None = None) -> None:
        self.config = cfg = config or TinyConfig()
        self.dtype = getattr(torch, cfg.dtype)
        gen = torch.Generator().manual_seed(cfg.seed)

        def w(fan_in: int, fan_out: int, gain: float = 1.0) -> torch.Tensor:
            t = torch.randn(fan_in, fan_out, generator=gen, dtype=torch.float64)
            return (t * (gain / math.sqrt(fan_in))).to(self.dtype)

        d = cfg.d_model
        self.embed = torch.randn(cfg.vocab_size, d, generator=gen, dtype=torch.float64).to(
            self.dtype
        )
        self.mixers: list[_LinearWeights | _FullWeights] = []
        self.mlps: list[_MlpWeights] = []
        hl, dk = cfg.linear_heads, cfg.linear_head_dim
        hf = cfg.full_heads
        # Projections that read the same input are fused into one matrix: a tiny model's time
        # goes to per-op overhead, not to flops.
        for kind in cfg.layer_kinds:
            if kind == "linear":
                self.mixers.append(
                    _LinearWeights(
                        wx=torch.cat([w(d, 4 * hl * dk), w(d, hl)], dim=1),
                        wo=w(hl * dk, d, 0.5),
                    )
                )
            else:
                self.mixers.append(
                    _FullWeights(
                        wx=w(d, hf * (cfg.d_nope + cfg.d_rope) + cfg.d_latent + cfg.d_rope),
                        wukv=w(cfg.d_latent, hf * (cfg.d_nope + cfg.d_v)),
                        wo=w(hf * cfg.d_v, d, 0.5),
                    )
                )
            self.mlps.append(_MlpWeights(w13=w(d, 2 * cfg.d_ff), w2=w(cfg.d_ff, d, 0.5)))
        self.head = w(d, cfg.vocab_size, 4.0)
        half = cfg.d_rope // 2
        inv_freq = 1.0 / (10000.0 ** (torch.arange(half, dtype=torch.float64) / half))
        angles = torch.arange(cfg.max_positions, dtype=torch.float64)[:, None] * inv_freq
        self._cos = torch.cos(angles).to(self.dtype)
        self._sin = torch.sin(angles).to(self.dtype)

    # ------------------------------------------------------------------ public API

    def new_state(self) -> KVState:
        """The KV of zero tokens: zero recurrent states, no latent rows."""
        cfg = self.config
        state = KVState()
        for i, kind in enumerate(cfg.layer_kinds):
            if kind == "linear":
                state.linear[i] = torch.zeros(
                    cfg.linear_heads, cfg.linear_head_dim, cfg.linear_head_dim, dtype=self.dtype
                )
            else:
                state.latents[i] = []
        return state

    def prefill(
        self,
        tokens: Sequence[int],
        state: KVState | None = None,
        *,
        snapshot_at: int | None = None,
    ) -> PrefillRun:
        """Prefill `tokens` after `state` (the KV of tokens[:state.n_tokens], or nothing).

        Only tokens[state.n_tokens:] are computed. Iterate the result to run it.
        """
        cfg = self.config
        toks = [int(t) for t in tokens]
        start = 0 if state is None else state.n_tokens
        if not start < len(toks) <= cfg.max_positions:
            raise ValueError(
                f"need 1..{cfg.max_positions} tokens with at least one past the {start} cached"
            )
        if start % cfg.chunk_tokens:
            raise ValueError(f"cached length {start} is not a multiple of {cfg.chunk_tokens}")
        if any(not 0 <= t < cfg.vocab_size for t in toks):
            raise ValueError(f"token ids must be in 0..{cfg.vocab_size - 1}")
        run_state = self.new_state() if state is None else state.copy()
        return PrefillRun(self, toks, run_state, start, snapshot_at=snapshot_at)

    def decode(self, state: KVState, first_token: int, max_new_tokens: int) -> list[int]:
        """Greedy generation continuing from `state`: [first_token, ...], max_new_tokens long.

        A decode batch of one (engine.torch.batched): the very pass a live decode instance runs
        for a whole batch, so this single-process reference gives the bits a batched decode
        gives. `state` itself is not modified (the batch copies it).
        """
        from testbed.engine.torch.batched import DecodeBatch

        out = [int(first_token)]
        if max_new_tokens <= 1:
            return out[:max_new_tokens]
        batch = DecodeBatch(self)
        row = batch.add(out, state, out[0])
        while len(out) < max_new_tokens:
            out.append(batch.step()[row])
        return out

    # ------------------------------------------------------------------ internals

    def _prefill_layers(self, run: PrefillRun) -> Iterator[int]:
        cfg = self.config
        start, n = run.start, len(run.tokens)
        c = cfg.chunk_tokens
        bounds = [(a, min(a - a % c + c, n)) for a in range(start, n, c)]
        ids = torch.tensor(run.tokens, dtype=torch.long)
        hidden = [self.embed[ids[a:b]] for a, b in bounds]
        state = run.state
        snap = run.snapshot_at
        if snap is not None and snap == start:
            run.snapshot = dict(state.linear)
        for layer in range(cfg.n_layers):
            for i, (a, b) in enumerate(bounds):
                hidden[i] = self._block(layer, hidden[i], state, a)
                if snap == b and layer in state.linear:
                    run.snapshot[layer] = state.linear[layer]
            yield layer
        state.n_tokens = n
        run.first_token = self._greedy(hidden[-1][-1:])

    def _greedy(self, h: torch.Tensor) -> int:
        logits = _rms_norm(h[-1:]) @ self.head
        return int(torch.argmax(logits[0]).item())

    def _block(self, layer: int, h: torch.Tensor, state: KVState, pos: int) -> torch.Tensor:
        mixer = self.mixers[layer]
        x = _rms_norm(h)
        if isinstance(mixer, _LinearWeights):
            h = h + self._linear_attention(layer, mixer, x, state)
        else:
            h = h + self._full_attention(layer, mixer, x, state, pos)
        mlp = self.mlps[layer]
        x = _rms_norm(h)
        gate, up = (x @ mlp.w13).split(self.config.d_ff, dim=-1)
        return h + (torch.nn.functional.silu(gate) * up) @ mlp.w2

    def _linear_attention(
        self, layer: int, w: _LinearWeights, x: torch.Tensor, state: KVState
    ) -> torch.Tensor:
        cfg = self.config
        t, hl, dk = x.shape[0], cfg.linear_heads, cfg.linear_head_dim
        proj = x @ w.wx
        q, k, v, a = proj[:, : 4 * hl * dk].view(t, 4, hl, dk).unbind(1)
        q, k = _l2_norm(q), _l2_norm(k)
        beta = torch.sigmoid(proj[:, 4 * hl * dk :]).T  # (heads, t)
        # The chunk at once (WY form of the delta rule), not token by token: with G_i the
        # cumulative log decay, S_i = S_0 Diag(e^G_i) + sum_{j<=i} u_j (k_j * e^(G_i - G_j))^T,
        # and the u_j solve one unit-lower-triangular system. Decays enter only as
        # e^(G_i - G_j) with j <= i (never above 1), so long chunks stay finite.
        g = torch.cumsum(torch.nn.functional.logsigmoid(a + _GATE_BIAS), 0).transpose(0, 1)
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # (heads, t, dk)
        past = torch.tril(torch.ones(t, t, dtype=torch.bool))[None, :, :, None]
        decay = torch.exp((g[:, :, None, :] - g[:, None, :, :]).masked_fill(~past, -math.inf))
        kk = (k[:, :, None, :] * k[:, None, :, :] * decay).sum(-1)  # (heads, t_i, t_j)
        qk = (q[:, :, None, :] * k[:, None, :, :] * decay).sum(-1)
        eye = torch.eye(t, dtype=x.dtype)
        tri = eye + beta[:, :, None] * torch.tril(kk, diagonal=-1)
        s0 = state.linear[layer]  # (heads, d_v, d_k)
        gk = torch.exp(g)
        rhs = beta[:, :, None] * (v - torch.bmm(k * gk, s0.transpose(1, 2)))
        u = torch.linalg.solve_triangular(tri, rhs, upper=False, unitriangular=True)
        out = torch.bmm(q * gk, s0.transpose(1, 2)) + torch.bmm(qk, u)  # (heads, t, d_v)
        last = g[:, -1:, :]
        state.linear[layer] = s0 * torch.exp(last) + torch.bmm(
            u.transpose(1, 2), k * torch.exp(last - g)
        )
        return out.transpose(0, 1).reshape(t, hl * dk) @ w.wo

    def _full_attention(
        self, layer: int, w: _FullWeights, x: torch.Tensor, state: KVState, pos: int
    ) -> torch.Tensor:
        cfg = self.config
        t, hf = x.shape[0], cfg.full_heads
        dn, dr, dl = cfg.d_nope, cfg.d_rope, cfg.d_latent
        qd = hf * (dn + dr)
        proj = x @ w.wx
        latent = _rms_norm(proj[:, qd : qd + dl])
        k_rope = self._rotate(proj[:, qd + dl :], pos)  # (t, d_rope), shared by the heads
        state.latents[layer].append(torch.cat([latent, k_rope], dim=-1))
        rows = state.latent_rows(layer)  # (n, d_latent + d_rope): everything cached so far
        n = rows.shape[0]
        # Keys and values exist only now, up-projected from the cached latents (MLA).
        kv = rows[:, :dl] @ w.wukv
        k_nope = kv[:, : hf * dn].view(n, hf, dn)
        v = kv[:, hf * dn :].view(n, hf, cfg.d_v).transpose(0, 1)  # (heads, n, d_v)
        k = torch.cat([k_nope, rows[:, None, dl:].expand(n, hf, dr)], dim=-1).transpose(0, 1)
        q = proj[:, :qd].view(t, hf, dn + dr).transpose(0, 1)  # (heads, t, dn + dr)
        q = torch.cat([q[:, :, :dn], self._rotate(q[:, :, dn:], pos)], dim=-1)
        scores = (q @ k.transpose(1, 2)) * (1.0 / math.sqrt(dn + dr))  # (heads, t, n)
        if t > 1:  # a single query is the newest token: it may see every cached key
            future = torch.arange(n)[None, :] > torch.arange(pos, pos + t)[:, None]
            scores = scores.masked_fill(future, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v  # (heads, t, d_v)
        return out.transpose(0, 1).reshape(t, hf * cfg.d_v) @ w.wo

    def _rotate(self, x: torch.Tensor, pos: int) -> torch.Tensor:
        """Rotary embedding of the last dim for positions pos, pos+1, ... along dim -2."""
        t = x.shape[-2]
        cos, sin = self._cos[pos : pos + t], self._sin[pos : pos + t]
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def generate(model: TinyHybridLM, tokens: Sequence[int], max_new_tokens: int) -> list[int]:
    """Single-process greedy generation: the reference every remote path must reproduce."""
    run = model.prefill(tokens)
    first = run.finish()
    return model.decode(run.state, first, max_new_tokens)
