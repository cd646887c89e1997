"""The CS336 assignment-1 pre-norm Transformer LM, built from a ``ModelConfig``.

Module paths are the course's state-dict names (handout 3.6), which the analytic
calculator uses as keys: ``token_embeddings``, ``layers.{i}.{ln1,attn,ln2,ffn}``,
``ln_final``, ``lm_head``.  Variants: grouped-query attention (Ainslie et al. 2023,
Llama 3), an explicit ``head_dim`` and per-head qk-norm (Qwen3), tied embeddings.

Architecture options (``ModelConfig``, ``config.ARCHITECTURE_CHOICES``), each adding modules at
these paths and nothing to the course model (whose ops are unchanged, op for op):

* ``norm="layernorm"``: every norm is a ``LayerNorm`` (gain and bias);
* ``qkv_bias``/``output_bias``/``mlp_bias``: ``<projection>.bias`` (a ``Bias`` child of the ``Linear``);
* ``mlp="geglu"``: ``ffn.w1/w2/w3`` with GELU; ``mlp="gelu"``: ``ffn.fc``, ``ffn.proj`` (GPT-2); ``"relu"``,
  ``"relu2"``: the same two with ReLU (OPT) or squared ReLU (Nemotron);
* ``positions="learned"``: ``position_embeddings`` (after ``token_embeddings``), no RoPE table;
* ``norm_placement="sandwich"``: ``post_attn_norm`` after ``attn``, ``post_ffn_norm`` after ``ffn``
  (Gemma 2/3); ``"post"``: the same two and no ``ln1``/``ln2`` (OLMo-2);
* ``parallel_block``: attention and the FFN on the same block input, one residual sum (GPT-J, GPT-NeoX,
  Phi, Cohere); ``"one_norm"`` has no ``ln2``;
* ``norm_bias=False``: every LayerNorm has a gain and no bias (Cohere);
* ``qk_norm_scope="projection"``: ``attn.q_norm``/``k_norm`` over the whole projection (OLMo-2);
  ``"head_weights"``: per head with a gain of each head's own, ``(h, head_dim)`` (Cohere); with
  ``norm="layernorm"`` the q/k norms are LayerNorms (Phi's ``qk_layernorm``, Cohere's);
* ``sliding_window``: windowed layers get a banded causal mask (the matmuls are unchanged: the full
  square is computed and masked, as transformers' eager attention does);
* ``scale_embeddings``: token embeddings × √d_model (Gemma);
* ``rotary_dim`` (partial rotary): RoPE on the first ``rotary_dim`` of each Q and K head, split off and
  concatenated back (GLM-4.5, MiniMax-M2); no module;
* ``attention_sinks``: ``attn.sinks`` (gpt-oss), one logit per head as an extra softmax column (naive only);
* mixture-of-experts options (``model.moe``): ``moe.router.bias``, the experts' biases and clamped SwiGLU
  (gpt-oss), ``moe.shared_gate`` (Qwen2-MoE).

How transformers' fused projections map onto these paths: Phi-3's ``qkv_proj`` is our
``q_proj`` + ``k_proj`` + ``v_proj`` (rows [0, h·d_head), then kv·d_head each) and its ``gate_up_proj``
is ``w1`` + ``w3`` (gate rows first); GPT-2's ``c_attn`` is q/k/v the same way.  The matmuls are the
same multiply-adds, split: the parameters and 2·m·n·p FLOPs sum to the fused ones exactly.

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
    GeGLU,
    GeluMLP,
    Linear,
    MatMul,
    Relu2MLP,
    ReluMLP,
    RotaryPositionalEmbedding,
    Sinks,
    SwiGLU,
    alibi_slopes,
    make_norm,
    scaled_dot_product_attention,
)
from lm_accounting.model.mla import LatentAttention
from lm_accounting.model.moe import MixtureOfExperts
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


OP_SAC_SAVED_OPS = frozenset(
    {
        # torchtitan's ``_save_list`` (e7c0cae, torchtitan/models/llama3/parallelize_llama.py:218; the same mm rule
        # from Sep 2024 to Jun 2025): mm (every second one recomputed, ``op_sac_policy``), the fused attention, the
        # reduce-scatter, max (float8's scales).  No bmm, no addmm: naive attention's QKᵀ and AV are recomputed.
        aten.mm.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_flash_attention.default,
        torch.ops._c10d_functional.reduce_scatter_tensor.default,
        aten.max.default,
        # ours: the CPU flash kernel that stands in for CUDA's flash on meta and cpu (setup.ATTENTIONS)
        aten._scaled_dot_product_flash_attention_for_cpu.default,
    }
)
"""Ops whose outputs torchtitan's per-op selective checkpointing ("selective op AC") keeps."""


