"""transformers 5.24's ``FalconForCausalLM`` training step, transliterated (``models/falcon/modeling_falcon.py``,
line numbers of transformers 5.24), RoPE only (``alibi`` false: ``hf_config`` refuses Falcon's ALiBi).

Llama's model skeleton (position ids, the packed-sequence check, one mask, Llama's rotary table) and GPT-2's
LayerNorm (``gpt2``), with what Falcon does differently:

* ``FalconLinear`` (:60-65): ``input @ weight.T``, then ``+ bias`` (an add: an fp32 result under autocast);
* the mask is made even for sdpa (``create_causal_mask(..., allow_is_causal_skip=False)``, :753-760): the CPU's
  flash kernel gets a bool mask;
* the fused ``query_key_value`` split (:243-273): one K/V head per head, ``select``ed from (B, S, h, 3, hd); one
  K/V head (``multi_query``), q sliced from (B, S, h + 2, hd) and k, v indexed out (``[..., [-2], :]``: copies); the new architecture (Falcon-40B), q sliced from (B, S, kv, h/kv + 2, hd), k and v
  indexed, broadcast to q's heads, then all three flattened (copies);
* Llama's ``apply_rotary_pos_emb``; eager attention (:349-354): ``q @ kᵀ`` (one K/V head broadcast: a copy), an
  in-place ``/= √hd``, ``softmax(scores + mask, dtype=hidden dtype)``, ``@ v``, heads merged (a copy), ``dense``;
  the layer returns (output, the probabilities) and the model keeps that tuple until the next layer returns;
* the block (:567-623): side by side from one norm (``parallel_attn``, or the new architecture with
  ``num_ln_in_parallel_attn`` 1), from ``ln_attn`` and ``ln_mlp`` (the new architecture), or sequential; the
  attention output added in place to the MLP's (``mlp_output += attention_output``); dropout p = 0.

A config's block is read as ``parallel_block`` and K/V heads: one norm with 1 or h K/V heads is Falcon-7B's layout
(the old architecture); the new architecture with one norm and 1 or h K/V heads has the same parameters and is
replayed as that (not told apart: not modelled).  sdpa with one K/V head and the mask takes torch's math path,
K and V broadcast by its matmuls (``aten_sdpa_math``; on cuda too, where no fused kernel takes unequal heads without
``enable_gqa``).
"""

from __future__ import annotations

import math

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from .. import cuda
from ..aten_index import index
from ..aten_sdpa_math import sdpa_math
from ..engine import Affine
from ..tensors import Storage, Tensor, current, empty, no_grad, parameter
from .gpt2 import LayerNorm
from .llama import (
    DTYPES,
    B,
    GradientCheckpointingLayer,
    LlamaForCausalLM,
    apply_rotary_pos_emb,
    arange_plus,
    eager_mask,
    find_packed_sequence_indices,
    flash_attention_cpu,
    head_and_loss,
    rotary_embedding,
    sdpa_mask,
)
from .phi import ACTIVATIONS


def new_architecture(cfg: ModelConfig) -> bool:
    """Whether ``cfg`` is read from ``new_decoder_architecture`` (two norms, or K/V heads other than 1 and h)."""
    return cfg.parallel_block == "two_norms" or cfg.kv_heads not in (1, cfg.num_heads)


class FalconLinear:
    """``FalconLinear`` (modeling_falcon.py:60-65)."""

    def __init__(self, d_in: int, d_out: int, bias: bool, dtype: str, name: str):
        self.weight = parameter((d_out, d_in), dtype, name + ".weight")
        self.bias = parameter((d_out,), dtype, name + ".bias") if bias else None

    def params(self) -> list[Tensor]:
        return [self.weight] + ([self.bias] if self.bias is not None else [])

    def __call__(self, x: Tensor) -> Tensor:
        hidden_states = A.matmul(x, A.t_(self.weight))
        return hidden_states if self.bias is None else A.add(hidden_states, self.bias)


