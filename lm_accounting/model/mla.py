"""Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434 §2.1; DeepSeek-V3), as transformers v5's
``DeepseekV3Attention`` computes it, under the component registry's module paths.

Queries: ``q_proj`` (d -> h·(d_nope + d_rope)), or with ``q_lora_rank`` the low-rank pair
``q_a_proj`` (d -> r_q), ``q_a_norm`` (RMSNorm r_q), ``q_b_proj`` (r_q -> h·(d_nope + d_rope)).
Keys and values: ``kv_a_proj`` (d -> r_kv + d_rope: the latent and one RoPE key shared by every head),
``kv_a_norm`` (RMSNorm r_kv), ``kv_b_proj`` (r_kv -> h·(d_nope + d_v)).  RoPE rotates the last d_rope
dimensions of each query head and the shared key; the attention is ordinary multi-head attention with
q/k heads of d_nope + d_rope and value heads of d_v, scaled by 1/√(d_nope + d_rope) (the yarn mscale of
DeepSeek-V3's long-context RoPE changes this constant, not the counts), then ``output_proj``
(h·d_v -> d).  This is the training-time form: keys and values are expanded from the latent (the
"absorbed" inference form multiplies W_UK into the queries instead; same cache, other FLOPs).

The absorbed form (DeepSeek-V2 §2.1.2; vLLM's ``MLACommonImpl``, FlashMLA) runs a decode step when the cache
asks for it (``StaticKVCache(absorbed=True)``, infer's engine program): with ``kv_b_proj``'s weight viewed as
W_UK (h, d_nope, r) and W_UV (h, d_v, r), each head scores [q_nope·W_UK, q_rope] against the cached [latent,
RoPE key] (``qk``: 2·h·(r + d_rope) FLOPs a key), takes the probabilities over the latent (``av``: 2·h·r a
key), and maps the result out through W_UV; ``absorb_q`` and ``absorb_o`` are the two per-token products,
2·h·r·(d_nope + d_v) together: ``kv_b_proj``'s FLOPs on one token.  The same logits as the expanded form.
"""

from __future__ import annotations

import torch
from torch import nn

from lm_accounting.config import ModelConfig
from lm_accounting.model.layers import (
    FusedAttention,
    Linear,
    MatMul,
    RMSNorm,
    RotaryPositionalEmbedding,
    scaled_dot_product_attention,
)

Tensor = torch.Tensor


class LatentAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, device=None, dtype=None, attention: str = "naive"):
        super().__init__()
        h, d = cfg.num_heads, cfg.d_model
        self.h, self.d_nope, self.d_rope, self.d_v = h, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.r_kv = cfg.kv_lora_rank
        kw = dict(device=device, dtype=dtype)
        if cfg.q_lora_rank is None:
            self.q_proj = Linear(d, cfg.q_dim, **kw)
        else:
            self.q_a_proj = Linear(d, cfg.q_lora_rank, **kw)
            self.q_a_norm = RMSNorm(cfg.q_lora_rank, eps=cfg.norm_eps, **kw)
            self.q_b_proj = Linear(cfg.q_lora_rank, cfg.q_dim, **kw)
        self.kv_a_proj = Linear(d, self.r_kv + self.d_rope, **kw)
        self.kv_a_norm = RMSNorm(self.r_kv, eps=cfg.norm_eps, **kw)
        self.kv_b_proj = Linear(self.r_kv, h * (self.d_nope + self.d_v), **kw)
        self.output_proj = Linear(h * self.d_v, d, **kw)
        if attention == "sdpa":
            self.sdpa = FusedAttention()
        else:
            self.qk = MatMul()
            self.av = MatMul()
        self.absorb_q = MatMul()  # the absorbed decode's q_nope · W_UK and latent output · W_UVᵀ (module docstring)
        self.absorb_o = MatMul()

    def _queries(self, x: Tensor) -> Tensor:
        if hasattr(self, "q_proj"):
            return self.q_proj(x)
        return self.q_b_proj(self.q_a_norm(self.q_a_proj(x)))

    def forward(
        self,
        x: Tensor,
        rope: RotaryPositionalEmbedding,
        token_positions: Tensor,
        mask: Tensor | None,
        cache=None,
    ) -> Tensor:
        """x (..., S, d); token_positions (S,) or (..., S); mask bool (S, S), True = keep.  ``cache`` (inference,
        ``model.kv_cache.LayerCache``): the normed latent (..., 1, S, r_kv) and the rotated RoPE key
        (..., 1, S, d_rope) are what is cached, as transformers v5 does; keys and values are expanded from
        every cached position by ``kv_b_proj`` at each step."""
        *lead, s, _ = x.shape
        h, dn, dr, dv = self.h, self.d_nope, self.d_rope, self.d_v
        q = self._queries(x).view(*lead, s, h, dn + dr).transpose(-3, -2)  # (..., S, h·(dn+dr)) -> (..., h, S, dn+dr)
        q_nope, q_rope = q.split([dn, dr], dim=-1)  # (..., h, S, dn), (..., h, S, dr)
        latent, k_rope = self.kv_a_proj(x).split([self.r_kv, dr], dim=-1)  # (..., S, r_kv), (..., S, dr)
        if token_positions.dim() > 1:
            token_positions = token_positions.unsqueeze(-2)  # (..., S) -> (..., 1, S): broadcast over heads
        q_rope = rope(q_rope, token_positions)
        latent = self.kv_a_norm(latent).unsqueeze(-3)  # (..., S, r_kv) -> (..., 1, S, r_kv): one "head"
        k_rope = rope(k_rope.unsqueeze(-3), token_positions)  # (..., S, dr) -> (..., 1, S, dr): one shared head
        if cache is not None:  # inference: store this step's latents, attend over every cached one
            decoding = cache.owner.length > 0
            latent, k_rope, mask = cache.update(latent, k_rope, mask)
            if decoding and cache.owner.absorbed:
                return self._absorbed(q_nope, q_rope, latent, k_rope, mask, lead, s)
        n = latent.shape[-2]  # keys attended over: S, or the cached positions
        kv = self.kv_b_proj(latent.squeeze(-3))  # (..., n, r_kv) -> (..., n, h·(dn+dv))
        kv = kv.view(*lead, n, h, dn + dv).transpose(-3, -2)  # -> (..., h, n, dn+dv)
        k_nope, v = kv.split([dn, dv], dim=-1)  # (..., h, n, dn), (..., h, n, dv)
        q = torch.cat([q_nope, q_rope], dim=-1)  # (..., h, S, dn+dr)
        k = torch.cat([k_nope, k_rope.expand(*k_nope.shape[:-1], dr)], dim=-1)  # (..., h, n, dn+dr)
        if hasattr(self, "sdpa"):
            out = self.sdpa(q, k, v)  # (..., h, S, dv)
        else:
            out = scaled_dot_product_attention(q, k, v, mask, qk=self.qk, av=self.av)  # (..., h, S, dv)
        out = out.transpose(-3, -2).reshape(*lead, s, h * dv)  # (..., h, S, dv) -> (..., S, h·dv)
        return self.output_proj(out)

    def _absorbed(self, q_nope, q_rope, latent, k_rope, mask, lead, s) -> Tensor:
        """A decode step over the cached latent (module docstring); latent (..., 1, n, r), k_rope (..., 1, n, dr)."""
        h, dn, dr, dv, r = self.h, self.d_nope, self.d_rope, self.d_v, self.r_kv
        # inference only (no_grad): detached, since a view of a Parameter made under no_grad has no grad_fn,
        # which the FLOP counter's module tracker requires of every tensor argument that requires grad
        w = self.kv_b_proj.weight.detach().view(h, dn + dv, r)  # (h·(dn+dv), r) -> (h, dn+dv, r)
        w_uk, w_uv = w.split([dn, dv], dim=1)  # (h, dn, r), (h, dv, r)
        q_latent = self.absorb_q(q_nope, w_uk)  # (..., h, S, dn) @ (h, dn, r) -> (..., h, S, r)
        q = torch.cat([q_latent, q_rope], dim=-1)  # (..., h, S, r + dr)
        k = torch.cat([latent, k_rope], dim=-1)  # (..., 1, n, r + dr): one head, shared
        qk, av = getattr(self, "qk", torch.matmul), getattr(self, "av", torch.matmul)  # sdpa: no QKᵀ module
        scores = qk(q, k.transpose(-2, -1)) * (dn + dr) ** -0.5  # (..., h, S, n)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        out = av(scores.softmax(dim=-1), latent)  # (..., h, S, n) @ (..., 1, n, r) -> (..., h, S, r)
        out = self.absorb_o(out, w_uv.transpose(-2, -1))  # (..., h, S, r) @ (h, r, dv) -> (..., h, S, dv)
        out = out.transpose(-3, -2).reshape(*lead, s, h * dv)  # (..., h, S, dv) -> (..., S, h·dv)
        return self.output_proj(out)