def op_sac_policy():
    """torchtitan's ``_get_custom_policy(meta)`` with its ``meta = defaultdict(int)``, one per checkpointed call
    (``selective_checkpointing_context_fn``): the ``aten.mm`` calls are counted per mode (forward, recompute), and
    the even-numbered ones are PREFER_RECOMPUTE; every other op of ``OP_SAC_SAVED_OPS`` is MUST_SAVE."""
    meta = {"forward": 0, "recompute": 0}

    def policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
        mode = "recompute" if ctx.is_recompute else "forward"
        if op == aten.mm.default:
            meta[mode] += 1
        to_save = op in OP_SAC_SAVED_OPS and not (op == aten.mm.default and meta[mode] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if to_save else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


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
        qkv_bias: bool = False,
        output_bias: bool = False,
        qk_norm_scope: str = "head",
        qk_norm_kind: str = "rmsnorm",
        qk_norm_bias: bool = True,
        sinks: bool = False,
        alibi: bool = False,
        rotary_dim: int | None = None,
    ):
        super().__init__()
        self.rotary_dim = rotary_dim  # partial rotary: RoPE on the first rotary_dim of each head (None: all)
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} not divisible by num_kv_heads={num_kv_heads}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_proj = Linear(d_model, num_heads * head_dim, device=device, dtype=dtype, bias=qkv_bias)
        self.k_proj = Linear(d_model, num_kv_heads * head_dim, device=device, dtype=dtype, bias=qkv_bias)
        self.v_proj = Linear(d_model, num_kv_heads * head_dim, device=device, dtype=dtype, bias=qkv_bias)
        self.output_proj = Linear(num_heads * head_dim, d_model, device=device, dtype=dtype, bias=output_bias)
        self.sinks = Sinks(num_heads, device=device, dtype=dtype) if sinks else None
        self.alibi = alibi  # ALiBi (BLOOM): the slopes, a non-persistent fp32 buffer (h,)
        if alibi:
            slopes = alibi_slopes(num_heads)  # computed on the CPU (no values on meta)
            on_meta = torch.device(device or "cpu").type == "meta"
            slopes = torch.empty_like(slopes, device="meta") if on_meta else slopes.to(device)
            self.register_buffer("alibi_slopes", slopes, persistent=False)
        self.qk_norm_whole = qk_norm and qk_norm_scope == "projection"
        self.qk_norm_gains = qk_norm and qk_norm_scope == "head_weights"
        if qk_norm:  # per head (Qwen3): head_dim; whole projection (OLMo-2): h·head_dim and kv·head_dim
            q_width, k_width = (
                (num_heads * head_dim, num_kv_heads * head_dim) if self.qk_norm_whole else (head_dim,) * 2
            )
            self.q_norm = make_norm(qk_norm_kind, q_width, eps, device, dtype, bias=qk_norm_bias)
            self.k_norm = make_norm(qk_norm_kind, k_width, eps, device, dtype, bias=qk_norm_bias)
            if self.qk_norm_gains:  # Cohere: a gain (and bias) per head, (n, head_dim), on (..., S, n, head_dim)
                for norm, n in ((self.q_norm, num_heads), (self.k_norm, num_kv_heads)):
                    norm.weight = nn.Parameter(torch.ones(n, head_dim, device=device, dtype=dtype))
                    if getattr(norm, "bias", None) is not None:
                        norm.bias = nn.Parameter(torch.zeros(n, head_dim, device=device, dtype=dtype))
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

    def rotate_part(self, rope: RotaryPositionalEmbedding, t: Tensor, token_positions: Tensor) -> Tensor:
        """Partial rotary (``Glm4MoeAttention``: ``q_rot``/``q_pass``): RoPE on the first ``rotary_dim`` of each
        head, the rest passed through, concatenated back: (..., n, S, head_dim) -> the same shape (a new tensor)."""
        rot, rest = t.split([self.rotary_dim, self.head_dim - self.rotary_dim], dim=-1)  # two views
        return torch.cat([rope(rot, token_positions), rest], dim=-1)

    def forward(
        self,
        x: Tensor,
        rope: RotaryPositionalEmbedding | None,
        token_positions: Tensor,
        mask: Tensor | None,
        cache=None,
    ) -> Tensor:
        """x: (..., S, d_model); token_positions: (S,) or (..., S); mask: bool (S, S), True = keep.
        ``rope`` None: no rotation (learned absolute positions were added to the embeddings).
        ``cache``: a ``model.kv_cache.LayerCache`` (inference): K and V are written to it and the
        step attends over the keys it returns."""
        if (
            self.qk_norm_gains
        ):  # Cohere: (..., S, n·hd) -> (..., S, n, hd), normed (a gain per head), -> (..., n, S, hd)
            q = self.q_norm(self.q_proj(x).unflatten(-1, (self.num_heads, self.head_dim))).transpose(-3, -2)
            k = self.k_norm(self.k_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim))).transpose(-3, -2)
        elif self.qk_norm_whole:  # OLMo-2: normalise the whole projections, then split into heads
            q = self._heads(self.q_norm(self.q_proj(x)), self.num_heads)  # (..., S, h·hd) -> (..., h, S, hd)
            k = self._heads(self.k_norm(self.k_proj(x)), self.num_kv_heads)  # (..., S, kv·hd) -> (..., kv, S, hd)
        else:
            q = self._heads(self.q_proj(x), self.num_heads)  # (..., S, d) -> (..., h, S, head_dim)
            k = self._heads(self.k_proj(x), self.num_kv_heads)  # (..., S, d) -> (..., kv, S, head_dim)
        v = self._heads(self.v_proj(x), self.num_kv_heads)  # (..., S, d) -> (..., kv, S, head_dim)
        if self.q_norm is not None and not self.qk_norm_whole and not self.qk_norm_gains:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            if token_positions.dim() > 1:  # (..., S) -> (..., 1, S): broadcast over heads
                token_positions = token_positions.unsqueeze(-2)  # (..., S) -> (..., 1, S)
            if self.rotary_dim is None:
                q, k = rope(q, token_positions), rope(k, token_positions)
            else:
                q, k = self.rotate_part(rope, q, token_positions), self.rotate_part(rope, k, token_positions)
        if cache is not None:  # inference: store K, V; attend over the cached keys (model/kv_cache.py)
            k, v, mask = cache.update(k, v, mask)
        if hasattr(self, "sdpa"):  # causal by construction: mask is None
            # inference (model/kv_cache.py, filled semantics): a prefill attends over its own S keys, causally;
            # a decode step's one query per sequence sees every cached key (no mask)
            causal = cache is None or int(q.shape[-2]) > 1
            out = self.sdpa(q, k, v, causal)  # (..., h, S, head_dim)
        else:
            bias = None
            if self.alibi:  # slope_h × key position j: (h, 1, S_k), as transformers' BLOOM (per key, not i − j)
                keys = torch.arange(int(k.shape[-2]), device=k.device, dtype=torch.float32)
                bias = (self.alibi_slopes.view(-1, 1, 1) * keys).to(q.dtype)
            out = scaled_dot_product_attention(q, k, v, mask, qk=self.qk, av=self.av, sinks=self.sinks, bias=bias)
        # (..., h, S, head_dim) -> (..., S, h, head_dim) -> (..., S, h·head_dim): heads merged (a copy)
        out = out.transpose(-3, -2).reshape(*x.shape[:-1], self.num_heads * self.head_dim)
        return self.output_proj(out)