def take(t: Tensor, dim: int, position: int) -> Tensor:
    """``t[..., [position], :]`` along ``dim``: the list made an int64 CPU tensor (8 bytes a plain CPU run's
    allocator sees, and ``IndexBackward0`` saves; host memory on meta), then ``index`` (a copy).  On cuda the ids
    are copied to the GPU first, and that 8-byte copy is what ``IndexBackward0`` saves (traced on an H100:
    reports/cuda-h100/traces/falcon_index_ids.txt)."""
    on_device = current().wraps or cuda.on_cuda()
    ids = Tensor((1,), "int64", None if on_device else Storage(0, "host"), label="index_ids")
    return index(t, ids, dim)


class Attention:
    """``FalconAttention`` (modeling_falcon.py:200-412), RoPE."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str):
        d, h, kv = cfg.d_model, cfg.num_heads, cfg.kv_heads
        self.num_heads, self.head_dim, self.kv, self.attn = h, d // h, kv, attn
        self.new = new_architecture(cfg)
        self.num_kv_heads = h if self.new else kv  # :313
        fused = (h + 2 * kv) * self.head_dim
        self.query_key_value = FalconLinear(d, fused, cfg.qkv_bias, dtype, name + ".query_key_value")
        self.dense = FalconLinear(d, d, cfg.output_bias, dtype, name + ".dense")

    def params(self) -> list[Tensor]:
        return self.query_key_value.params() + self.dense.params()

    def split_heads(self, fused_qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``_split_heads`` (:243-273)."""
        batch, seq, _ = fused_qkv.shape
        h, hd = self.num_heads, self.head_dim
        if self.new:
            groups = h // self.kv
            qkv = A.view(fused_qkv, batch, seq, -1, groups + 2, hd)
            query = A.slice_(qkv, 3, 0, groups)
            key = take(qkv, 3, -2)
            value = take(qkv, 3, -1)
            key = A.expand(key, *query.shape)
            value = A.expand(value, *query.shape)
            flat = [A.reshape(x, batch, seq, -1, hd) for x in (query, key, value)]  # flatten(2, 3)
            return flat[0], flat[1], flat[2]
        if self.kv == h:
            fused = A.view(fused_qkv, batch, seq, h, 3, hd)
            return A.select(fused, 3, 0), A.select(fused, 3, 1), A.select(fused, 3, 2)
        fused = A.view(fused_qkv, batch, seq, h + 2, hd)
        return A.slice_(fused, 2, 0, h), take(fused, 2, -2), take(fused, 2, -1)

    def __call__(self, hidden_states: Tensor, attention_mask, position_embeddings) -> tuple[Tensor, Tensor | None]:
        fused_qkv = self.query_key_value(hidden_states)  # :312
        query_layer, key_layer, value_layer = self.split_heads(fused_qkv)  # :315
        batch_size, query_length, _, _ = query_layer.shape
        h, hd, kv = self.num_heads, self.head_dim, self.num_kv_heads
        query_layer = A.reshape(A.transpose(query_layer, 1, 2), batch_size, h, query_length, hd)  # :319-321
        key_layer = A.reshape(A.transpose(key_layer, 1, 2), batch_size, kv, query_length, hd)
        value_layer = A.reshape(A.transpose(value_layer, 1, 2), batch_size, kv, query_length, hd)
        cos, sin = position_embeddings  # :323-325
        query_layer, key_layer = apply_rotary_pos_emb(query_layer, key_layer, cos, sin)
        del cos, sin
        if self.attn == "sdpa" and kv != h:  # :333-346, one K/V head: torch's math path, K/V broadcast
            # (on cuda too: no fused kernel takes unequal heads without enable_gqa, sdp_utils.cpp)
            attn_output = sdpa_math(query_layer, key_layer, value_layer, causal=False, mask=attention_mask, gqa=False)
            attention_scores = None
        elif self.attn == "sdpa":  # K/V on every head: the CPU's flash kernel with the bool mask
            query, key, value = A.lower(query_layer, key_layer, value_layer)
            if cuda.on_cuda():
                attn_output = cuda.masked_attention(query, key, value, attention_mask)
            else:
                attn_output = flash_attention_cpu(query, key, value, attention_mask)
            del query, key, value
            attention_scores = None
        else:  # :348-354
            attention_scores = A.matmul(query_layer, A.transpose(key_layer, -1, -2))
            attention_scores = A.div_(attention_scores, math.sqrt(hd))
            dtype = hidden_states.dtype
            attention_scores = A.softmax(A.add(attention_scores, attention_mask), -1, dtype)
            attn_output = A.matmul(attention_scores, value_layer)
        attn_output = A.view(attn_output, batch_size, h, query_length, hd)  # :356
        attn_output = A.transpose(attn_output, 1, 2)  # :357 permute(0, 2, 1, 3): the same layout
        attn_output = A.reshape(attn_output, batch_size, query_length, h * hd)  # :358
        attn_output = self.dense(attn_output)  # :360
        return attn_output, attention_scores


