"""transformers 5.24's ``OPTForCausalLM`` training step, transliterated (``models/opt/modeling_opt.py``, line
numbers of transformers 5.24).

GPT-2's shape of model (learned positions added to the embedding, pre-LayerNorm blocks, a final LayerNorm, a tied
head: ``gpt2``'s ``LayerNorm``) with Llama's projections (``llama.Linear``) and GPTBigCode's attention interfaces
(``gpt_bigcode``: eager's fp32 softmax and dropout, sdpa's math path when dropout is above 0).  What OPT does
differently:

* the positions from an all-ones fp32 mask (:352-361): ``cumsum``, ``* mask - 1``, ``.long()``, looked up at
  ``position_ids + 2`` (``OPTLearnedPositionalEmbedding``, :46-71: the table's 2 leading rows,
  ``ModelConfig.position_offset``); the mask and the ids live until the forward returns; no packed-sequence
  check (``create_causal_mask`` gets no ``position_ids``);
* q is scaled after ``q_proj`` (:153, ``* self.scaling``), the interface gets ``scaling=1.0`` (its ``* 1.0`` is
  still an op);
* ``nn.LayerNorm`` with gain and bias, or neither (``layer_norm_elementwise_affine``: ``norm_weights``);
* the layer (:205-256) runs its MLP on the (B·S, d) view of the residual stream, ``dropout`` (``config.dropout``,
  the class's 0.1) after the attention and after ``fc2``, ``attention_dropout`` (0.0) on the probabilities; no
  dropout after the embedding;
* the activation ``activation_function`` (ReLU by default);
* ``final_layer_norm`` is registered before the layers (:308-315, ``model.parameters()`` order).

Refused by the config reader: post-norm blocks, ``project_in``/``project_out``; by ``unmodelled_dropout``:
``layerdrop`` above 0 (whole layers skipped at random).
"""

from __future__ import annotations

from ....config import ModelConfig
from ....hf_config import OPT_DROPOUT
from ....setup import TrainingSetup
from .. import aten as A
from ..aten_activation import dropout, relu
from ..aten_layer_norm import layer_norm
from ..engine import Affine
from ..tensors import Tensor, empty, parameter
from .gpt_bigcode import eager_attention_forward, sdpa_attention_forward
from .llama import (
    DTYPES,
    B,
    GradientCheckpointingLayer,
    Linear,
    LlamaForCausalLM,
    eager_mask,
    head_and_loss,
    int_scalar_op,
)
from .phi import ACTIVATIONS


def pdrop(cfg: ModelConfig, field: str) -> float:
    """A dropout probability: the config.json's, else the class's (``OPT_DROPOUT``)."""
    return dict(cfg.dropout).get(field, OPT_DROPOUT[field])


class LayerNorm:
    """``nn.LayerNorm(d, elementwise_affine=...)``: weight and bias, or none."""

    def __init__(self, size: int, affine: bool, dtype: str, device: str, name: str):
        self.device = device
        self.weight = parameter((size,), dtype, name + ".weight") if affine else None
        self.bias = parameter((size,), dtype, name + ".bias") if affine else None

    def params(self) -> list[Tensor]:
        return [self.weight, self.bias] if self.weight is not None else []

    def __call__(self, x: Tensor) -> Tensor:
        return layer_norm(x, self.weight, self.bias, device=self.device)


