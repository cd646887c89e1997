"""transformers 5.24's ``CohereForCausalLM`` training step, transliterated (``models/cohere/modeling_cohere.py``).

The masks, the attention interfaces, the MLP and the loss are Llama's (``llama.py``).  What Cohere (Command R,
Command R+) does differently:

* ``CohereLayerNorm`` (:51-65): in fp32, mean-centred (``hidden_states - mean`` computed twice), a gain and no
  bias, cast back; with ``use_qk_norm`` the q/k norms are the same with a gain per head, (h, head_dim);
* ``CohereRotaryEmbedding.forward`` (:105-111): the frequencies ``repeat_interleave``d, not ``cat``ed;
* ``apply_rotary_pos_emb`` (:175-200): q and k in fp32 (``.float()``), ``rotate_half`` over interleaved pairs
  (:167-172: ``x[..., ::2]``, ``x[..., 1::2]``, ``stack([-x2, x1], -1).flatten(-2)``), cast back;
* the attention (:239-285): the three projections first, then the q/k norms, then the transposes;
* the decoder layer (:297-340): ``residual + attention + mlp``, both from ``input_layernorm``;
* ``logits * logit_scale`` (:498) before the loss.

Cohere2 (``models/cohere2/modeling_cohere2.py``; Command R7B, Command A) is the same model without q/k norms, its
layers windowed but every ``sliding_window_pattern``-th: both masks made every forward (:401-409, the full one
first), each layer taking its type's, and RoPE on the windowed layers' q and k only (:220-221).
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..aten_index import stack, strided_slice
from ..tensors import Tensor, no_grad, parameter, repeated
from .attention import eager_attention_forward, sdpa_attention_forward
from .llama import MLP as LlamaMLP
from .llama import (
    B,
    GradientCheckpointingLayer,
    Linear,
    LlamaForCausalLM,
    arange_plus,
    eager_mask,
    find_packed_sequence_indices,
    for_causal_lm_loss,
    sdpa_mask,
)
from .llama import unsupported as llama_unsupported


class LayerNorm:
    """``CohereLayerNorm`` (modeling_cohere.py:51-65): ``shape`` (d,), or (heads, head_dim) for a q/k norm."""

    def __init__(self, shape: int | tuple[int, ...], dtype: str, name: str):
        self.weight = parameter(shape if isinstance(shape, tuple) else (shape,), dtype, name + ".weight")

    def __call__(self, hidden_states: Tensor) -> Tensor:
        input_dtype = hidden_states.dtype  # :59
        hidden_states = A.to(hidden_states, "fp32")  # :60
        mean = A.mean(hidden_states, -1, keepdim=True)  # :61
        variance = A.mean(A.pow_(A.sub(hidden_states, mean), 2), -1, keepdim=True)  # :62
        hidden_states = A.mul(A.sub(hidden_states, mean), A.rsqrt(A.add(variance, 1e-5)))  # :63
        hidden_states = A.mul(A.to(self.weight, "fp32"), hidden_states)  # :64
        return A.to(hidden_states, input_dtype)  # :65


def repeat_interleave(x: Tensor) -> Tensor:
    """``x.repeat_interleave(2, dim=-1)``: expanded along a new last dim, then a contiguous copy viewed flat."""
    *lead, half = x.shape
    return A.view(A.clone(A.expand(A.unsqueeze(x, -1), *lead, half, 2), contiguous=True), *lead, 2 * half)


def rotary_embedding(x: Tensor, position_ids: Tensor, inv_freq: Tensor) -> tuple[Tensor, Tensor]:
    """``CohereRotaryEmbedding.forward`` (:105-111): ``repeat_interleave(freqs, 2, dim=-1)``; no tensor of it
    requires grad."""
    freqs = A.mul(A.to(A.unsqueeze(position_ids, -1), "fp32"), inv_freq)  # :107
    emb = repeat_interleave(freqs)  # :108
    del freqs
    cos = A.mul(A.unary(emb, "cos"), 1.0)  # :109 (* attention_scaling)
    sin = A.mul(A.unary(emb, "sin"), 1.0)  # :110
    return A.to(cos, x.dtype), A.to(sin, x.dtype)  # :112


def rotate_half(x: Tensor) -> Tensor:
    """modeling_cohere.py:167-172: interleaved pairs."""
    x1 = strided_slice(x, 0, 2)
    x2 = strided_slice(x, 1, 2)
    rot_x = stack((A.neg(x2), x1), -1)
    return A.view(rot_x, *rot_x.shape[:-2], 2 * rot_x.shape[-2])  # flatten(-2): a view of the stack


def apply_rotary_pos_emb(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """modeling_cohere.py:175-200: in fp32, cast back to q's dtype."""
    dtype = q.dtype
    q = A.to(q, "fp32")
    k = A.to(k, "fp32")
    cos = A.unsqueeze(cos, 1)
    sin = A.unsqueeze(sin, 1)
    q_embed = A.add(A.mul(q, cos), A.mul(rotate_half(q), sin))
    k_embed = A.add(A.mul(k, cos), A.mul(rotate_half(k), sin))
    return A.to(q_embed, dtype), A.to(k_embed, dtype)


