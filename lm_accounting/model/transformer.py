"""The CS336 assignment-1 pre-norm Transformer LM, built from a ``ModelConfig``.

Module paths are the course's state-dict names (handout 3.6), which the analytic
calculator uses as keys: ``token_embeddings``, ``layers.{i}.{ln1,attn,ln2,ffn}``,
``ln_final``, ``lm_head``.  Variants: grouped-query attention (Ainslie et al. 2023,
Llama 3), an explicit ``head_dim`` and per-head qk-norm (Qwen3), tied embeddings.
"""

from __future__ import annotations

import torch
from torch import nn

from lm_accounting.config import ModelConfig
from lm_accounting.model.layers import (
    Embedding,
    Linear,
    MatMul,
    RMSNorm,
    RotaryPositionalEmbedding,
    SwiGLU,
    scaled_dot_product_attention,
)

Tensor = torch.Tensor


class CausalSelfAttention(nn.Module):
    """Causal multi-head self-attention with RoPE on Q and K (handout 3.5.5).

    Q projects to ``num_heads·head_dim``, K and V to ``num_kv_heads·head_dim`` (GQA), the
    output projection maps ``num_heads·head_dim`` back to ``d_model``.  With ``qk_norm``
    an RMSNorm of size ``head_dim`` is applied to every query and key head *before* RoPE,
    as Qwen3 does.  ``qk`` and ``av`` are the two attention matmuls, as modules.
    """

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 qk_norm: bool = False, eps: float = 1e-5, device=None, dtype=None):
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} not divisible by num_kv_heads={num_kv_heads}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_proj = Linear(d_model, num_heads * head_dim, device=device, dtype=dtype)
        self.k_proj = Linear(d_model, num_kv_heads * head_dim, device=device, dtype=dtype)
        self.v_proj = Linear(d_model, num_kv_heads * head_dim, device=device, dtype=dtype)
        self.output_proj = Linear(num_heads * head_dim, d_model, device=device, dtype=dtype)
        if qk_norm:
            self.q_norm = RMSNorm(head_dim, eps=eps, device=device, dtype=dtype)
            self.k_norm = RMSNorm(head_dim, eps=eps, device=device, dtype=dtype)
        else:
            self.q_norm = self.k_norm = None
        self.qk = MatMul()
        self.av = MatMul()

    def _heads(self, t: Tensor, n: int) -> Tensor:
        """(..., S, n·head_dim) -> (..., n, S, head_dim), a view."""
        return t.view(*t.shape[:-1], n, self.head_dim).transpose(-3, -2)

    def forward(self, x: Tensor, rope: RotaryPositionalEmbedding, token_positions: Tensor,
                mask: Tensor | None) -> Tensor:
        """x: (..., S, d_model); token_positions: (S,) or (..., S); mask: bool (S, S), True = keep."""
        q = self._heads(self.q_proj(x), self.num_heads)  # (..., S, d) -> (..., h, S, head_dim)
        k = self._heads(self.k_proj(x), self.num_kv_heads)  # (..., S, d) -> (..., kv, S, head_dim)
        v = self._heads(self.v_proj(x), self.num_kv_heads)  # (..., S, d) -> (..., kv, S, head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if token_positions.dim() > 1:  # (..., S) -> (..., 1, S): broadcast over heads
            token_positions = token_positions.unsqueeze(-2)  # (..., S) -> (..., 1, S)
        q, k = rope(q, token_positions), rope(k, token_positions)
        out = scaled_dot_product_attention(q, k, v, mask, qk=self.qk, av=self.av)
        # (..., h, S, head_dim) -> (..., S, h, head_dim) -> (..., S, h·head_dim): heads merged (a copy)
        out = out.transpose(-3, -2).reshape(*x.shape[:-1], self.num_heads * self.head_dim)
        return self.output_proj(out)


class TransformerBlock(nn.Module):
    """Pre-norm block (handout 3.5): ``x + Attn(RMSNorm(x))``, then ``x + FFN(RMSNorm(x))``."""

    def __init__(self, cfg: ModelConfig, device=None, dtype=None):
        super().__init__()
        self.ln1 = RMSNorm(cfg.d_model, eps=cfg.norm_eps, device=device, dtype=dtype)
        self.attn = CausalSelfAttention(cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.d_head,
                                        cfg.qk_norm, cfg.norm_eps, device=device, dtype=dtype)
        self.ln2 = RMSNorm(cfg.d_model, eps=cfg.norm_eps, device=device, dtype=dtype)
        self.ffn = SwiGLU(cfg.d_model, cfg.d_ff, device=device, dtype=dtype)

    def forward(self, x: Tensor, rope: RotaryPositionalEmbedding, token_positions: Tensor,
                mask: Tensor | None) -> Tensor:
        x = x + self.attn(self.ln1(x), rope, token_positions, mask)
        return x + self.ffn(self.ln2(x))


class TransformerLM(nn.Module):
    """Embedding -> ``num_layers`` pre-norm blocks -> final RMSNorm -> LM head (handout 3.6).

    One RoPE table (``rope``, buffers only, not saved in the state dict) serves all layers,
    and one causal mask is built per forward.  With ``cfg.tie_embeddings`` the LM head
    reuses the embedding matrix (the same Parameter).
    """

    def __init__(self, cfg: ModelConfig, device=None, dtype=None):
        super().__init__()
        self.cfg = cfg
        self.token_embeddings = Embedding(cfg.vocab_size, cfg.d_model, device=device, dtype=dtype)
        self.layers = nn.ModuleList(
            TransformerBlock(cfg, device=device, dtype=dtype) for _ in range(cfg.num_layers)
        )
        self.ln_final = RMSNorm(cfg.d_model, eps=cfg.norm_eps, device=device, dtype=dtype)
        self.lm_head = Linear(cfg.d_model, cfg.vocab_size, device=device, dtype=dtype)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.token_embeddings.weight
        self.rope = RotaryPositionalEmbedding(cfg.rope_theta, cfg.d_head, cfg.context_length,
                                              device=device)

    def forward(self, token_ids: Tensor) -> Tensor:
        """token_ids (B, S) integer -> logits (B, S, vocab_size) in the parameters' dtype."""
        seq = token_ids.shape[-1]
        if seq > self.cfg.context_length:
            raise ValueError(f"sequence length {seq} exceeds context_length={self.cfg.context_length}")
        positions = torch.arange(seq, device=token_ids.device)
        mask = torch.ones(seq, seq, dtype=torch.bool, device=token_ids.device).tril()
        x = self.token_embeddings(token_ids)
        for block in self.layers:
            x = block(x, self.rope, positions, mask)
        return self.lm_head(self.ln_final(x))


def build_model(cfg: ModelConfig, device: str | torch.device = "meta",
                dtype: torch.dtype = torch.float32) -> TransformerLM:
    """The live model for ``cfg``; on ``meta`` (the default) it holds no real memory."""
    return TransformerLM(cfg, device=device, dtype=dtype)


def random_tokens(cfg: ModelConfig, batch: int, seq: int, device: str | torch.device = "meta",
                  seed: int = 0) -> Tensor:
    """A (batch, seq) LongTensor of token ids; uninitialised on ``meta``, seeded elsewhere."""
    if torch.device(device).type == "meta":
        return torch.empty(batch, seq, dtype=torch.long, device="meta")
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen).to(device)
