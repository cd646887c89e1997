"""transformers 5.24's ``Olmo2ForCausalLM`` training step, transliterated (``models/olmo2/modeling_olmo2.py``).

The model, its MLP, its masks and its loss are Llama's (``llama.py``).  What OLMo-2 does differently:

* ``Olmo2RMSNorm`` (:51-65) multiplies the weight by the fp32 normalized input and casts the product back:
  ``(self.weight * hidden_states).to(input_dtype)`` (Llama casts first);
* q and k are normalized over the whole projection, before the heads are split (:228-229);
* post-norms: each sub-block's output is normalized before the residual add (:309, :315); no pre-norm;
* ``Olmo2RotaryEmbedding`` returns cos and sin in fp32 (no cast to the activations' dtype), so in bf16 the
  rotary products are fp32 and ``apply_rotary_pos_emb`` casts q and k back (:172-177).

OLMo-3 (``models/olmo3/modeling_olmo3.py``, ``Olmo3ForCausalLM``) is OLMo-2 with sliding windows by
``layer_types``: both masks built every forward, the full one and the sliding one (:419-423), and one rotary table,
with its two buffers, per layer type (:426-428, ``Olmo3RotaryEmbedding``: the same size, so the set's order does not
matter), each layer taking its type's (:430-437).
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..tensors import Tensor, empty, no_grad, parameter
from .attention import eager_attention_forward, sdpa_attention_forward
from .llama import (
    MLP,
    B,
    GradientCheckpointingLayer,
    Linear,
    LlamaForCausalLM,
    arange_plus,
    eager_mask,
    find_packed_sequence_indices,
    rotate_half,
    windowed_masks,
)
from .llama import unsupported as llama_unsupported


class RMSNorm:
    """``Olmo2RMSNorm`` (modeling_olmo2.py:51-65)."""

    def __init__(self, size: int, dtype: str, name: str):
        self.weight = parameter((size,), dtype, name + ".weight")

    def __call__(self, hidden_states: Tensor) -> Tensor:
        input_dtype = hidden_states.dtype  # :61
        hidden_states = A.to(hidden_states, "fp32")  # :62
        variance = A.mean(A.pow_(hidden_states, 2), -1, keepdim=True)  # :63
        hidden_states = A.mul(hidden_states, A.rsqrt(A.add(variance, 1e-6)))  # :64
        return A.to(A.mul(self.weight, hidden_states), input_dtype)  # :65


def rotary_embedding(position_ids: Tensor, inv_freq: Tensor) -> tuple[Tensor, Tensor]:
    """``Olmo2RotaryEmbedding.forward``: Llama's without the final cast (cos and sin stay fp32)."""
    freqs = A.mul(A.to(A.unsqueeze(position_ids, -1), "fp32"), inv_freq)
    emb = A.cat((freqs, freqs), -1)
    cos = A.mul(A.unary(emb, "cos"), 1.0)
    sin = A.mul(A.unary(emb, "sin"), 1.0)
    return cos, sin