class Attention:
    """``CohereAttention`` (modeling_cohere.py:203-285)."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str, windowed: bool = False):
        d, h, kv, hd = cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.d_head
        self.head_dim, self.groups, self.scaling, self.attn = hd, h // kv, hd**-0.5, attn
        self.cohere2, self.windowed = cfg.hf_model_type == "cohere2", windowed
        self.q_proj = Linear(d, h * hd, cfg.qkv_bias, dtype, name + ".q_proj")
        self.k_proj = Linear(d, kv * hd, cfg.qkv_bias, dtype, name + ".k_proj")
        self.v_proj = Linear(d, kv * hd, cfg.qkv_bias, dtype, name + ".v_proj")
        self.o_proj = Linear(h * hd, d, cfg.output_bias, dtype, name + ".o_proj")
        self.q_norm = LayerNorm((h, hd), dtype, name + ".q_norm") if cfg.qk_norm else None
        self.k_norm = LayerNorm((kv, hd), dtype, name + ".k_norm") if cfg.qk_norm else None

    def params(self) -> list[Tensor]:
        out = self.q_proj.params() + self.k_proj.params() + self.v_proj.params() + self.o_proj.params()
        return out + ([self.q_norm.weight, self.k_norm.weight] if self.q_norm else [])

    def __call__(self, hidden_states: Tensor, position_embeddings, attention_mask) -> tuple[Tensor, Tensor | None]:
        input_shape = hidden_states.shape[:-1]  # :247
        hidden_shape = (*input_shape, -1, self.head_dim)
        if self.cohere2:  # modeling_cohere2.py:212-221: each projection transposed; RoPE on windowed layers only
            q, k, v = (A.transpose(A.view(p(hidden_states), *hidden_shape), 1, 2) for p in self.projections())
            cos, sin = position_embeddings
            if self.windowed:
                q, k = apply_rotary_pos_emb(q, k, cos, sin)
            del cos, sin
            return self.attend(q, k, v, input_shape, attention_mask)
        query_states = A.view(self.q_proj(hidden_states), *hidden_shape)  # :250-252
        key_states = A.view(self.k_proj(hidden_states), *hidden_shape)
        value_states = A.view(self.v_proj(hidden_states), *hidden_shape)
        if self.q_norm is not None:  # :254-256
            query_states = self.q_norm(query_states)
            key_states = self.k_norm(key_states)
        query_states = A.transpose(query_states, 1, 2)  # :258-260
        key_states = A.transpose(key_states, 1, 2)
        value_states = A.transpose(value_states, 1, 2)
        cos, sin = position_embeddings  # :262
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)  # :263
        del cos, sin
        return self.attend(query_states, key_states, value_states, input_shape, attention_mask)

    def projections(self) -> tuple[Linear, Linear, Linear]:
        return self.q_proj, self.k_proj, self.v_proj

    def attend(self, q: Tensor, k: Tensor, v: Tensor, input_shape, attention_mask) -> tuple[Tensor, Tensor | None]:
        """The attention interface, the heads merged, ``o_proj`` (:265-284)."""
        interface = eager_attention_forward if self.attn == "naive" else sdpa_attention_forward
        attn_output, attn_weights = interface(self, q, k, v, attention_mask)  # :272
        attn_output = A.contiguous(A.reshape(attn_output, *input_shape, -1))  # :282
        return self.o_proj(attn_output), attn_weights  # :283-284


class DecoderLayer(GradientCheckpointingLayer):
    """``CohereDecoderLayer`` (modeling_cohere.py:288-340): attention and the MLP from one norm."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str, windowed: bool = False):
        self.self_attn = Attention(cfg, dtype, attn, name + ".self_attn", windowed)
        self.mlp = LlamaMLP(cfg, dtype, name + ".mlp")
        self.input_layernorm = LayerNorm(cfg.d_model, dtype, name + ".input_layernorm")

    def params(self) -> list[Tensor]:
        return self.self_attn.params() + self.mlp.params() + [self.input_layernorm.weight]

    def forward(
        self, hidden_states: Tensor, attention_mask=None, position_embeddings=None, position_ids=None
    ) -> Tensor:
        residual = hidden_states  # :324
        hidden_states = self.input_layernorm(hidden_states)  # :325
        # :327-335; ``_`` keeps eager's probabilities until the layer returns
        hidden_states_attention, _ = self.self_attn(hidden_states, position_embeddings, attention_mask)
        hidden_states_mlp = self.mlp(hidden_states)  # :337
        return A.add(A.add(residual, hidden_states_attention), hidden_states_mlp)  # :338


