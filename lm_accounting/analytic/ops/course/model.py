"""Our model (``lm_accounting/model/transformer.py`` and ``mla.py``) as a program of the op library.

``TransformerLM`` here is the live ``TransformerLM`` with its ``TrainingSetup``, built from the same
``ModelConfig``: the same modules in the same order (``parameters()`` is ``model.parameters()``'s order, which
the for-loop AdamW's temporaries follow), the same forward line by line, the same checkpointing.  ``loss()`` is
one step's ``cross_entropy(model(inputs), targets)`` (``measure.step.training_step``).
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..aten_index import split_with_sizes
from ..engine import Affine
from ..tensors import Tensor, alike_runs, empty, repeated
from .layers import (
    Embedding,
    Linear,
    RMSNorm,
    RotaryPositionalEmbedding,
    autocast,
    cross_entropy,
    fused_attention,
    make_ffn,
    make_norm,
    scaled_dot_product_attention,
)
from .moe import MixtureOfExperts
from .sac import block_checkpoint

DTYPES = {"fp32": "fp32", "bf16": "bf16", "amp-bf16": "fp32"}
"""The parameters' dtype per precision (``TrainingSetup.param_dtype``)."""


def _heads(t: Tensor, n: int, head_dim: int) -> Tensor:
    """``CausalSelfAttention._heads``: (..., S, n·head_dim) -> (..., n, S, head_dim), a view."""
    return A.transpose(A.view(t, *t.shape[:-1], n, head_dim), -3, -2)


class CausalSelfAttention:
    """``CausalSelfAttention`` (transformer.py:83; forward :135): q/k/v projections, optional qk-norm (per head, or over the
    whole projection), RoPE, naive or fused attention, heads merged (a copy), output projection."""

    def __init__(self, cfg: ModelConfig, dtype: str, attention: str, name: str):
        h, kv, hd, d = cfg.num_heads, cfg.kv_heads, cfg.d_head, cfg.d_model
        self.h, self.kv, self.hd, self.attention = h, kv, hd, attention
        self.rotary_dim = cfg.rotary_dim if cfg.partial_rotary else None
        self.q_proj = Linear(d, h * hd, dtype, name + ".q_proj", cfg.qkv_bias)
        self.k_proj = Linear(d, kv * hd, dtype, name + ".k_proj", cfg.qkv_bias)
        self.v_proj = Linear(d, kv * hd, dtype, name + ".v_proj", cfg.qkv_bias)
        self.output_proj = Linear(h * hd, d, dtype, name + ".output_proj", cfg.output_bias)
        self.whole = cfg.qk_norm and cfg.qk_norm_scope == "projection"
        self.q_norm = self.k_norm = None
        if cfg.qk_norm:
            q_width, k_width = (h * hd, kv * hd) if self.whole else (hd, hd)
            self.q_norm = RMSNorm(q_width, cfg.norm_eps, dtype, name + ".q_norm")
            self.k_norm = RMSNorm(k_width, cfg.norm_eps, dtype, name + ".k_norm")

    def params(self) -> list[Tensor]:
        out = self.q_proj.params() + self.k_proj.params() + self.v_proj.params() + self.output_proj.params()
        return out + (self.q_norm.params() + self.k_norm.params() if self.q_norm is not None else [])

    def rotate_part(self, rope, t: Tensor, token_positions: Tensor) -> Tensor:
        """``rotate_part`` (partial rotary): split off the first ``rotary_dim``, rotate it, concatenate back."""
        rot, rest = split_with_sizes(t, (self.rotary_dim, self.hd - self.rotary_dim), -1)
        return A.cat([rope(rot, token_positions), rest], -1)

    def __call__(self, x: Tensor, rope, token_positions: Tensor, mask: Tensor | None) -> Tensor:
        h, kv, hd = self.h, self.kv, self.hd
        if self.whole:  # OLMo-2: normalise the whole projections, then split into heads
            q = _heads(self.q_norm(self.q_proj(x)), h, hd)
            k = _heads(self.k_norm(self.k_proj(x)), kv, hd)
        else:
            q = _heads(self.q_proj(x), h, hd)
            k = _heads(self.k_proj(x), kv, hd)
        v = _heads(self.v_proj(x), kv, hd)
        if self.q_norm is not None and not self.whole:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            if self.rotary_dim is None:
                q, k = rope(q, token_positions), rope(k, token_positions)
            else:
                q, k = self.rotate_part(rope, q, token_positions), self.rotate_part(rope, k, token_positions)
        if self.attention == "sdpa":
            out = fused_attention(q, k, v)
        else:
            out = scaled_dot_product_attention(q, k, v, mask)
        out = A.reshape(A.transpose(out, -3, -2), *x.shape[:-1], h * hd)  # heads merged (a copy)
        return self.output_proj(out)


