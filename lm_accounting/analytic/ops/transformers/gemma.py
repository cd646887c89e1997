"""transformers 5.24's ``Gemma2ForCausalLM`` and ``Gemma3ForCausalLM`` (text) training steps, transliterated
(``models/gemma2/modeling_gemma2.py``, ``models/gemma3/modeling_gemma3.py``; line numbers of Gemma 2's file).

The rotary embedding, ``repeat_kv``, the masks and the loss are Llama's (``llama.py``).  What Gemma does
differently:

* ``Gemma2RMSNorm`` (:49-66) normalizes ``x.float()`` and multiplies by ``1.0 + self.weight.float()`` in fp32
  (a (d,) tensor made per call), then casts back with ``type_as``;
* sandwich norms: four per layer, the sub-blocks' outputs normalized before each residual add (:307-327);
* GeGLU: ``gelu_pytorch_tanh`` (``F.gelu(approximate="tanh")``) on the gate (:69-82);
* the embeddings scaled by ``sqrt(d)``: a multiply by the ``embed_scale`` buffer cast to the weight's dtype
  (:332-343), which autograd saves (a 0-d tensor);
* both masks built every forward, the full one and the sliding-window one (:431-434), each layer taking its
  type's (``layer_types``);
* Gemma 2: attention logits soft-capped (``attn_logit_softcapping``: ``/ cap``, ``tanh``, ``* cap``, eager
  only: transformers refuses sdpa) and the final logits too (``final_logit_softcapping``, :520-523), 50 and 30
  (``Gemma2Config``'s defaults, which ``hf_config.to_hf_dict`` keeps);
* Gemma 3: q and k RMSNormed per head after the transpose (``modeling_gemma3.py``:329-330), one rotary table
  per layer type (``modeling_gemma3.py``:533-534: ``set(layer_types)``; both the same size, so their order, a set's, does not
  matter), no soft-capping by default;
* Gemma (v1, ``models/gemma/modeling_gemma.py``): Llama's layer (two pre-norms) with Gemma's RMSNorm and GeGLU,
  Gemma's scaled embedding, one causal mask and one rotary table (Llama's), no soft-capping;
* VaultGemma (``models/vaultgemma/modeling_vaultgemma.py``): Gemma 2 without the norms after the sub-blocks
  (``input_layernorm`` and ``pre_feedforward_layernorm`` only: Llama's layer order, :229-275), its soft-capping
  (``VaultGemmaConfig``'s 50 and 30) and eager attention only (``_supports_sdpa = False``, :344).
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..aten_activation import gelu, tanh
from ..tensors import Tensor, empty, no_grad, parameter
from .attention import eager_attention_forward, sdpa_attention_forward
from .llama import (
    DTYPES,
    B,
    GradientCheckpointingLayer,
    Linear,
    LlamaForCausalLM,
    apply_rotary_pos_emb,
    arange_plus,
    find_packed_sequence_indices,
    for_causal_lm_loss,
    rotary_embedding,
    rsqrt_norm,
    windowed_masks,
)
from .llama import DecoderLayer as LlamaDecoderLayer
from .llama import unsupported as llama_unsupported

ATTN_SOFTCAP = {"gemma2": 50.0, "gemma3_text": None, "gemma": None, "vaultgemma": 50.0}
"""``attn_logit_softcapping`` of ``Gemma2Config`` (configuration_gemma2.py:90) and ``VaultGemmaConfig``
(configuration_vaultgemma.py:89); Gemma 3's attention ignores it."""
FINAL_SOFTCAP = {"gemma2": 30.0, "gemma3_text": None, "gemma": None, "vaultgemma": 30.0}
"""``final_logit_softcapping``: ``Gemma2Config`` 30.0 (:89), ``VaultGemmaConfig`` 30.0 (:88), ``Gemma3TextConfig``
None."""
PRE_NORM = ("gemma", "vaultgemma")
"""The types whose layer is Llama's (two pre-norms, ``PreNormDecoderLayer``)."""


