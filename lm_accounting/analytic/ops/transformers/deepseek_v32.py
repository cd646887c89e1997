"""transformers 5.24's ``DeepseekV32ForCausalLM`` training step (deepseek_v32), transliterated
(``models/deepseek_v32/modeling_deepseek_v32.py``; line numbers of transformers 5.24), and GLM-5's
``GlmMoeDsaForCausalLM`` (``models/glm_moe_dsa/modeling_glm_moe_dsa.py``) with an indexer in every layer.

DeepSeek-V3's program (``deepseek``: latent attention, the group-limited sigmoid router, the experts, the
dense first layers) plus DeepSeek Sparse Attention (DSA):

* ``DeepseekV32Model.forward`` (:724-733) builds the causal mask with ``allow_is_causal_skip=False``: eager's
  additive (B, 1, S, S) mask, and under sdpa the (B, 1, S, S) bool mask (an expanded (1, 1, S, S)) where Llama
  passes none.
* ``DeepseekV32Attention.forward`` (:404-479): always the query bottleneck (``q_resid`` =
  ``q_a_layernorm(q_a_proj(x))``, kept for the indexer), interleaved RoPE; after ``expand_kv`` the indexer's
  top-k indices, then (eager and sdpa) ``index_mask``: ``new_ones((B, S, T), bool)``, ``.scatter(-1,
  topk_indices.long(), False)`` (an int64 copy of the indices and a new bool tensor), unsqueezed to (B, 1, S, T);
  eager: ``attention_mask.masked_fill(index_mask, min)`` (a new (B, 1, S, S) mask of the model's dtype); sdpa:
  ``attention_mask & ~index_mask`` (two (B, 1, S, S) bool tensors).  The attention then runs dense with that mask
  (sdpa: no ``is_causal``; the CPU's flash kernel with the mask when the value head equals the query/key head,
  else torch's math path with it).
* ``DeepseekV32Indexer.forward`` (:178-242), under ``torch.no_grad()`` (nothing saved, its weights get no
  gradient, so AdamW's step skips them: ``untrained``): ``wq_b(q_resid)`` viewed (B, S, H_I, d_I), split into
  its RoPE part and the rest; ``k_norm(wk(x))`` (a LayerNorm with bias) unsqueezed, split; RoPE by
  ``rotate_half`` (DeepSeek-V3.2) or interleaved (GLM-5, ``GlmMoeDsaIndexer``) with cos/sin unsqueezed at dim 2;
  the two ``cat``; then the S² tensors a user must budget: ``torch.matmul(q.float(), k.transpose(-1,
  -2).float().unsqueeze(1))`` broadcasts (B, S, H_I, d_I) against (B, 1, d_I, S): ``_matmul_impl`` expands the
  keys to (B, S, d_I, S) and reshapes them to 3-d, a copy of B·S²·d_I elements, before one ``bmm`` of
  (B·S, H_I, S); the product times ``softmax_scale`` (a second (B, S, H_I, S)), ReLU (a third, the previous
  dying); ``weights_proj(x).float() * H_I^-0.5``; ``matmul(weights.unsqueeze(-2), scores)``: (B, S, 1, S)
  squeezed; the mask added (eager's float mask, (B, S, S)) or ``masked_fill(~mask, -inf)`` (sdpa's bool mask: a
  (B, S, S) ``~``, then the fill); ``topk(min(index_topk, S))``'s values and int64 indices, cast to int32.  All in
  fp32 (``.float()``) except under autocast, where both matmuls run in bf16.
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from .. import cuda
from ..aten_activation import relu
from ..aten_index import split_with_sizes, topk
from ..aten_layer_norm import layer_norm
from ..aten_sdpa_math import sdpa_math
from ..engine import Affine
from ..tensors import Tensor, alike_runs, empty, no_grad, parameter, repeated
from . import deepseek
from .deepseek import apply_rotary_pos_emb_interleave
from .llama import B, Linear, eager_attention_forward, eager_mask, rotate_half, sdpa_mask
from .llama import sdpa_attention_forward as llama_sdpa


def apply_rotary_pos_emb_at_2(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)`` (:122-147): Llama's ``rotate_half`` RoPE on
    (B, S, heads, d) tensors."""
    cos = A.unsqueeze(cos, 2)
    sin = A.unsqueeze(sin, 2)
    q_embed = A.add(A.mul(q, cos), A.mul(rotate_half(q), sin))
    k_embed = A.add(A.mul(k, cos), A.mul(rotate_half(k), sin))
    return q_embed, k_embed