def apply_rotary_pos_emb(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """modeling_olmo2.py:154-177."""
    q_type, k_type = q.dtype, k.dtype
    cos = A.unsqueeze(cos, 1)
    sin = A.unsqueeze(sin, 1)
    q_embed = A.add(A.mul(q, cos), A.mul(rotate_half(q), sin))
    k_embed = A.add(A.mul(k, cos), A.mul(rotate_half(k), sin))
    return A.to(q_embed, q_type), A.to(k_embed, k_type)


class Attention:
    """``Olmo2Attention`` (modeling_olmo2.py:188-259); ``norm`` and ``rotate`` are a model's own (OLMoE's Llama
    RMSNorm and RoPE)."""

    norm = RMSNorm

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str):
        d, h, kv, hd = cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.d_head
        self.head_dim, self.groups, self.scaling, self.attn = hd, h // kv, hd**-0.5, attn
        self.q_proj = Linear(d, h * hd, cfg.qkv_bias, dtype, name + ".q_proj")
        self.k_proj = Linear(d, kv * hd, cfg.qkv_bias, dtype, name + ".k_proj")
        self.v_proj = Linear(d, kv * hd, cfg.qkv_bias, dtype, name + ".v_proj")
        self.o_proj = Linear(h * hd, d, cfg.output_bias, dtype, name + ".o_proj")
        self.q_norm = self.norm(h * hd, dtype, name + ".q_norm")
        self.k_norm = self.norm(kv * hd, dtype, name + ".k_norm")

    def params(self) -> list[Tensor]:
        out = self.q_proj.params() + self.k_proj.params() + self.v_proj.params() + self.o_proj.params()
        return out + [self.q_norm.weight, self.k_norm.weight]

    def __call__(self, hidden_states: Tensor, position_embeddings, attention_mask) -> tuple[Tensor, Tensor | None]:
        input_shape = hidden_states.shape[:-1]  # :225
        hidden_shape = (*input_shape, -1, self.head_dim)
        query_states = self.q_norm(self.q_proj(hidden_states))  # :228
        key_states = self.k_norm(self.k_proj(hidden_states))  # :229
        value_states = self.v_proj(hidden_states)  # :230
        query_states = A.transpose(A.view(query_states, *hidden_shape), 1, 2)  # :232
        key_states = A.transpose(A.view(key_states, *hidden_shape), 1, 2)  # :233
        value_states = A.transpose(A.view(value_states, *hidden_shape), 1, 2)  # :234
        cos, sin = position_embeddings  # :236
        query_states, key_states = self.rotate(query_states, key_states, cos, sin)  # :237
        interface = eager_attention_forward if self.attn == "naive" else sdpa_attention_forward
        attn_output, attn_weights = interface(self, query_states, key_states, value_states, attention_mask)
        attn_output = A.contiguous(A.reshape(attn_output, *input_shape, -1))  # :257
        attn_output = self.o_proj(attn_output)  # :258
        return attn_output, attn_weights  # the locals die here

    def rotate(self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """``apply_rotary_pos_emb`` (modeling_olmo2.py:154-177)."""
        return apply_rotary_pos_emb(q, k, cos, sin)


class DecoderLayer(GradientCheckpointingLayer):
    """``Olmo2DecoderLayer`` (modeling_olmo2.py:278-317)."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str):
        self.self_attn = Attention(cfg, dtype, attn, name + ".self_attn")
        self.mlp = MLP(cfg, dtype, name + ".mlp")
        self.post_attention_layernorm = RMSNorm(cfg.d_model, dtype, name + ".post_attention_layernorm")
        self.post_feedforward_layernorm = RMSNorm(cfg.d_model, dtype, name + ".post_feedforward_layernorm")

    def params(self) -> list[Tensor]:
        norms = [self.post_attention_layernorm.weight, self.post_feedforward_layernorm.weight]
        return self.self_attn.params() + self.mlp.params() + norms

    def forward(
        self, hidden_states: Tensor, attention_mask=None, position_embeddings=None, position_ids=None
    ) -> Tensor:
        residual = hidden_states  # :299
        hidden_states, _ = self.self_attn(hidden_states, position_embeddings, attention_mask)  # :300-308
        hidden_states = self.post_attention_layernorm(hidden_states)  # :309
        hidden_states = A.add(residual, hidden_states)  # :310
        residual = hidden_states  # :313
        hidden_states = self.mlp(hidden_states)  # :314
        hidden_states = self.post_feedforward_layernorm(hidden_states)  # :315
        return A.add(residual, hidden_states)  # :316


class Olmo2ForCausalLM(LlamaForCausalLM):
    """``Olmo2ForCausalLM``: Llama's model with OLMo-2's layers, norm and rotary embedding."""

    def __init__(self, cfg: ModelConfig, seq: int, setup: TrainingSetup, batch=B):
        super().__init__(cfg, seq, setup, batch, norm=RMSNorm)  # OLMo-2's final norm

    def decoder_layer(self, name: str, norm) -> DecoderLayer:
        return DecoderLayer(self.cfg, self.dtype, self.setup.attention, name)

    def model(self) -> Tensor:
        """``Olmo2Model.forward`` = ``LlamaModel.forward`` (modeling_olmo2.py:360-411)."""
        inputs_embeds = A.embedding(self.embed_tokens, self.input_ids)
        position_ids = A.unsqueeze(arange_plus(self.seq), 0)
        with no_grad():
            find_packed_sequence_indices(A.expand(position_ids, self.batch, -1))
        causal = eager_mask(self.batch, self.seq, self.dtype, None) if self.setup.attention == "naive" else None
        hidden_states = inputs_embeds
        del inputs_embeds
        position_embeddings = rotary_embedding(position_ids, self.inv_freq)
        kwargs = dict(attention_mask=causal, position_embeddings=position_embeddings, position_ids=position_ids)
        hidden_states = self.run_layers(hidden_states, lambda i: kwargs)
        return self.norm(hidden_states)


class Olmo3ForCausalLM(Olmo2ForCausalLM):
    """``Olmo3ForCausalLM``: OLMo-2's with a mask and a rotary table per layer type (the module docstring)."""

    def __init__(self, cfg: ModelConfig, seq: int, setup: TrainingSetup, batch=B):
        super().__init__(cfg, seq, setup, batch)
        self.types = [cfg.layer_windowed(i) for i in range(cfg.num_layers)]
        half = cfg.d_head // 2  # {type}_inv_freq and {type}_original_inv_freq per layer type (Llama's made one pair)
        self.type_buffers = [empty((half,), "fp32", "inv_freq") for _ in range(2 * (len(set(self.types)) - 1))]

    def model(self) -> Tensor:
        """``Olmo3Model.forward`` (modeling_olmo3.py:386-446)."""
        inputs_embeds = A.embedding(self.embed_tokens, self.input_ids)
        position_ids = A.unsqueeze(arange_plus(self.seq), 0)
        with no_grad():
            find_packed_sequence_indices(A.expand(position_ids, self.batch, -1))
        masks = windowed_masks(self.batch, self.seq, self.dtype, self.setup.attention, self.cfg.sliding_window)
        hidden_states = inputs_embeds
        del inputs_embeds
        tables = {t: rotary_embedding(position_ids, self.inv_freq) for t in sorted(set(self.types))}
        hidden_states = self.run_layers(
            hidden_states,
            lambda i: dict(
                attention_mask=masks[self.types[i]],
                position_embeddings=tables[self.types[i]],
                position_ids=position_ids,
            ),
        )
        return self.norm(hidden_states)


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch=B, device: str = "meta") -> Olmo2ForCausalLM:
    """The program of ``ops.transformers.predict_step`` (the same on a meta and a cpu target)."""
    return (Olmo3ForCausalLM if cfg.hf_model_type == "olmo3" else Olmo2ForCausalLM)(cfg, seq, setup, batch)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = [r for r in llama_unsupported(cfg, setup) if "qk-norm" not in r and "norm, MLP" not in r]
    if cfg.sliding_window is not None and cfg.hf_model_type != "olmo3":
        out.append("an olmo2 model with a sliding window")
    if cfg.norm != "rmsnorm" or cfg.norm_placement != "post" or cfg.mlp != "swiglu" or cfg.positions != "rope":
        out.append("an olmo2 model with another norm, norm placement, MLP or positions")
    if not cfg.qk_norm or cfg.qk_norm_scope != "projection":
        out.append("an olmo2 model without whole-projection q/k norms")
    return out