class LatentAttention:
    """``LatentAttention`` (mla.py:33; forward :61): low-rank queries (or ``q_proj``), the compressed latent and one shared RoPE
    key, keys and values expanded from the latent by ``kv_b_proj``, ordinary attention, ``output_proj``."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        h, d = cfg.num_heads, cfg.d_model
        self.h, self.dn, self.dr, self.dv, self.r_kv = (
            h,
            cfg.qk_nope_head_dim,
            cfg.qk_rope_head_dim,
            cfg.v_head_dim,
            cfg.kv_lora_rank,
        )
        if cfg.q_lora_rank is None:
            self.q_proj = Linear(d, cfg.q_dim, dtype, name + ".q_proj")
            self.q_a_proj = None
        else:
            self.q_a_proj = Linear(d, cfg.q_lora_rank, dtype, name + ".q_a_proj")
            self.q_a_norm = RMSNorm(cfg.q_lora_rank, cfg.norm_eps, dtype, name + ".q_a_norm")
            self.q_b_proj = Linear(cfg.q_lora_rank, cfg.q_dim, dtype, name + ".q_b_proj")
        self.kv_a_proj = Linear(d, self.r_kv + self.dr, dtype, name + ".kv_a_proj")
        self.kv_a_norm = RMSNorm(self.r_kv, cfg.norm_eps, dtype, name + ".kv_a_norm")
        self.kv_b_proj = Linear(self.r_kv, h * (self.dn + self.dv), dtype, name + ".kv_b_proj")
        self.output_proj = Linear(h * self.dv, d, dtype, name + ".output_proj")

    def params(self) -> list[Tensor]:
        if self.q_a_proj is None:
            q = self.q_proj.params()
        else:
            q = self.q_a_proj.params() + self.q_a_norm.params() + self.q_b_proj.params()
        rest = self.kv_a_proj.params() + self.kv_a_norm.params() + self.kv_b_proj.params()
        return q + rest + self.output_proj.params()

    def _queries(self, x: Tensor) -> Tensor:
        if self.q_a_proj is None:
            return self.q_proj(x)
        return self.q_b_proj(self.q_a_norm(self.q_a_proj(x)))

    def __call__(self, x: Tensor, rope, token_positions: Tensor, mask: Tensor | None) -> Tensor:
        *lead, s, _ = x.shape
        h, dn, dr, dv = self.h, self.dn, self.dr, self.dv
        q = A.transpose(A.view(self._queries(x), *lead, s, h, dn + dr), -3, -2)
        q_nope, q_rope = split_with_sizes(q, (dn, dr), -1)
        latent, k_rope = split_with_sizes(self.kv_a_proj(x), (self.r_kv, dr), -1)
        q_rope = rope(q_rope, token_positions)
        latent = A.unsqueeze(self.kv_a_norm(latent), -3)
        k_rope = rope(A.unsqueeze(k_rope, -3), token_positions)
        n = latent.shape[-2]
        kv = self.kv_b_proj(A.squeeze(latent, -3))
        kv = A.transpose(A.view(kv, *lead, n, h, dn + dv), -3, -2)
        k_nope, v = split_with_sizes(kv, (dn, dv), -1)
        q = A.cat([q_nope, q_rope], -1)
        k = A.cat([k_nope, A.expand(k_rope, *k_nope.shape[:-1], dr)], -1)
        out = scaled_dot_product_attention(q, k, v, mask)
        out = A.reshape(A.transpose(out, -3, -2), *lead, s, h * dv)
        return self.output_proj(out)


class TransformerBlock:
    """``TransformerBlock`` (transformer.py:177; forward :223): pre-norm ``x + attn(ln1(x))``, ``x + ffn(ln2(x))``; sandwich/post
    norms; a parallel block (``parallel_block``)."""

    def __init__(self, cfg: ModelConfig, dtype: str, attention: str, layer: int):
        name = f"layers.{layer}"

        def norm(part: str):
            return make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, dtype, f"{name}.{part}", cfg.norm_bias)

        self.ln1 = norm("ln1") if cfg.pre_norms else None
        if cfg.mla:
            self.attn = LatentAttention(cfg, dtype, name + ".attn")
        else:
            self.attn = CausalSelfAttention(cfg, dtype, attention, name + ".attn")
        self.post_attn_norm = norm("post_attn_norm") if cfg.post_norms else None
        self.parallel = cfg.parallel_block != "none"
        self.ln2 = norm("ln2") if cfg.pre_norms and cfg.parallel_block != "one_norm" else None
        if cfg.layer_moe(layer):  # a mixture of experts instead of the dense FFN
            self.ffn = MixtureOfExperts(cfg, dtype, name + ".moe")
        else:
            self.ffn = make_ffn(cfg.mlp, cfg.d_model, cfg.d_ff, dtype, name + ".ffn", cfg.mlp_bias)
        self.post_ffn_norm = norm("post_ffn_norm") if cfg.post_norms else None

    def params(self) -> list[Tensor]:
        modules = (self.ln1, self.attn, self.post_attn_norm, self.ln2, self.ffn, self.post_ffn_norm)
        return [p for m in modules if m is not None for p in m.params()]

    def __call__(self, x: Tensor, rope, token_positions: Tensor, mask: Tensor | None) -> Tensor:
        return self.forward(x, rope, token_positions, mask)  # ``forward``: what FSDP2's hooks wrap (``ops.fsdp``)

    def forward(self, x: Tensor, rope, token_positions: Tensor, mask: Tensor | None) -> Tensor:
        if self.parallel:  # x + attn(ln1(x)) + ffn(ln1(x) or ln2(x)): x + a is added before the FFN runs
            h = self.ln1(x)
            a = self.attn(h, rope, token_positions, mask)  # the live model's local: alive until the block returns
            x_a = A.add(x, a)
            return A.add(x_a, self.ffn(h if self.ln2 is None else self.ln2(x)))
        if self.post_attn_norm is None:  # pre-norm (the course)
            x = A.add(x, self.attn(self.ln1(x), rope, token_positions, mask))
            return A.add(x, self.ffn(self.ln2(x)))
        h = x if self.ln1 is None else self.ln1(x)
        x = A.add(x, self.post_attn_norm(self.attn(h, rope, token_positions, mask)))
        h = x if self.ln2 is None else self.ln2(x)
        return A.add(x, self.post_ffn_norm(self.ffn(h)))


class TransformerLM:
    """``TransformerLM`` (transformer.py:240) with its setup, its buffers and one step's inputs: ``parameters()`` and ``loss()``."""

    def __init__(
        self, cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = 1, dtype: str | None = None
    ):
        # ``dtype``: the parameters' dtype if not the setup's (FSDP2's bf16 policy gathers bf16: ``ops.fsdp``)
        dtype = dtype or DTYPES[setup.precision]
        self.cfg, self.seq, self.setup = cfg, seq, setup
        self.token_embeddings = Embedding(cfg.vocab_size, cfg.d_model, dtype, "token_embeddings")
        self.position_embeddings = None
        if cfg.positions == "learned":
            self.position_embeddings = Embedding(cfg.position_rows, cfg.d_model, dtype, "position_embeddings")
        self.layers = [TransformerBlock(cfg, dtype, setup.attention, i) for i in range(cfg.num_layers)]
        self.ln_final = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, dtype, "ln_final", cfg.norm_bias)
        self.lm_head = Linear(cfg.d_model, cfg.vocab_size, dtype, "lm_head")
        if cfg.tie_embeddings:
            self.lm_head.weight = self.token_embeddings.weight
        self.rope = RotaryPositionalEmbedding(cfg.rope_dim, cfg.context_length) if cfg.positions == "rope" else None
        self.inputs = empty((batch, seq), "int64", "inputs")
        self.targets = empty((batch, seq), "int64", "targets")

    def parameters(self) -> list[Tensor]:
        out = [self.token_embeddings.weight]
        if self.position_embeddings is not None:
            out.append(self.position_embeddings.weight)
        for block in self.layers:
            out += block.params()
        out += self.ln_final.params()
        return out + ([] if self.cfg.tie_embeddings else [self.lm_head.weight])

    def loss(self) -> Tensor:
        return cross_entropy(self.forward(self.inputs), self.targets)

    def forward(self, token_ids: Tensor) -> Tensor:
        """``TransformerLM.forward`` (transformer.py:282): positions, the causal (and windowed) masks, embeddings, blocks, final norm,
        LM head (logits upcast to fp32 under amp-bf16)."""
        cfg, seq = self.cfg, self.seq
        positions = empty((seq,), "int64", "arange")
        mask = window_mask = None
        if self.setup.attention == "naive":
            mask = _tril(empty((seq, seq), "bool", "ones"))  # torch.ones(seq, seq, dtype=torch.bool).tril()
            if cfg.sliding_window is not None:  # mask & ~torch.ones_like(mask).tril(-w)
                window_mask = _and(mask, _not(_tril(empty((seq, seq), "bool", "ones_like"))))
        with autocast(self.setup.autocast):
            x = self._embed(token_ids, positions)
            for first, times in alike_runs(cfg):  # the layers in order, each run of alike ones replayed once
                with repeated(times):
                    x = self._run_block(
                        self.layers[first], x, positions, window_mask if cfg.layer_windowed(first) else mask
                    )
            logits = self.lm_head(self.ln_final(x))
            return A.to(logits, "fp32") if self.setup.autocast else logits

    def _embed(self, token_ids: Tensor, positions: Tensor) -> Tensor:
        x = self.token_embeddings(token_ids)
        if self.cfg.scale_embeddings:  # Gemma: × √d_model
            x = A.mul(x, self.cfg.d_model**0.5)
        if self.position_embeddings is not None:
            x = A.add(x, self.position_embeddings(positions))
        return x

    def _run_block(self, block: TransformerBlock, x: Tensor, positions: Tensor, mask: Tensor | None) -> Tensor:
        """``_run_block``: checkpointed as the setup says (non-reentrant, no RNG state)."""
        if self.setup.checkpoint == "none":
            return block(x, self.rope, positions, mask)
        amp = self.setup.autocast

        def run(x: Tensor) -> Tensor:
            with autocast(amp):
                return block(x, self.rope, positions, mask)

        return block_checkpoint(run, x, self.setup.checkpoint)


def _tril(t: Tensor) -> Tensor:
    return empty(t.shape, t.dtype, "tril")


def _not(t: Tensor) -> Tensor:
    return empty(t.shape, t.dtype, "bitwise_not")


def _and(a: Tensor, b: Tensor) -> Tensor:
    return empty(a.shape, a.dtype, "bitwise_and")