FFN_CLASSES = {"swiglu": SwiGLU, "geglu": GeGLU, "gelu": GeluMLP, "relu": ReluMLP, "relu2": Relu2MLP}


class TransformerBlock(nn.Module):
    """Pre-norm block (handout 3.5): ``x + Attn(RMSNorm(x))``, then ``x + FFN(RMSNorm(x))``.

    ``cfg.norm_placement``: ``"sandwich"`` adds a norm on each sublayer's output,
    ``x + post_attn_norm(Attn(ln1(x)))`` (Gemma 2/3); ``"post"`` keeps only that one,
    ``x + post_attn_norm(Attn(x))`` (OLMo-2).  ``cfg.parallel_block``: attention and the FFN side by side,
    ``x + Attn(ln1(x)) + FFN(ln1(x))`` (``one_norm``: GPT-J, Phi, Cohere; no ln2) or ``+ FFN(ln2(x))``
    (``two_norms``: GPT-NeoX).  Modules are registered in execution order."""

    def __init__(self, cfg: ModelConfig, device=None, dtype=None, attention: str = "naive", layer: int = 0):
        super().__init__()

        def norm():
            return make_norm(
                cfg.norm, cfg.d_model, cfg.norm_eps, device, dtype, weights=cfg.norm_weights, bias=cfg.norm_bias
            )

        self.ln1 = norm() if cfg.pre_norms else None
        self.attn = (
            LatentAttention(cfg, device, dtype, attention)
            if cfg.mla
            else CausalSelfAttention(
                cfg.d_model,
                cfg.num_heads,
                cfg.kv_heads,
                cfg.d_head,
                cfg.qk_norm,
                cfg.norm_eps,
                device=device,
                dtype=dtype,
                attention=attention,
                qkv_bias=cfg.qkv_bias,
                output_bias=cfg.output_bias,
                qk_norm_scope=cfg.qk_norm_scope,
                qk_norm_kind="layernorm" if cfg.norm == "layernorm" else "rmsnorm",
                qk_norm_bias=cfg.norm_bias,
                sinks=cfg.attention_sinks,
                alibi=cfg.positions == "alibi",
                rotary_dim=cfg.rotary_dim if cfg.partial_rotary else None,
            )
        )
        self.post_attn_norm = norm() if cfg.post_norms else None
        self.parallel = cfg.parallel_block != "none"
        self.ln2 = norm() if cfg.pre_norms and cfg.parallel_block != "one_norm" else None
        if cfg.layer_moe(layer):  # a mixture of experts (``moe``) instead of the dense FFN (``ffn``)
            self.moe, self.ffn = MixtureOfExperts(cfg, device, dtype), None
        else:
            self.ffn = FFN_CLASSES[cfg.mlp](cfg.d_model, cfg.d_ff, device=device, dtype=dtype, bias=cfg.mlp_bias)
        self.post_ffn_norm = norm() if cfg.post_norms else None

    def _attend(self, h: Tensor, rope, token_positions: Tensor, mask: Tensor | None, cache) -> Tensor:
        """The attention sublayer; ``cache`` (inference, model/kv_cache.py) is passed only when given."""
        if cache is None:
            return self.attn(h, rope, token_positions, mask)
        return self.attn(h, rope, token_positions, mask, cache)

    def forward(
        self,
        x: Tensor,
        rope: RotaryPositionalEmbedding | None,
        token_positions: Tensor,
        mask: Tensor | None,
        cache=None,
    ) -> Tensor:
        if self.parallel:  # x + attn(ln1(x)) + mlp(ln1(x)), or mlp(ln2(x)) with two norms (GPT-NeoX)
            h = self.ln1(x)
            a = self._attend(h, rope, token_positions, mask, cache)
            return x + a + (self.ffn or self.moe)(h if self.ln2 is None else self.ln2(x))
        if self.post_attn_norm is None:  # pre-norm (the course): exactly its ops
            x = x + self._attend(self.ln1(x), rope, token_positions, mask, cache)
            return x + (self.ffn or self.moe)(self.ln2(x))
        h = x if self.ln1 is None else self.ln1(x)
        x = x + self.post_attn_norm(self._attend(h, rope, token_positions, mask, cache))
        h = x if self.ln2 is None else self.ln2(x)
        return x + self.post_ffn_norm((self.ffn or self.moe)(h))


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
        if cfg.sliding_window is not None and self.setup.attention != "naive":
            raise AccountingError(
                "sliding-window attention runs with attention=naive only "
                "(the fused kernel is called with is_causal=True and no window)"
            )
        if cfg.positions == "alibi" and self.setup.attention != "naive":
            raise AccountingError("ALiBi runs with attention=naive only (the fused kernel is called with no bias)")
        if cfg.attention_sinks and self.setup.attention != "naive":
            raise AccountingError(
                "attention sinks run with attention=naive only (the fused kernel's softmax has no sink column)"
            )
        if cfg.mla and self.setup.attention != "naive":
            raise AccountingError(
                "latent attention runs with attention=naive in the live model: its value heads "
                f"({cfg.v_head}) are narrower than its query/key heads ({cfg.d_head}), which torch's CPU flash "
                "kernel refuses (and its meta kernel mis-shapes)"
            )
        self.token_embeddings = Embedding(cfg.vocab_size, cfg.d_model, device=device, dtype=dtype)
        if cfg.positions == "learned":  # GPT-2's wpe: one learned vector per position
            self.position_embeddings = Embedding(cfg.position_rows, cfg.d_model, device=device, dtype=dtype)
        self.embedding_norm = None
        if cfg.embedding_norm:  # BLOOM's word_embeddings_layernorm
            self.embedding_norm = make_norm(
                cfg.norm, cfg.d_model, cfg.norm_eps, device, dtype, weights=cfg.norm_weights, bias=cfg.norm_bias
            )
        self.layers = nn.ModuleList(
            TransformerBlock(cfg, device=device, dtype=dtype, attention=self.setup.attention, layer=i)
            for i in range(cfg.num_layers)
        )
        self.ln_final = make_norm(
            cfg.norm, cfg.d_model, cfg.norm_eps, device, dtype, weights=cfg.norm_weights, bias=cfg.norm_bias
        )
        self.lm_head = Linear(cfg.d_model, cfg.vocab_size, device=device, dtype=dtype, bias=cfg.lm_head_bias)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.token_embeddings.weight
        self.rope = None
        if cfg.positions == "rope":
            self.rope = RotaryPositionalEmbedding(cfg.rope_theta, cfg.rope_dim, cfg.context_length, device=device)

    first_layer = 0  # a pipeline stage's first block (``measure.pipeline.stage_module``)
    sequence_shards = 1  # a later stage under sequence parallel: its input holds S/M of the S positions

    def forward(self, token_ids: Tensor) -> Tensor:
        """token_ids (B, S) integer -> logits (B, S, vocab_size) in the parameters' dtype
        (fp32 under amp-bf16: the bf16 logits are upcast, as transformers' ForCausalLMLoss does).
        A pipeline stage (the model pruned to its blocks, torchtitan's way): without
        ``token_embeddings`` the input is the previous stage's hidden states (B, S, d); without
        ``lm_head`` the output is this stage's hidden states (under sequence parallel, S/M positions each)."""
        first = self.token_embeddings is not None
        seq = token_ids.shape[-1] if first else token_ids.shape[-2] * self.sequence_shards
        if seq > self.cfg.context_length:
            raise ValueError(f"sequence length {seq} exceeds context_length={self.cfg.context_length}")
        positions = torch.arange(seq, device=token_ids.device)
        mask = window_mask = None  # the fused kernel is causal by itself
        if self.setup.attention == "naive":
            mask = torch.ones(seq, seq, dtype=torch.bool, device=token_ids.device).tril()
            if self.cfg.sliding_window is not None:  # key j visible from query i iff i - w < j <= i
                window_mask = mask & ~torch.ones_like(mask).tril(-self.cfg.sliding_window)
        with self._autocast(token_ids.device):
            x = self.embed(token_ids, positions) if first else token_ids
            for i, block in enumerate(self.layers, self.first_layer):
                x = self._run_block(block, x, positions, window_mask if self.cfg.layer_windowed(i) else mask)
            if self.lm_head is None:
                return x
            logits = self.lm_head(self.ln_final(x))
            return logits.float() if self.setup.autocast else logits

    def embed(self, token_ids: Tensor, positions: Tensor) -> Tensor:
        """The blocks' input: token embeddings (× √d for Gemma, + learned positions for GPT-2, normed for BLOOM)."""
        x = self.token_embeddings(token_ids)
        if self.cfg.scale_embeddings:  # Gemma: × √d_model
            x = x * (self.cfg.d_model**0.5)
        if self.cfg.positions == "learned":
            x = x + self.position_embeddings(positions)
        if self.embedding_norm is not None:
            x = self.embedding_norm(x)
        return x

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
        elif self.setup.checkpoint == "op":  # a fresh policy (its mm counts) per checkpointed call
            context["context_fn"] = lambda: create_selective_checkpoint_contexts(op_sac_policy())
        return checkpoint(run, x, use_reentrant=False, preserve_rng_state=False, **context)


