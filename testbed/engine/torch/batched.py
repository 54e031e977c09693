"""Batched decode for the tiny model: one forward pass per step for a whole decode batch.

The model is tiny, so a step costs per-op overhead, not flops: decoding 20 sequences one after
another costs 20 times the ops of one; stacking them costs the ops of one. `DecodeBatch` keeps
the KV of up to `ROWS` sequences in engine-owned tensors (row r is one sequence) and advances
them all with one pass.

Token-exact by construction, whatever the batch, the row, or the other sequences:
- **Fixed shapes.** Every pass computes all `ROWS` rows (unused rows run on zeros), so every
  matmul has the same M whether one or 32 sequences decode. BLAS results for a row can depend
  on M (measured: 3 of 32 values of M change some bits of a 64x258 product on this host); with M
  fixed they depend only on the row's own data. A batch larger than ROWS runs as several passes.
- **No scalar tails.** Every transcendental elementwise op runs on a multiple of 32 values
  (ROWS x the per-row size; attention's exp on blocks x rows x heads x BLOCK), so the vectorized
  kernels never hand a remainder to their scalar twins (a vector and a scalar sigmoid differ in
  the last bit), and no row's values depend on where the row sits. (+, -, x, / are correctly
  rounded either way.)
- **Attention over the occupied rows only**, so one long context does not cost its blocks for
  all ROWS rows: bmm and the block reductions work per (row, block), independent of how many
  rows take part (bmm results do not depend on the batch count; measured and tested).
- **Ragged contexts in fixed blocks.** Full-attention rows are cached in blocks of `BLOCK`
  tokens; scores and the attention-weighted sums are computed per block (one shape per block,
  batched over blocks: bmm results do not depend on the batch count) and then added block by
  block in a fixed order. A sequence shorter than the batch's longest sees only exact zeros in
  the extra blocks (exp(-inf) = 0), and x + 0 is x: a sequence alone gives the same bits as in
  any batch, so the single-process reference (`TinyHybridLM.decode`, a batch of one) is exact.
- **Absorbed MLA.** A decode query is folded through the key up-projection (q W_uk^T), so a step
  touches each cached latent once instead of up-projecting every cached row again: the same
  maths as the prefill path (float64 gives the same tokens), a different operation order.

The batch's tensors are the engine's own and updated in place; a request's `KVState` is copied
in (`add`) and never aliased, so prefix caches and transfer buffers stay immutable.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import torch

from testbed.engine.torch.config import TinyConfig
from testbed.engine.torch.kvstate import KVState

__all__ = ["BLOCK", "ROWS", "DecodeBatch"]

ROWS = 32
"""Rows of every decode pass (a multiple of 32: see the module docstring)."""
BLOCK = 64
"""Tokens per cached latent block of a full-attention layer."""
_EPS = 1e-6
_GATE_BIAS = 3.0


class _Model(Protocol):
    """What a pass reads of `model.TinyHybridLM` (a protocol: model.py imports this module)."""

    config: TinyConfig
    dtype: torch.dtype
    embed: torch.Tensor
    mixers: list[Any]
    mlps: list[Any]
    head: torch.Tensor
    _cos: torch.Tensor
    _sin: torch.Tensor


def _rms_norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + _EPS)


def _l2_norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + _EPS)


class DecodeBatch:
    """Up to ROWS sequences decoding together; `step()` feeds each its next input token."""

    def __init__(self, model: _Model) -> None:
        self.model = model
        cfg = model.config
        self.dtype = model.dtype
        self.rows: list[object | None] = [None] * ROWS
        """Who owns each row (any object; None is free)."""
        self.n = torch.zeros(ROWS, dtype=torch.long)
        """Tokens each row's KV covers (its next position)."""
        self.tokens = torch.zeros(ROWS, dtype=torch.long)
        """Each row's next input token."""
        hl, dk = cfg.linear_heads, cfg.linear_head_dim
        self.linear = {
            i: torch.zeros(ROWS, hl, dk, dk, dtype=self.dtype)
            for i, kind in enumerate(cfg.layer_kinds)
            if kind == "linear"
        }
        self.blocks = 1
        self._occupied = torch.zeros(1, dtype=torch.long)
        self.latents = {
            i: torch.zeros(self.blocks, ROWS, BLOCK, cfg.latent_width, dtype=self.dtype)
            for i, kind in enumerate(cfg.layer_kinds)
            if kind == "full"
        }
        # The key and value up-projections per head, laid out for bmm over heads.
        hf, dn, dl = cfg.full_heads, cfg.d_nope, cfg.d_latent
        self._wuk: dict[int, torch.Tensor] = {}
        self._wuv: dict[int, torch.Tensor] = {}
        for i in self.latents:
            wukv = model.mixers[i].wukv
            self._wuk[i] = wukv[:, : hf * dn].reshape(dl, hf, dn).permute(1, 2, 0).contiguous()
            self._wuv[i] = wukv[:, hf * dn :].reshape(dl, hf, cfg.d_v).permute(1, 0, 2).contiguous()

    # ------------------------------------------------------------------ membership

    def free_rows(self) -> int:
        return sum(1 for r in self.rows if r is None)

    def add(self, owner: object, state: KVState, token: int) -> int:
        """Copy `state` into a free row whose next input is `token`; return the row."""
        cfg = self.model.config
        if state.n_tokens >= cfg.max_positions:
            raise ValueError("context is full")
        row = self.rows.index(None)  # ValueError when full: callers check free_rows()
        self._grow(state.n_tokens + 1)
        for i, s in self.linear.items():
            s[row] = state.linear[i]
        for i, buf in self.latents.items():
            rows = state.latent_rows(i)
            nb = math.ceil(rows.shape[0] / BLOCK)
            pad = torch.zeros(nb * BLOCK, cfg.latent_width, dtype=self.dtype)
            pad[: rows.shape[0]] = rows
            buf[:, row] = 0.0
            buf[:nb, row] = pad.view(nb, BLOCK, cfg.latent_width)
        self.n[row] = state.n_tokens
        self.tokens[row] = int(token)
        self.rows[row] = owner
        return row

    def remove(self, row: int) -> None:
        self.rows[row] = None
        self.n[row] = 0
        self.tokens[row] = 0

    def state(self, row: int) -> KVState:
        """The KV of one row as a fresh KVState (tests, and single-sequence callers)."""
        n = int(self.n[row])
        out = KVState(n_tokens=n)
        for i, s in self.linear.items():
            out.linear[i] = s[row].clone()
        for i, buf in self.latents.items():
            out.latents[i] = [buf[:, row].reshape(-1, buf.shape[-1])[:n].clone()]
        return out

    def _grow(self, tokens: int) -> None:
        need = math.ceil(tokens / BLOCK)
        if need <= self.blocks:
            return
        for i, buf in self.latents.items():
            more = torch.zeros(need - self.blocks, *buf.shape[1:], dtype=self.dtype)
            self.latents[i] = torch.cat([buf, more])
        self.blocks = need

    # ------------------------------------------------------------------ the pass

    def step(self) -> list[int]:
        """Advance every occupied row by its input token; return each row's next token
        (free rows compute on zeros and their output means nothing)."""
        model, cfg = self.model, self.model.config
        live = [r for r, o in enumerate(self.rows) if o is not None]
        if live and int(self.n[live].max()) >= cfg.max_positions:
            raise ValueError("context is full")
        pos = self.n.clone()
        self._grow(int(pos.max()) + 1)
        nb = math.ceil((int(pos.max()) + 1) / BLOCK)  # blocks any row needs this step
        self._occupied = torch.tensor(live if live else [0], dtype=torch.long)
        h = model.embed[self.tokens]
        for layer in range(cfg.n_layers):
            x = _rms_norm(h)
            if layer in self.linear:
                h = h + self._linear(layer, x)
            else:
                h = h + self._full(layer, x, pos, nb)
            mlp = model.mlps[layer]
            x = _rms_norm(h)
            gate, up = (x @ mlp.w13).split(cfg.d_ff, dim=-1)
            h = h + (torch.nn.functional.silu(gate) * up) @ mlp.w2
        logits = _rms_norm(h) @ model.head
        nxt = torch.argmax(logits, dim=-1)
        occupied = torch.tensor([o is not None for o in self.rows])
        self.n = torch.where(occupied, pos + 1, pos)
        self.tokens = torch.where(occupied, nxt, self.tokens)
        return [int(t) for t in nxt.tolist()]

    def _linear(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        cfg = self.model.config
        w = self.model.mixers[layer]
        hl, dk = cfg.linear_heads, cfg.linear_head_dim
        proj = x @ w.wx
        q, k, v, a = proj[:, : 4 * hl * dk].view(ROWS, 4, hl, dk).unbind(1)
        q, k = _l2_norm(q), _l2_norm(k)
        beta = torch.sigmoid(proj[:, 4 * hl * dk :])[:, :, None, None]  # (rows, heads, 1, 1)
        alpha = torch.sigmoid(a + _GATE_BIAS)[:, :, None, :]
        # Elementwise products and per-row sums, not bmm: a batched bmm of ROWS x heads tiny
        # matrix-vector products costs ~1 us of dispatch per product; these are a few
        # fixed-shape ops for the whole batch.
        s = self.linear[layer] * alpha  # S Diag(alpha): decay each key channel
        sk = (s * k[:, :, None, :]).sum(-1)  # S k, (rows, heads, d_v)
        u = beta[..., 0] * (v - sk)  # beta (v - S k)
        s = s + u[:, :, :, None] * k[:, :, None, :]  # S (I - beta k k^T) + beta v k^T
        out = (s * q[:, :, None, :]).sum(-1)  # S q
        self.linear[layer] = s
        return out.reshape(ROWS, hl * dk) @ w.wo

    def _full(self, layer: int, x: torch.Tensor, pos: torch.Tensor, nb: int) -> torch.Tensor:
        model, cfg = self.model, self.model.config
        w = model.mixers[layer]
        hf, dn, dr, dl = cfg.full_heads, cfg.d_nope, cfg.d_rope, cfg.d_latent
        width = cfg.latent_width
        qd = hf * (dn + dr)
        proj = x @ w.wx
        cos, sin = model._cos[pos], model._sin[pos]  # (rows, d_rope / 2), gathered: exact
        latent = _rms_norm(proj[:, qd : qd + dl])
        k_rope = _rotate(proj[:, qd + dl :], cos, sin)
        buf = self.latents[layer]
        rows = torch.arange(ROWS)
        buf[pos // BLOCK, rows, pos % BLOCK] = torch.cat([latent, k_rope], dim=-1)
        q = proj[:, :qd].view(ROWS, hf, dn + dr)
        q_rope = _rotate(q[:, :, dn:], cos[:, None, :], sin[:, None, :])
        # absorbed: q_nope . (W_uk c) = (W_uk^T q_nope) . c, per head
        q_lat = torch.bmm(q[:, :, :dn].transpose(0, 1), self._wuk[layer]).transpose(0, 1)
        query = torch.cat([q_lat, q_rope], dim=-1) * (1.0 / math.sqrt(dn + dr))
        # Attention reads only the occupied rows (a long context in one row must not cost its
        # blocks for all ROWS): bmm and the block reductions are per (row, block), so they do
        # not depend on how many rows take part; exp runs on a multiple of 256 values.
        occ = self._occupied
        n_occ = int(occ.numel())
        ctx = buf[:nb, occ]  # (blocks, occupied rows, BLOCK, width)
        scores = torch.bmm(
            query[occ].expand(nb, n_occ, hf, width).reshape(nb * n_occ, hf, width),
            ctx.view(nb * n_occ, BLOCK, width).transpose(1, 2),
        ).view(nb, n_occ, hf, BLOCK)
        index = torch.arange(nb * BLOCK).view(nb, 1, 1, BLOCK)
        scores = scores.masked_fill(index > pos[occ].view(1, n_occ, 1, 1), float("-inf"))
        top = scores.amax(-1).amax(0)  # (rows, heads); a max is exact in any order
        e = torch.exp(scores - top[None, :, :, None])
        part_sum = e.sum(-1)  # (blocks, rows, heads): one fixed-length reduction per block
        part_ctx = torch.bmm(
            e.view(nb * n_occ, hf, BLOCK), ctx.view(nb * n_occ, BLOCK, width)
        ).view(nb, n_occ, hf, width)
        total, acc = part_sum[0], part_ctx[0]
        for b in range(1, nb):  # block by block, in order: extra blocks add exact zeros
            total = total + part_sum[b]
            acc = acc + part_ctx[b]
        attn = torch.zeros(ROWS, hf, dl, dtype=self.dtype)
        attn[occ] = acc[:, :, :dl] / total[:, :, None]  # (rows, heads, d_latent)
        out = torch.bmm(attn.transpose(0, 1), self._wuv[layer]).transpose(0, 1)
        return out.reshape(ROWS, hf * cfg.d_v) @ w.wo


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of the last dim with per-row angles (broadcast over the middle dims)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