class RMSNorm:
    """``Gemma2RMSNorm`` / ``Gemma3RMSNorm`` (modeling_gemma2.py:49-66)."""

    def __init__(self, size: int, dtype: str, name: str):
        self.weight = parameter((size,), dtype, name + ".weight")

    def __call__(self, x: Tensor) -> Tensor:
        output = rsqrt_norm(A.to(x, "fp32"))  # :59 (``_norm``, :56)
        output = A.mul(output, A.add(A.to(self.weight, "fp32"), 1.0))  # :62
        return A.to(output, x.dtype)  # :63


class MLP:
    """``Gemma2MLP`` (modeling_gemma2.py:69-82): ``down_proj(gelu_tanh(gate_proj(x)) * up_proj(x))``."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        d, f = cfg.d_model, cfg.d_ff
        self.gate_proj = Linear(d, f, False, dtype, name + ".gate_proj")
        self.up_proj = Linear(d, f, False, dtype, name + ".up_proj")
        self.down_proj = Linear(f, d, False, dtype, name + ".down_proj")

    def params(self) -> list[Tensor]:
        return self.gate_proj.params() + self.up_proj.params() + self.down_proj.params()

    def __call__(self, x: Tensor) -> Tensor:
        return self.down_proj(A.mul(gelu(self.gate_proj(x)), self.up_proj(x)))  # :81


class Attention:
    """``Gemma2Attention`` (modeling_gemma2.py:211-281) and ``Gemma3Attention`` (its per-head q/k norms)."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str):
        d, h, kv, hd = cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.d_head
        self.head_dim, self.groups, self.scaling, self.attn = hd, h // kv, 1.0, attn  # query_pre_attn_scalar**-0.5
        self.softcap = ATTN_SOFTCAP[cfg.hf_model_type]
        self.q_proj = Linear(d, h * hd, cfg.qkv_bias, dtype, name + ".q_proj")
        self.k_proj = Linear(d, kv * hd, cfg.qkv_bias, dtype, name + ".k_proj")
        self.v_proj = Linear(d, kv * hd, cfg.qkv_bias, dtype, name + ".v_proj")
        self.o_proj = Linear(h * hd, d, cfg.output_bias, dtype, name + ".o_proj")
        self.q_norm = RMSNorm(hd, dtype, name + ".q_norm") if cfg.qk_norm else None
        self.k_norm = RMSNorm(hd, dtype, name + ".k_norm") if cfg.qk_norm else None

    def params(self) -> list[Tensor]:
        out = self.q_proj.params() + self.k_proj.params() + self.v_proj.params() + self.o_proj.params()
        return out + ([self.q_norm.weight, self.k_norm.weight] if self.q_norm else [])

    def __call__(self, hidden_states: Tensor, position_embeddings, attention_mask) -> tuple[Tensor, Tensor | None]:
        input_shape = hidden_states.shape[:-1]  # :249
        hidden_shape = (*input_shape, -1, self.head_dim)
        query_states = A.transpose(A.view(self.q_proj(hidden_states), *hidden_shape), 1, 2)  # :252
        key_states = A.transpose(A.view(self.k_proj(hidden_states), *hidden_shape), 1, 2)  # :253
        value_states = A.transpose(A.view(self.v_proj(hidden_states), *hidden_shape), 1, 2)  # :254
        if self.q_norm is not None:  # modeling_gemma3.py:329-330
            query_states = self.q_norm(query_states)
            key_states = self.k_norm(key_states)
        cos, sin = position_embeddings  # :256
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)  # :257
        if self.attn == "naive":
            attn_output, attn_weights = eager_attention_forward(
                self, query_states, key_states, value_states, attention_mask, softcap=self.softcap
            )
        else:
            attn_output, attn_weights = sdpa_attention_forward(
                self, query_states, key_states, value_states, attention_mask
            )
        attn_output = A.contiguous(A.reshape(attn_output, *input_shape, -1))  # :279
        attn_output = self.o_proj(attn_output)  # :280
        return attn_output, attn_weights  # the locals die here