class Indexer:
    """``DeepseekV32Indexer`` (:147-242): ``wq_b``, ``wk``, ``k_norm`` (weight and bias), ``weights_proj``."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str, interleave: bool, device: str):
        self.n_heads, self.head_dim, self.rope = cfg.index_heads, cfg.index_head_dim, cfg.qk_rope_head_dim
        self.index_topk, self.interleave, self.device = cfg.index_topk, interleave, device
        self.wq_b = Linear(cfg.q_lora_rank, self.n_heads * self.head_dim, False, dtype, name + ".wq_b")
        self.wk = Linear(cfg.d_model, self.head_dim, False, dtype, name + ".wk")
        self.k_norm_weight = parameter((self.head_dim,), dtype, name + ".k_norm.weight")
        self.k_norm_bias = parameter((self.head_dim,), dtype, name + ".k_norm.bias")
        self.weights_proj = Linear(cfg.d_model, self.n_heads, False, dtype, name + ".weights_proj")

    def params(self) -> list[Tensor]:
        return (
            self.wq_b.params() + self.wk.params() + [self.k_norm_weight, self.k_norm_bias] + self.weights_proj.params()
        )

    def __call__(self, hidden_states: Tensor, q_resid: Tensor, position_embeddings, attention_mask: Tensor) -> Tensor:
        with no_grad():  # @torch.no_grad() (:178)
            return self.forward(hidden_states, q_resid, position_embeddings, attention_mask)

    def forward(self, hidden_states: Tensor, q_resid: Tensor, position_embeddings, attention_mask: Tensor) -> Tensor:
        batch_size, seq_len, _ = hidden_states.shape  # :211
        cos, sin = position_embeddings
        q = self.wq_b(q_resid)
        q = A.view(q, batch_size, seq_len, self.n_heads, self.head_dim)
        q_rot, q_pass = split_with_sizes(q, [self.rope, self.head_dim - self.rope], -1)
        k = A.unsqueeze(
            layer_norm(self.wk(hidden_states), self.k_norm_weight, self.k_norm_bias, device=self.device), 2
        )  # :217
        k_rot, k_pass = split_with_sizes(k, [self.rope, self.head_dim - self.rope], -1)
        if self.interleave:  # GLM-5 (modeling_glm_moe_dsa.py GlmMoeDsaIndexer)
            q_rot, k_rot = apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
        else:
            q_rot, k_rot = apply_rotary_pos_emb_at_2(q_rot, k_rot, cos, sin)
        q = A.cat([q_rot, q_pass], -1)  # :222
        k = A.squeeze(A.cat([k_rot, k_pass], -1), 2)
        keys = A.unsqueeze(A.to(A.transpose(k, 1, 2), "fp32"), 1)
        scores = A.mul(A.matmul(A.to(q, "fp32"), keys), self.head_dim**-0.5)  # :228
        del keys
        scores = relu(scores)
        projected = self.weights_proj(hidden_states)  # .to(weights_proj.weight.dtype): the model's dtype
        weights = A.mul(A.to(projected, "fp32"), self.n_heads**-0.5)  # :232
        del projected
        index_scores = A.squeeze(A.matmul(A.unsqueeze(weights, -2), scores), -2)
        if attention_mask.dtype == "bool":  # :236-239
            inverted = empty(attention_mask.shape, "bool", "bitwise_not")
            index_scores = masked_fill(index_scores, inverted)
            del inverted
        else:
            index_scores = A.add(index_scores, attention_mask)
        # :241-242: the (values, indices) tuple dies once ``.indices`` is read, the values with it, before the cast
        indices = topk(index_scores, min(self.index_topk, index_scores.shape[-1]))[1]
        out = A.to(indices, "int32")
        del indices
        return out  # the locals die at the return


def masked_fill(x: Tensor, mask: Tensor) -> Tensor:
    """``x.masked_fill(mask, number)`` outside autograd: one new tensor of the broadcast shape."""
    return empty(A.broadcast(x.shape, mask.shape), x.dtype, "masked_fill")


class Attention(deepseek.Attention):
    """``DeepseekV32Attention`` (:336-479): DeepSeek-V3's MLA with the query bottleneck and an ``indexer``
    (registered after ``o_proj``).  GLM-5's ``GlmMoeDsaAttention`` (modeling_glm_moe_dsa.py): a ``shared`` layer
    has no indexer and takes the previous layer's top-k (``prev_topk_indices``); it returns its top-k too."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str, device: str, indexed: bool = True):
        super().__init__(cfg, dtype, attn, name)
        self.glm = cfg.hf_model_type == "glm_moe_dsa"
        self.indexer = Indexer(cfg, dtype, name + ".indexer", self.glm, device) if indexed else None

    def params(self) -> list[Tensor]:
        return super().params() + (self.indexer.params() if self.indexer is not None else [])

    def __call__(self, hidden_states: Tensor, position_embeddings, attention_mask, prev_topk_indices=None) -> tuple:
        batch_size, seq_length = hidden_states.shape[:-1]  # :413
        q_resid = self.q_a_layernorm(self.q_a_proj(hidden_states))  # :416
        q_states = A.transpose(A.view(self.q_b_proj(q_resid), batch_size, seq_length, -1, self.qk_head_dim), 1, 2)
        q_pass, q_rot = split_with_sizes(q_states, [self.nope, self.rope], -1)
        compressed_kv = self.kv_a_proj_with_mqa(hidden_states)  # :420
        kv_pass, k_rot = split_with_sizes(compressed_kv, [self.kv_lora_rank, self.rope], -1)
        k_pass = A.view(self.kv_a_layernorm(kv_pass), batch_size, 1, seq_length, self.kv_lora_rank)
        k_rot = A.view(k_rot, batch_size, 1, seq_length, self.rope)
        cos, sin = position_embeddings  # :425
        q_rot, k_rot = apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin)
        query_states = A.cat((q_pass, q_rot), -1)  # :432
        key_states, value_states = self.expand_kv(k_pass, k_rot)  # :434
        if self.indexer is not None:  # :437-444
            topk_indices = self.indexer(hidden_states, q_resid, position_embeddings, A.select(attention_mask, 1, 0))
        else:  # GLM-5's shared layer
            topk_indices = prev_topk_indices
        with no_grad():  # :449-458 (the mask and the indices need no grad)
            ones = empty((batch_size, seq_length, key_states.shape[2]), "bool", "new_ones")
            as_long = A.to(topk_indices, "int64")
            index_mask = A.unsqueeze(empty(ones.shape, "bool", "scatter"), 1)
            del ones, as_long
            if attention_mask.dtype == "bool":
                inverted = empty(index_mask.shape, "bool", "bitwise_not")
                attention_mask = empty(A.broadcast(attention_mask.shape, inverted.shape), "bool", "bitwise_and")
                del inverted
            else:
                attention_mask = masked_fill(attention_mask, index_mask)
        if self.attn == "naive":  # :462-475
            attn_output, attn_weights = eager_attention_forward(
                self, query_states, key_states, value_states, attention_mask
            )
        else:
            attn_output, attn_weights = sdpa_attention_forward(
                self, query_states, key_states, value_states, attention_mask
            )
        attn_output = A.contiguous(A.reshape(attn_output, batch_size, seq_length, -1))  # :477
        if self.glm:  # the locals die in their order of first use; GLM-5 returns the top-k too
            return self.o_proj(attn_output), attn_weights, topk_indices
        return self.o_proj(attn_output), attn_weights