class Attention:
    """``OPTAttention`` (modeling_opt.py:98-183), registering k, v, q and out_proj in that order."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, device: str, name: str):
        d, h = cfg.d_model, cfg.num_heads
        self.num_heads, self.head_dim, self.q_scaling = h, d // h, (d // h) ** -0.5
        self.groups, self.scaling, self.attn, self.device = 1, 1.0, attn, device  # the interface's scaling=1.0
        self.attn_pdrop = pdrop(cfg, "attention_dropout")
        self.k_proj = Linear(d, d, cfg.qkv_bias, dtype, name + ".k_proj")
        self.v_proj = Linear(d, d, cfg.qkv_bias, dtype, name + ".v_proj")
        self.q_proj = Linear(d, d, cfg.qkv_bias, dtype, name + ".q_proj")
        self.out_proj = Linear(d, d, cfg.output_bias, dtype, name + ".out_proj")

    def params(self) -> list[Tensor]:
        return self.k_proj.params() + self.v_proj.params() + self.q_proj.params() + self.out_proj.params()

    def __call__(self, hidden_states: Tensor, attention_mask) -> tuple[Tensor, Tensor | None]:
        bsz, tgt_len, _ = hidden_states.shape  # :151
        shape = (bsz, -1, self.num_heads, self.head_dim)
        query_states = A.mul(self.q_proj(hidden_states), self.q_scaling)  # :153
        query_states = A.transpose(A.view(query_states, *shape), 1, 2)  # :154
        key_states = self.k_proj(hidden_states)  # :156
        value_states = self.v_proj(hidden_states)  # :157
        key_states = A.transpose(A.view(key_states, *shape), 1, 2)  # :158
        value_states = A.transpose(A.view(value_states, *shape), 1, 2)  # :159
        interface = eager_attention_forward if self.attn == "naive" else sdpa_attention_forward
        attn_output, attn_weights = interface(self, query_states, key_states, value_states, attention_mask)
        attn_output = A.contiguous(A.reshape(attn_output, bsz, tgt_len, -1))  # :180
        return self.out_proj(attn_output), attn_weights  # :181-183


class OPTDecoderLayer(GradientCheckpointingLayer):
    """``OPTDecoderLayer`` (modeling_opt.py:186-257), pre-norm (``do_layer_norm_before``)."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, device: str, name: str):
        d, affine = cfg.d_model, cfg.norm_weights
        self.device, self.pdrop = device, pdrop(cfg, "dropout")
        self.act = relu if cfg.mlp == "relu" else ACTIVATIONS[cfg.hf_activation]
        self.self_attn = Attention(cfg, dtype, attn, device, name + ".self_attn")
        self.self_attn_layer_norm = LayerNorm(d, affine, dtype, device, name + ".self_attn_layer_norm")
        self.fc1 = Linear(d, cfg.d_ff, cfg.mlp_bias, dtype, name + ".fc1")
        self.fc2 = Linear(cfg.d_ff, d, cfg.mlp_bias, dtype, name + ".fc2")
        self.final_layer_norm = LayerNorm(d, affine, dtype, device, name + ".final_layer_norm")

    def params(self) -> list[Tensor]:
        out = self.self_attn.params() + self.self_attn_layer_norm.params()
        return out + self.fc1.params() + self.fc2.params() + self.final_layer_norm.params()

    def forward(self, hidden_states: Tensor, attention_mask=None, position_ids=None) -> Tensor:
        residual = hidden_states  # :214
        hidden_states = self.self_attn_layer_norm(hidden_states)  # :218
        hidden_states, _ = self.self_attn(hidden_states, attention_mask)  # :221-227
        hidden_states = dropout(hidden_states, self.pdrop, device=self.device)  # :228
        hidden_states = A.add(residual, hidden_states)  # :229
        hidden_states_shape = hidden_states.shape  # :236
        hidden_states = A.reshape(hidden_states, -1, hidden_states.shape[-1])  # :237
        residual = hidden_states  # :238
        hidden_states = self.final_layer_norm(hidden_states)  # :242
        hidden_states = self.act(self.fc1(hidden_states))  # :244-245
        hidden_states = self.fc2(hidden_states)  # :247
        hidden_states = dropout(hidden_states, self.pdrop, device=self.device)  # :248
        return A.view(A.add(residual, hidden_states), *hidden_states_shape)  # :250