class DecoderLayer(GradientCheckpointingLayer):
    """``Gemma2DecoderLayer`` (modeling_gemma2.py:284-329)."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str):
        self.self_attn = Attention(cfg, dtype, attn, name + ".self_attn")
        self.mlp = MLP(cfg, dtype, name + ".mlp")
        self.norms = [
            RMSNorm(cfg.d_model, dtype, f"{name}.{n}")
            for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm")
        ]
        self.post_feedforward_layernorm = RMSNorm(cfg.d_model, dtype, name + ".post_feedforward_layernorm")

    def params(self) -> list[Tensor]:
        norms = [n.weight for n in self.norms] + [self.post_feedforward_layernorm.weight]
        return self.self_attn.params() + self.mlp.params() + norms

    def forward(
        self, hidden_states: Tensor, attention_mask=None, position_embeddings=None, position_ids=None
    ) -> Tensor:
        input_layernorm, post_attention_layernorm, pre_feedforward_layernorm = self.norms
        residual = hidden_states  # :307
        hidden_states = input_layernorm(hidden_states)  # :309
        hidden_states, _ = self.self_attn(hidden_states, position_embeddings, attention_mask)  # :312-319
        hidden_states = post_attention_layernorm(hidden_states)  # :320
        hidden_states = A.add(residual, hidden_states)  # :321
        residual = hidden_states  # :323
        hidden_states = pre_feedforward_layernorm(hidden_states)  # :324
        hidden_states = self.mlp(hidden_states)  # :325
        hidden_states = self.post_feedforward_layernorm(hidden_states)  # :326
        return A.add(residual, hidden_states)  # :327


class PreNormDecoderLayer(LlamaDecoderLayer):
    """``GemmaDecoderLayer`` (modeling_gemma.py:286-326) and ``VaultGemmaDecoderLayer`` (whose second norm is
    ``pre_feedforward_layernorm``): Llama's layer (its forward and parameter order) with Gemma's attention, norm
    and MLP."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str):
        self.self_attn = Attention(cfg, dtype, attn, name + ".self_attn")
        self.mlp = MLP(cfg, dtype, name + ".mlp")
        self.input_layernorm = RMSNorm(cfg.d_model, dtype, name + ".input_layernorm")
        self.post_attention_layernorm = RMSNorm(cfg.d_model, dtype, name + ".post_attention_layernorm")


