"""The CS336 assignment-1 pre-norm Transformer LM, built from a ``ModelConfig``.

Module paths are the course's state-dict names (handout 3.6), which the analytic
calculator uses as keys: ``token_embeddings``, ``layers.{i}.{ln1,attn,ln2,ffn}``,
``ln_final``, ``lm_head``.  Variants: grouped-query attention (Ainslie et al. 2023,
Llama 3), an explicit ``head_dim`` and per-head qk-norm (Qwen3), tied embeddings.

A ``TrainingSetup`` (lm_accounting.setup) picks the attention kernel, activation
checkpointing and autocast; the default setup runs exactly the course model's ops.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from lm_accounting.config import AccountingError, ModelConfig
from lm_accounting.model.autocast import CudaAutocast
from lm_accounting.model.layers import (
    Embedding,
    FusedAttention,
    Linear,
    MatMul,
    RMSNorm,
    RotaryPositionalEmbedding,
    SwiGLU,
    scaled_dot_product_attention,
)
from lm_accounting.names import TORCH_DTYPES
from lm_accounting.setup import TrainingSetup

Tensor = torch.Tensor
aten = torch.ops.aten

SELECTIVE_SAVED_OPS = frozenset(
    {
        # every matmul of the model (Linear: mm; QKᵀ and AV: bmm)
        aten.mm.default,
        aten.bmm.default,
        aten.addmm.default,
        aten._scaled_dot_product_flash_attention_for_cpu.default,  # fused attention (meta, cpu)
        aten._scaled_dot_product_flash_attention.default,  # fused attention (cuda)
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_cudnn_attention.default,
    }
)
"""Ops whose outputs selective checkpointing keeps; every other op of a block is recomputed."""


def selective_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """Selective-checkpoint policy (torch.utils.checkpoint): save matmul and fused-attention outputs."""
    return CheckpointPolicy.MUST_SAVE if op in SELECTIVE_SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


class CausalSelfAttention(nn.Module):
    """Causal multi-head self-attention with RoPE on Q and K (handout 3.5.5).

    Q projects to ``num_heads·head_dim``, K and V to ``num_kv_heads·head_dim`` (GQA), the
    output projection maps ``num_heads·head_dim`` back to ``d_model``.  With ``qk_norm``
    an RMSNorm of size ``head_dim`` is applied to every query and key head *before* RoPE,
    as Qwen3 does.  ``qk`` and ``av`` are the two attention matmuls, as modules; with
    ``attention="sdpa"`` one ``sdpa`` module (``FusedAttention``) replaces them.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        qk_norm: bool = False,
        eps: float = 1e-5,
        device=None,
        dtype=None,
        attention: str = "naive",
    ):
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
        if attention == "sdpa":
            self.sdpa = FusedAttention()
        else:
            self.qk = MatMul()
            self.av = MatMul()

    def _heads(self, t: Tensor, n: int) -> Tensor:
        """(..., S, n·head_dim) -> (..., n, S, head_dim), a view."""
        return t.view(*t.shape[:-1], n, self.head_dim).transpose(-3, -2)

    def forward(
        self, x: Tensor, rope: RotaryPositionalEmbedding, token_positions: Tensor, mask: Tensor | None
    ) -> Tensor:
        """x: (..., S, d_model); token_positions: (S,) or (..., S); mask: bool (S, S), True = keep."""
        q = self._heads(self.q_proj(x), self.num_heads)  # (..., S, d) -> (..., h, S, head_dim)
        k = self._heads(self.k_proj(x), self.num_kv_heads)  # (..., S, d) -> (..., kv, S, head_dim)
        v = self._heads(self.v_proj(x), self.num_kv_heads)  # (..., S, d) -> (..., kv, S, head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if token_positions.dim() > 1:  # (..., S) -> (..., 1, S): broadcast over heads
            token_positions = token_positions.unsqueeze(-2)  # (..., S) -> (..., 1, S)
        q, k = rope(q, token_positions), rope(k, token_positions)
        if hasattr(self, "sdpa"):  # causal by construction: mask is None
            out = self.sdpa(q, k, v)  # (..., h, S, head_dim)
        else:
            out = scaled_dot_product_attention(q, k, v, mask, qk=self.qk, av=self.av)
        # (..., h, S, head_dim) -> (..., S, h, head_dim) -> (..., S, h·head_dim): heads merged (a copy)
        out = out.transpose(-3, -2).reshape(*x.shape[:-1], self.num_heads * self.head_dim)
        return self.output_proj(out)


class TransformerBlock(nn.Module):
    """Pre-norm block (handout 3.5): ``x + Attn(RMSNorm(x))``, then ``x + FFN(RMSNorm(x))``."""

    def __init__(self, cfg: ModelConfig, device=None, dtype=None, attention: str = "naive"):
        super().__init__()
        self.ln1 = RMSNorm(cfg.d_model, eps=cfg.norm_eps, device=device, dtype=dtype)
        self.attn = CausalSelfAttention(
            cfg.d_model,
            cfg.num_heads,
            cfg.kv_heads,
            cfg.d_head,
            cfg.qk_norm,
            cfg.norm_eps,
            device=device,
            dtype=dtype,
            attention=attention,
        )
        self.ln2 = RMSNorm(cfg.d_model, eps=cfg.norm_eps, device=device, dtype=dtype)
        self.ffn = SwiGLU(cfg.d_model, cfg.d_ff, device=device, dtype=dtype)

    def forward(
        self, x: Tensor, rope: RotaryPositionalEmbedding, token_positions: Tensor, mask: Tensor | None
    ) -> Tensor:
        x = x + self.attn(self.ln1(x), rope, token_positions, mask)
        return x + self.ffn(self.ln2(x))