class MLP:
    """``FalconMLP`` (modeling_falcon.py:515-528)."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.act = ACTIVATIONS[cfg.hf_activation or "gelu"]
        self.dense_h_to_4h = FalconLinear(cfg.d_model, cfg.d_ff, cfg.mlp_bias, dtype, name + ".dense_h_to_4h")
        self.dense_4h_to_h = FalconLinear(cfg.d_ff, cfg.d_model, cfg.mlp_bias, dtype, name + ".dense_4h_to_h")

    def params(self) -> list[Tensor]:
        return self.dense_h_to_4h.params() + self.dense_4h_to_h.params()

    def __call__(self, x: Tensor) -> Tensor:
        return self.dense_4h_to_h(self.act(self.dense_h_to_4h(x)))  # :526-527


NORMS = {
    "none": ("post_attention_layernorm", "input_layernorm"),
    "one_norm": ("input_layernorm",),
    "two_norms": ("ln_attn", "ln_mlp"),
}
"""A block's LayerNorms in registration order (modeling_falcon.py:555-565): the input's is the last."""


class FalconDecoderLayer(GradientCheckpointingLayer):
    """``FalconDecoderLayer`` (modeling_falcon.py:538-623)."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, device: str, name: str):
        self.block = cfg.parallel_block
        self.self_attention = Attention(cfg, dtype, attn, name + ".self_attention")
        self.mlp = MLP(cfg, dtype, name + ".mlp")
        self.norms = [LayerNorm(cfg.d_model, dtype, device, f"{name}.{n}") for n in NORMS[self.block]]

    def params(self) -> list[Tensor]:
        out = self.self_attention.params() + self.mlp.params()
        for n in self.norms:
            out += n.params()
        return out

    def forward(
        self, hidden_states: Tensor, attention_mask=None, position_ids=None, position_embeddings=None
    ) -> tuple[Tensor, Tensor | None]:
        residual = hidden_states  # :579
        if self.block == "two_norms":  # :581-583
            attention_layernorm_out = self.norms[0](hidden_states)
            mlp_layernorm_out = self.norms[1](hidden_states)
        else:  # :584-585
            attention_layernorm_out = self.norms[-1](hidden_states)
        attention_output, attn_weights = self.self_attention(
            attention_layernorm_out, attention_mask, position_embeddings
        )  # :587-596
        if self.block == "one_norm":  # :598-601, :608-613
            mlp_layernorm_out = attention_layernorm_out
        elif self.block == "none":  # :602-606 dropout_add (p = 0)
            residual = A.add(residual, attention_output)
            mlp_layernorm_out = self.norms[0](residual)
        mlp_output = self.mlp(mlp_layernorm_out)  # :616
        if self.block != "none":
            mlp_output = A.add_(mlp_output, attention_output)  # :618-619
        output = A.add(residual, mlp_output)  # :621 dropout_add (p = 0)
        return output, attn_weights