def build_model(
    cfg: ModelConfig,
    device: str | torch.device = "meta",
    dtype: torch.dtype | None = None,
    setup: TrainingSetup | None = None,
) -> TransformerLM:
    """The live model for ``cfg``; on ``meta`` (the default) it holds no real memory.

    ``dtype`` is the parameters' dtype; left out, it is the setup's (bf16 for ``precision="bf16"``,
    else fp32).  A ``dtype`` that contradicts the setup is refused, and so is a Gated DeltaNet hybrid or a gated
    attention output (Qwen3-Next, Qwen3.5), or a sparse-attention indexer (DeepSeek-V3.2, GLM-5): the live model has
    none of them (their figures are proven against transformers' own model, tests/test_arch_qwen3_next.py and
    tests/test_arch_dsa.py)."""
    if cfg.indexer:
        raise AccountingError(
            f"{cfg.name}: the live model (lm_accounting/model) has no sparse-attention indexer; its parameters and "
            "FLOPs are proven against transformers' own model instead (tests/test_arch_dsa.py)"
        )
    if cfg.hybrid or cfg.attention_output_gate:
        raise AccountingError(
            f"{cfg.name}: the live model (lm_accounting/model) has no Gated DeltaNet layers and no gated attention "
            "output; its parameters and FLOPs are proven against transformers' own model instead "
            "(tests/test_arch_qwen3_next.py)"
        )
    if cfg.all_experts_run or cfg.attention_chunk is not None:
        raise AccountingError(
            f"{cfg.name}: the live model (lm_accounting/model) routes each token to its top-k experts and has no "
            "chunked attention (Llama 4's, as transformers runs it); its parameters and FLOPs are proven against "
            "transformers' own model instead (tests/test_arch_llama4.py)"
        )
    if cfg.layer_pattern is not None:
        raise AccountingError(
            f"{cfg.name}: the live model (lm_accounting/model) has no layer pattern and no Mamba, Mamba2 or "
            "short-convolution layers; its parameters and FLOPs are proven against transformers' own model instead "
            "(tests/test_arch_mamba2.py, tests/test_arch_mamba.py, tests/test_arch_lfm2.py)"
        )
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