class TransformerLM(nn.Module):
    """Embedding -> ``num_layers`` pre-norm blocks -> final RMSNorm -> LM head (handout 3.6).

    One RoPE table (``rope``, buffers only, not saved in the state dict) serves all layers,
    and one causal mask is built per forward.  With ``cfg.tie_embeddings`` the LM head
    reuses the embedding matrix (the same Parameter).  ``setup`` (default: the course's
    naive attention, no checkpointing, no autocast) is described in ``lm_accounting.setup``.
    """

    def __init__(self, cfg: ModelConfig, device=None, dtype=None, setup: TrainingSetup | None = None):
        super().__init__()
        self.cfg = cfg
        self.setup = setup if setup is not None else TrainingSetup()
        self.token_embeddings = Embedding(cfg.vocab_size, cfg.d_model, device=device, dtype=dtype)
        self.layers = nn.ModuleList(
            TransformerBlock(cfg, device=device, dtype=dtype, attention=self.setup.attention)
            for _ in range(cfg.num_layers)
        )
        self.ln_final = RMSNorm(cfg.d_model, eps=cfg.norm_eps, device=device, dtype=dtype)
        self.lm_head = Linear(cfg.d_model, cfg.vocab_size, device=device, dtype=dtype)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.token_embeddings.weight
        self.rope = RotaryPositionalEmbedding(cfg.rope_theta, cfg.d_head, cfg.context_length, device=device)

    def forward(self, token_ids: Tensor) -> Tensor:
        """token_ids (B, S) integer -> logits (B, S, vocab_size) in the parameters' dtype
        (fp32 under amp-bf16: the bf16 logits are upcast, as transformers' ForCausalLMLoss does)."""
        seq = token_ids.shape[-1]
        if seq > self.cfg.context_length:
            raise ValueError(f"sequence length {seq} exceeds context_length={self.cfg.context_length}")
        positions = torch.arange(seq, device=token_ids.device)
        mask = None  # the fused kernel is causal by itself
        if self.setup.attention == "naive":
            mask = torch.ones(seq, seq, dtype=torch.bool, device=token_ids.device).tril()
        with self._autocast(token_ids.device):
            x = self.token_embeddings(token_ids)
            for block in self.layers:
                x = self._run_block(block, x, positions, mask)
            logits = self.lm_head(self.ln_final(x))
            return logits.float() if self.setup.autocast else logits

    def _autocast(self, device: torch.device):
        """bf16 autocast for amp-bf16: torch's own on cuda, CUDA's lists emulated on meta/cpu."""
        if not self.setup.autocast:
            return contextlib.nullcontext()
        if device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return CudaAutocast(torch.bfloat16)

    def _run_block(self, block: TransformerBlock, x: Tensor, positions: Tensor, mask: Tensor | None) -> Tensor:
        """One block, checkpointed as the setup says (non-reentrant; no RNG state to stash: no dropout)."""
        if self.setup.checkpoint == "none":
            return block(x, self.rope, positions, mask)

        def run(x: Tensor) -> Tensor:
            # the recompute in backward runs outside forward's autocast context: re-enter it
            # (torch.utils.checkpoint restores torch.autocast by itself; nesting changes nothing)
            with self._autocast(x.device):
                return block(x, self.rope, positions, mask)

        context = {}
        if self.setup.checkpoint == "selective":
            context["context_fn"] = functools.partial(create_selective_checkpoint_contexts, selective_policy)
        return checkpoint(run, x, use_reentrant=False, preserve_rng_state=False, **context)


def build_model(
    cfg: ModelConfig,
    device: str | torch.device = "meta",
    dtype: torch.dtype | None = None,
    setup: TrainingSetup | None = None,
) -> TransformerLM:
    """The live model for ``cfg``; on ``meta`` (the default) it holds no real memory.

    ``dtype`` is the parameters' dtype; left out, it is the setup's (bf16 for ``precision="bf16"``,
    else fp32).  A ``dtype`` that contradicts the setup is refused."""
    if setup is not None:
        wanted = getattr(torch, TORCH_DTYPES[setup.param_dtype])
        if dtype is not None and dtype != wanted:
            raise AccountingError(f"dtype {dtype} contradicts precision {setup.precision!r} (parameters in {wanted})")
        dtype = wanted
    return TransformerLM(cfg, device=device, dtype=dtype or torch.float32, setup=setup)


def random_tokens(cfg: ModelConfig, batch: int, seq: int, device: str | torch.device = "meta", seed: int = 0) -> Tensor:
    """A (batch, seq) LongTensor of token ids; uninitialised on ``meta``, seeded elsewhere."""
    if torch.device(device).type == "meta":
        return torch.empty(batch, seq, dtype=torch.long, device="meta")
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen).to(device)