class FalconForCausalLM(LlamaForCausalLM):
    """``FalconForCausalLM`` with ``FalconModel`` (modeling_falcon.py:657-926), labels given: Llama's step wrapper
    (``loss()``) around Falcon's model."""

    def __init__(self, cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B, device="meta"):
        dtype = DTYPES[setup.precision]
        self.cfg, self.seq, self.batch, self.setup, self.dtype = cfg, seq, batch, setup, dtype
        self.word_embeddings = parameter((cfg.vocab_size, cfg.d_model), dtype, "word_embeddings.weight")
        self.h = [FalconDecoderLayer(cfg, dtype, setup.attention, device, f"h.{i}") for i in range(cfg.num_layers)]
        for layer in self.h:
            layer.gradient_checkpointing = setup.checkpoint == "full"
        self.ln_f = LayerNorm(cfg.d_model, dtype, device, "ln_f")
        half = cfg.d_head // 2
        self.inv_freq = empty((half,), "fp32", "inv_freq")  # buffers: inv_freq, original_inv_freq
        self.original_inv_freq = empty((half,), "fp32", "original_inv_freq")
        self.lm_head = None if cfg.tie_embeddings else parameter((cfg.vocab_size, cfg.d_model), dtype, "lm_head.weight")
        self.input_ids = empty((batch, seq), "int64", "input_ids")
        self.labels = empty((batch, seq), "int64", "labels")

    def parameters(self) -> list[Tensor]:
        out = [self.word_embeddings]
        for layer in self.h:
            out += layer.params()
        out += self.ln_f.params()
        return out + ([self.lm_head] if self.lm_head is not None else [])

    def model(self) -> Tensor:
        """``FalconModel.forward`` (modeling_falcon.py:687-823), no attention mask given."""
        inputs_embeds = A.embedding(self.word_embeddings, self.input_ids)  # :731
        position_ids = A.unsqueeze(arange_plus(self.seq), 0)  # :748-751
        with no_grad():
            find_packed_sequence_indices(A.expand(position_ids, self.batch, -1))
        if self.setup.attention == "naive":  # :753-760, allow_is_causal_skip=False
            causal_mask = eager_mask(self.batch, self.seq, self.dtype, None)
        else:
            causal_mask = sdpa_mask(self.batch, self.seq, None, allow_is_causal_skip=False)
        hidden_states = inputs_embeds  # :779
        position_embeddings = rotary_embedding(hidden_states, position_ids, self.inv_freq)  # :780
        kwargs = dict(attention_mask=causal_mask, position_ids=position_ids, position_embeddings=position_embeddings)
        outputs = None
        for layer in self.h:  # :785-803; ``outputs`` keeps the last layer's probabilities until the next returns
            outputs = layer(hidden_states, **kwargs)
            hidden_states = outputs[0]
        return self.ln_f(hidden_states)  # :805

    def forward(self) -> tuple[Tensor, Tensor]:
        """``FalconForCausalLM.forward`` with ``ForCausalLMLoss``: (logits, loss)."""
        head = self.lm_head if self.lm_head is not None else self.word_embeddings
        return head_and_loss(self.model(), head, self.labels, self.cfg.vocab_size)


def causal_lm(
    cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B, device: str = "meta"
) -> FalconForCausalLM:
    """The program of ``ops.transformers.predict_step`` on target ``device`` ("meta" or "cpu"; LayerNorm's
    statistics differ)."""
    return FalconForCausalLM(cfg, seq, setup, batch, device)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = []
    if setup.checkpoint == "selective":
        out.append("transformers has no selective activation checkpointing")
    if cfg.norm != "layernorm" or cfg.positions != "rope" or cfg.mlp != "gelu" or cfg.moe or cfg.rope_dim != cfg.d_head:
        out.append("a falcon model with another norm, positions, MLP, partial RoPE or experts")
    if (cfg.hf_activation or "gelu") not in ACTIVATIONS:
        out.append(f"activation {cfg.hf_activation} (not transliterated: {', '.join(ACTIVATIONS)} are)")
    return out