class GemmaForCausalLM(LlamaForCausalLM):
    """``Gemma2ForCausalLM`` / ``Gemma3ForCausalLM`` with their text model, labels given."""

    def __init__(self, cfg: ModelConfig, seq: int, setup: TrainingSetup, batch=B, buffer_dtype: str | None = None):
        dtype = DTYPES[setup.precision]
        self.cfg, self.seq, self.batch, self.setup, self.dtype = cfg, seq, batch, setup, dtype
        self.embed_tokens = parameter((cfg.vocab_size, cfg.d_model), dtype, "embed_tokens.weight")
        # a buffer, made in the model's dtype (an fp32 model under FSDP2's bf16 policy keeps it fp32)
        self.embed_scale = empty((), buffer_dtype or dtype, "embed_scale")
        layer = PreNormDecoderLayer if cfg.hf_model_type in PRE_NORM else DecoderLayer
        self.layers = [layer(cfg, dtype, setup.attention, f"layers.{i}") for i in range(cfg.num_layers)]
        for layer in self.layers:
            layer.gradient_checkpointing = setup.checkpoint == "full"
        self.norm = RMSNorm(cfg.d_model, dtype, "norm")
        self.types = [cfg.layer_windowed(i) for i in range(cfg.num_layers)]
        self.windowed = cfg.hf_model_type != "gemma"  # Gemma 2 and 3 build the sliding mask too
        tables = len(set(self.types)) if cfg.hf_model_type == "gemma3_text" else 1
        half = cfg.d_head // 2  # buffers: inv_freq and original_inv_freq (per layer type for Gemma 3)
        self.buffers = [empty((half,), "fp32", "inv_freq") for _ in range(2 * tables)]
        self.inv_freq = self.buffers[0]
        self.lm_head = None if cfg.tie_embeddings else parameter((cfg.vocab_size, cfg.d_model), dtype, "lm_head.weight")
        self.input_ids = empty((batch, seq), "int64", "input_ids")
        self.labels = empty((batch, seq), "int64", "labels")

    def parameters(self) -> list[Tensor]:
        out = [self.embed_tokens]
        for layer in self.layers:
            out += layer.params()
        out.append(self.norm.weight)
        return out + ([self.lm_head] if self.lm_head is not None else [])

    def model(self) -> Tensor:
        """``Gemma2Model.forward`` (modeling_gemma2.py:396-455) / ``Gemma3TextModel.forward``."""
        # :410, :343: ``super().forward(input_ids) * self.embed_scale.to(self.weight.dtype)``
        embedded = self.lookup()
        inputs_embeds = A.mul(embedded, A.to(self.embed_scale, self.embed_tokens.dtype))
        del embedded
        position_ids = A.unsqueeze(arange_plus(self.seq), 0)  # :417-419
        with no_grad():
            find_packed_sequence_indices(A.expand(position_ids, self.batch, -1))
        causal_mask_mapping = windowed_masks(  # :421-434 (Gemma v1: the full one only)
            self.batch, self.seq, self.dtype, self.setup.attention, self.cfg.sliding_window, windowed=self.windowed
        )
        hidden_states = inputs_embeds
        del inputs_embeds
        tables = {t: rotary_embedding(hidden_states, position_ids, self.inv_freq) for t in sorted(set(self.types))}
        if self.cfg.hf_model_type in ("gemma2", "vaultgemma"):  # one table for every layer (:438)
            tables = dict.fromkeys(self.types, tables[self.types[0]])
        hidden_states = self.run_layers(  # :440-448
            hidden_states,
            lambda i: dict(
                attention_mask=causal_mask_mapping[self.types[i]],
                position_embeddings=tables[self.types[i]],
                position_ids=position_ids,
            ),
        )
        return self.norm(hidden_states)  # :450

    def forward(self) -> tuple[Tensor, Tensor]:
        """``Gemma2ForCausalLM.forward`` (:477-533): the head, the final soft-capping, ``ForCausalLMLoss``:
        (logits, loss), the output the step keeps (``LlamaForCausalLM.loss`` runs it)."""
        hidden_states = self.model()
        logits = self.lm_head_logits(hidden_states)  # :519
        cap = FINAL_SOFTCAP[self.cfg.hf_model_type]
        if cap is not None:  # :520-523
            logits = A.div(logits, cap)
            logits = tanh(logits)
            logits = A.mul(logits, cap)
        loss = for_causal_lm_loss(logits, self.labels, self.cfg.vocab_size)
        return logits, loss


def causal_lm(
    cfg: ModelConfig, seq: int, setup: TrainingSetup, batch=B, device: str = "meta", buffer_dtype: str | None = None
) -> GemmaForCausalLM:
    """The program of ``ops.transformers.predict_step`` (the same on a meta and a cpu target); ``buffer_dtype``:
    the buffers' dtype where it is not the parameters' (FSDP2's bf16 policy over an fp32 model)."""
    return GemmaForCausalLM(cfg, seq, setup, batch, buffer_dtype)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = [r for r in llama_unsupported(cfg, setup) if "sliding" not in r and "norm, MLP" not in r]
    if cfg.hf_model_type in ("gemma2", "vaultgemma") and setup.attention == "sdpa":
        out.append(f"transformers runs {cfg.hf_model_type} with eager attention only (sdpa has no soft-capping)")
    placement = "pre" if cfg.hf_model_type in PRE_NORM else "sandwich"
    if cfg.sliding_window is None and cfg.hf_model_type != "gemma":
        out.append("a gemma model without a sliding window (transformers' mask needs one)")
    if cfg.sliding_window is not None and cfg.hf_model_type == "gemma":
        out.append("a gemma (v1) model with a sliding window")
    if cfg.norm != "rmsnorm" or cfg.norm_placement != placement or cfg.mlp != "geglu" or not cfg.scale_embeddings:
        out.append("a gemma model with another norm, norm placement, MLP or unscaled embeddings")
    return out