class CohereForCausalLM(LlamaForCausalLM):
    """``CohereForCausalLM`` with ``CohereModel`` (modeling_cohere.py:361-510), labels given."""

    def __init__(self, cfg: ModelConfig, seq: int, setup: TrainingSetup, batch=B):
        super().__init__(cfg, seq, setup, batch, norm=LayerNorm)

    middle_alike = False  # Cohere2's layers are of two kinds

    def decoder_layer(self, name: str, norm) -> GradientCheckpointingLayer:
        windowed = self.cfg.hf_model_type == "cohere2" and self.cfg.layer_windowed(int(name.rpartition(".")[2]))
        return DecoderLayer(self.cfg, self.dtype, self.setup.attention, name, windowed)

    def model(self) -> Tensor:
        """``CohereModel.forward`` (modeling_cohere.py:382-433): Llama's with Cohere's rotary embedding."""
        inputs_embeds = self.lookup()  # :396
        position_ids = A.unsqueeze(arange_plus(self.seq), 0)  # :402-404
        with no_grad():
            find_packed_sequence_indices(A.expand(position_ids, self.batch, -1))
        masks = {False: self.mask(None)}  # :406-412; Cohere2 (modeling_cohere2.py:401-409): both, full first
        if self.cfg.hf_model_type == "cohere2":
            masks[True] = self.mask(self.cfg.sliding_window)
        hidden_states = inputs_embeds  # :414
        position_embeddings = rotary_embedding(hidden_states, position_ids, self.inv_freq)  # :415
        kwargs = dict(position_embeddings=position_embeddings, position_ids=position_ids)
        if self.cfg.hf_model_type == "cohere2":  # two kinds of layer: each replayed
            for i, layer in enumerate(self.layers):
                hidden_states = layer(hidden_states, attention_mask=masks[self.cfg.layer_windowed(i)], **kwargs)
            return self.norm(hidden_states)
        kwargs["attention_mask"] = masks[False]
        layers = self.layers  # :417-426; the middle layers, alike: one replayed for all
        middle = layers[1:-1] if len(layers) > 2 else []
        for layer in layers[:1]:
            hidden_states = layer(hidden_states, **kwargs)
        with repeated(len(middle)):
            for layer in middle[:1]:
                hidden_states = layer(hidden_states, **kwargs)
        for layer in layers[1:][-1:]:
            hidden_states = layer(hidden_states, **kwargs)
        return self.norm(hidden_states)  # :428

    def mask(self, window: int | None) -> Tensor | None:
        if self.setup.attention == "naive":
            return eager_mask(self.batch, self.seq, self.dtype, window)
        return sdpa_mask(self.batch, self.seq, window, allow_is_causal_skip=True)

    def forward(self) -> tuple[Tensor, Tensor]:
        """``CohereForCausalLM.forward`` (:456-510): the logits scaled by ``logit_scale`` (a new tensor; the
        LM head's output dies), then the loss."""
        hidden_states = self.model()
        hidden_states = A.view(hidden_states, *hidden_states.shape)  # slice_logits_to_keep(.., 0): an alias
        logits = self.lm_head_logits(hidden_states)  # :497
        logits = A.mul(logits, 0.0625)  # :498 (the value does not change the bytes)
        loss = for_causal_lm_loss(logits, self.labels, self.cfg.vocab_size)
        return logits, loss


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch=B) -> CohereForCausalLM:
    """The program of ``ops.transformers.predict_step``."""
    return CohereForCausalLM(cfg, seq, setup, batch)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``: Llama's checks, less the norm and
    the block it replaces."""
    out = [u for u in llama_unsupported(cfg, setup) if not u.startswith(("a llama-family", "qk-norm over"))]
    if cfg.norm != "layernorm" or cfg.norm_bias or cfg.parallel_block != "one_norm" or cfg.mlp != "swiglu":
        out.append("a cohere model with another norm, block or MLP")
    if cfg.qk_norm and cfg.qk_norm_scope != "head_weights":
        out.append("a cohere model with q/k norms other than its per-head gains")
    if (cfg.sliding_window is not None) != (cfg.hf_model_type == "cohere2"):
        out.append("a cohere model with a sliding window, or a cohere2 model without one")
    return out