class OPTForCausalLM(LlamaForCausalLM):
    """``OPTForCausalLM`` with ``OPTDecoder`` (modeling_opt.py:276-404, 451-541), labels given: Llama's step wrapper
    (``loss()``) around OPT's decoder."""

    def __init__(self, cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B, device="meta"):
        dtype = DTYPES[setup.precision]
        self.cfg, self.seq, self.batch, self.setup, self.dtype, self.device = cfg, seq, batch, setup, dtype, device
        self.embed_tokens = parameter((cfg.vocab_size, cfg.d_model), dtype, "embed_tokens.weight")
        self.embed_positions = parameter((cfg.position_rows, cfg.d_model), dtype, "embed_positions.weight")
        self.final_layer_norm = LayerNorm(cfg.d_model, cfg.norm_weights, dtype, device, "final_layer_norm")
        self.layers = [
            OPTDecoderLayer(cfg, dtype, setup.attention, device, f"layers.{i}") for i in range(cfg.num_layers)
        ]
        for layer in self.layers:
            layer.gradient_checkpointing = setup.checkpoint == "full"
        self.lm_head = None if cfg.tie_embeddings else parameter((cfg.vocab_size, cfg.d_model), dtype, "lm_head.weight")
        self.input_ids = empty((batch, seq), "int64", "input_ids")
        self.labels = empty((batch, seq), "int64", "labels")

    def parameters(self) -> list[Tensor]:
        out = [self.embed_tokens, self.embed_positions] + self.final_layer_norm.params()
        for layer in self.layers:
            out += layer.params()
        return out + ([self.lm_head] if self.lm_head is not None else [])

    def model(self) -> Tensor:
        """``OPTDecoder.forward`` (modeling_opt.py:325-404)."""
        input_ids = A.view(self.input_ids, -1, self.seq)  # :339
        inputs_embeds = A.embedding(self.embed_tokens, input_ids)  # :342
        position_attention_mask = empty((self.batch, self.seq), "fp32", "ones")  # :352-354
        position_ids = empty((self.batch, self.seq), "fp32", "cumsum")  # :358
        scaled = A.mul(position_ids, position_attention_mask)  # :359
        shifted = A.add(scaled, -1)  # ``- 1``: the number wrapped
        del scaled
        ids = A.to(shifted, "int64")  # ``.long()``
        del shifted
        position_ids = ids.alias()  # :361 ``[:, past_seen_tokens:]``: a view
        del ids
        causal_mask = None  # :363-368; sdpa without padding skips the mask (is_causal)
        if self.setup.attention == "naive":
            causal_mask = eager_mask(self.batch, self.seq, self.dtype, None)
        offset = int_scalar_op(position_ids.shape, "add")  # :370, :71 ``position_ids + self.offset``
        pos_embeds = A.embedding(self.embed_positions, offset)
        del offset
        hidden_states = A.add(inputs_embeds, pos_embeds)  # :375
        # :378-392; a checkpointed layer holds its keyword arguments (``position_ids`` too) until its recomputation
        kwargs = dict(attention_mask=causal_mask, position_ids=position_ids)
        hidden_states = self.run_layers(hidden_states, lambda i: kwargs)
        return self.final_layer_norm(hidden_states)  # :394-395

    def forward(self) -> tuple[Tensor, Tensor]:
        """``OPTForCausalLM.forward`` with ``ForCausalLMLoss``: (logits, loss)."""
        head = self.lm_head if self.lm_head is not None else self.embed_tokens
        return head_and_loss(self.model(), head, self.labels, self.cfg.vocab_size)


def causal_lm(
    cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B, device: str = "meta"
) -> OPTForCausalLM:
    """The program of ``ops.transformers.predict_step`` on target ``device`` ("meta" or "cpu"; LayerNorm's
    statistics differ)."""
    return OPTForCausalLM(cfg, seq, setup, batch, device)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = []
    if setup.checkpoint == "selective":
        out.append("transformers has no selective activation checkpointing")
    if cfg.norm != "layernorm" or cfg.positions != "learned" or cfg.norm_placement != "pre" or cfg.moe:
        out.append("an opt model with another norm, positions, norm placement or experts")
    if cfg.mlp not in ("relu", "gelu") or (cfg.mlp == "gelu" and (cfg.hf_activation or "") not in ACTIVATIONS):
        out.append(f"activation_function {cfg.hf_activation or cfg.mlp} (relu, {', '.join(ACTIVATIONS)} are)")
    if cfg.kv_heads != cfg.num_heads or cfg.d_head * cfg.num_heads != cfg.d_model:
        out.append("an opt model with grouped K/V heads or a head size other than d_model / heads")
    return out