def sdpa_attention_forward(module: Attention, query, key, value, attention_mask) -> tuple[Tensor, None]:
    """``integrations/sdpa_attention.py`` with the DSA bool mask (no ``is_causal``): on the cpu the flash kernel
    with the mask (``llama.sdpa_attention_forward``) when q, k and v have one head size, else the math path with
    the mask (``aten_sdpa_math``); on cuda the masked kernels of ``llama.sdpa_attention_forward`` (not measured
    on a GPU for these models)."""
    if query.shape[-1] == value.shape[-1] or cuda.on_cuda():
        return llama_sdpa(module, query, key, value, attention_mask)
    query, key, value = A.lower(query, key, value)
    attn_output = sdpa_math(query, key, value, causal=False, device="cpu", mask=attention_mask)
    return A.contiguous(A.transpose(attn_output, 1, 2)), None


class DecoderLayer(deepseek.DecoderLayer):
    """``DeepseekV32DecoderLayer`` (:603-643): DeepSeek-V3's with the DSA attention."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str, sparse: bool, device: str, indexed: bool):
        super().__init__(cfg, dtype, attn, name, sparse)
        self.self_attn = Attention(cfg, dtype, attn, name + ".self_attn", device, indexed)


class GlmMoeDsaDecoderLayer(DecoderLayer):
    """``GlmMoeDsaDecoderLayer`` (modeling_glm_moe_dsa.py): DeepSeek-V3.2's, handed the previous layer's top-k
    (a keyword: under checkpointing the frame keeps it) and returning its own."""

    def forward(
        self, hidden_states: Tensor, attention_mask=None, position_embeddings=None, position_ids=None,
        prev_topk_indices=None,
    ):  # fmt: skip
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _, topk_indices = self.self_attn(
            hidden_states, position_embeddings, attention_mask, prev_topk_indices
        )
        hidden_states = A.add(residual, hidden_states)
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        return A.add(residual, hidden_states), topk_indices


class DeepseekV32ForCausalLM(deepseek.DeepseekV3ForCausalLM):
    """``DeepseekV32ForCausalLM`` with ``DeepseekV32Model`` (:679-824): DeepSeek-V3's, its causal mask always
    built (``allow_is_causal_skip=False``)."""

    def __init__(self, cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B, device="meta"):
        self.device = device
        super().__init__(cfg, seq, setup, batch)

    def layer_class(self, cfg, dtype, attn, name, sparse):
        """The decoder layer ``layers.{i}`` (the parent's ``layer_class`` call), with an indexer where
        ``cfg.layer_indexer(i)``."""
        layer = GlmMoeDsaDecoderLayer if cfg.hf_model_type == "glm_moe_dsa" else DecoderLayer
        index = int(name.removeprefix("layers."))
        return layer(cfg, dtype, attn, name, sparse, self.device, cfg.layer_indexer(index))

    def run_layers(self, hidden_states: Tensor, kwargs) -> Tensor:
        """GLM-5's loop hands each layer's top-k to the next (``topk_indices``: it lives until the forward
        returns); runs of alike layers (also alike in having an indexer) replayed once."""
        if self.cfg.hf_model_type != "glm_moe_dsa":
            return super().run_layers(hidden_states, kwargs)
        topk_indices = None
        for first, times in indexed_runs(self.cfg):
            with repeated(times):
                hidden_states, topk_indices = self.layers[first](
                    hidden_states, **kwargs(first), prev_topk_indices=topk_indices
                )
        return hidden_states

    def masks(self) -> dict[bool, Tensor | None]:
        if self.setup.attention == "naive":
            return dict.fromkeys((False, True), eager_mask(self.batch, self.seq, self.dtype, None))
        return dict.fromkeys((False, True), sdpa_mask(self.batch, self.seq, None, allow_is_causal_skip=False))

    def untrained(self) -> list[Tensor]:
        """The indexers' weights: run under ``torch.no_grad()``, they never get a gradient, so AdamW makes no
        state for them (``ops.step``; ``measure.hf.mark_unreached`` on the measured side)."""
        return [p for layer in self.layers if layer.self_attn.indexer for p in layer.self_attn.indexer.params()]


def indexed_runs(cfg: ModelConfig) -> list[tuple[int, int]]:
    """``tensors.alike_runs`` with GLM-5's shared (``S``) layers each replayed alone: they all take the same
    earlier top-k, which each checkpointed layer's frame holds (a tensor from before the run that ``repeated``
    would free once per copy)."""
    runs = []
    for first, times in alike_runs(cfg):
        start = first
        for i in range(first + 1, first + times + 1):
            if i == first + times or not cfg.layer_indexer(i) or not cfg.layer_indexer(start):
                runs.append((start, i - start))
                start = i
    return runs


def causal_lm(
    cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B, device: str = "meta"
) -> DeepseekV32ForCausalLM:
    """The program of ``ops.transformers.predict_step``."""
    return DeepseekV32ForCausalLM(cfg, seq, setup, batch, device)


def fp32_kept_parameters(cfg: ModelConfig) -> int:
    return deepseek.fp32_kept_parameters(cfg)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    return deepseek.unsupported(cfg, setup)
