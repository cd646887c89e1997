"""transformers 5.24's ``GptOssForCausalLM`` training step (gpt-oss), transliterated
(``models/gpt_oss/modeling_gpt_oss.py``).

The model's skeleton, its eager masks (``windowed_masks``: the full and the sliding one, every forward) and its loss
are Llama's (``llama.py``); the experts run ``grouped_mm`` (``moe.Experts``).  What gpt-oss does differently:

* ``GptOssRMSNorm`` (:48-63) is OLMo-2's (``olmo2.RMSNorm``: the weight times the fp32 states, then the cast);
* ``GptOssRotaryEmbedding.forward`` (:186-192) keeps the (S, d/2) frequencies as they are (no ``cat``), and
  ``_apply_rotary_emb`` (:207-216) ``chunk``s each head in halves: ``first·cos − second·sin``,
  ``second·cos + first·sin``, one ``cat``;
* the attention (:259-328): biases on q, k, v and o (``attention_bias``), one sink logit per head (``sinks``, a
  parameter registered after ``o_proj``); eager only (``_supports_sdpa = False``): the sinks expanded and
  concatenated to the logits as one more key, the row max subtracted (``max(dim=-1, keepdim=True)``: its
  indices saved), the softmax, the sink column sliced off (a view) (:227-256);
* ``GptOssMLP`` (:134-146): ``router`` (``F.linear`` with a bias, ``topk`` of the logits, a softmax over the k
  values in their dtype), then ``experts``; it returns the router's scores too, which the layer keeps until it
  returns (``hidden_states, _ = self.mlp(...)``, :366);
* ``GptOssExperts`` (:69-114) under ``grouped_mm_experts_forward`` with ``is_transposed`` (gate_up (E, d, 2f), down
  (E, f, d), no transpose view) and ``has_bias``: each projection's bias rows gathered by expert
  (``bias[expert_ids_g]``, (S, out)) and added in place to the ``grouped_mm`` output; the gate ``_apply_gate``:
  ``gate_up[..., ::2]`` and ``[..., 1::2]`` (strided views), ``gate.clamp(max=limit)``, ``up.clamp(-limit,
  limit)``, ``gate * sigmoid(gate * alpha)``, ``(up + 1) * glu``;
* ``GptOssModel.forward`` (:435-489) passes no ``position_ids`` to the mask functions: no packed-sequence check.

``_keep_in_fp32_modules`` (the norms, :390) keeps nothing fp32 in a bf16 build from a config (``from_config(...,
dtype=bfloat16)``): the norms' weights are bf16, as the measured model's.
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..aten_index import index, max_values, strided_slice, topk
from ..aten_pointwise import clamp, sigmoid
from ..aten_split import chunk
from ..engine import Affine
from ..tensors import Tensor, parameter
from . import llama, moe, olmo2
from .llama import B, GradientCheckpointingLayer, repeat_kv, windowed_masks


def rotary_embedding(x: Tensor, position_ids: Tensor, inv_freq: Tensor) -> tuple[Tensor, Tensor]:
    """``GptOssRotaryEmbedding.forward`` (:186-192): Llama's without the ``cat``."""
    freqs = A.mul(A.to(A.unsqueeze(position_ids, -1), "fp32"), inv_freq)
    emb = freqs
    cos = A.mul(A.unary(emb, "cos"), 1.0)  # * attention_scaling
    sin = A.mul(A.unary(emb, "sin"), 1.0)
    return A.to(cos, x.dtype), A.to(sin, x.dtype)


def apply_rotary_emb(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``_apply_rotary_emb`` (:207-216)."""
    first_half, second_half = chunk(x, 2, -1)
    first_ = A.sub(A.mul(first_half, cos), A.mul(second_half, sin))
    second_ = A.add(A.mul(second_half, cos), A.mul(first_half, sin))
    return A.cat((first_, second_), -1)


def eager_attention_forward(module: Attention, query, key, value, attention_mask) -> tuple[Tensor, Tensor]:
    """modeling_gpt_oss.py:227-256 (dropout 0: ``F.dropout`` returns its input)."""
    key_states = repeat_kv(key, module.groups)
    value_states = repeat_kv(value, module.groups)
    attn_weights = A.mul(A.matmul(query, A.transpose(key_states, 2, 3)), module.scaling)
    if attention_mask is not None:
        attn_weights = A.add(attn_weights, attention_mask)
    b, s = query.shape[0], query.shape[2]
    sinks = A.expand(A.reshape(module.sinks, 1, -1, 1, 1), b, -1, s, -1)
    combined_logits = A.cat((attn_weights, sinks), -1)
    combined_logits = A.sub(combined_logits, max_values(combined_logits, keepdim=True))
    probs = A.softmax(combined_logits, -1, combined_logits.dtype)
    scores = A.slice_(probs, -1, 0, probs.shape[-1] - 1)  # the sink dropped
    attn_weights = A.to(scores, value_states.dtype)
    attn_output = A.matmul(attn_weights, value_states)
    attn_output = A.contiguous(A.transpose(attn_output, 1, 2))
    return attn_output, attn_weights


class Attention(llama.Attention):
    """``GptOssAttention``: Llama's projections with biases, the sinks, gpt-oss's RoPE and eager attention."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str, norm=None):
        super().__init__(cfg, dtype, attn, name)
        self.sinks = parameter((cfg.num_heads,), dtype, name + ".sinks")

    def params(self) -> list[Tensor]:
        return super().params() + [self.sinks]

    def rotate(self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """``apply_rotary_pos_emb`` (:219-224)."""
        cos, sin = A.unsqueeze(cos, 1), A.unsqueeze(sin, 1)
        return apply_rotary_emb(q, cos, sin), apply_rotary_emb(k, cos, sin)

    def attend(self, query: Tensor, key: Tensor, value: Tensor, attention_mask) -> tuple[Tensor, Tensor]:
        return eager_attention_forward(self, query, key, value, attention_mask)


class TopKRouter:
    """``GptOssTopKRouter`` (:117-131): the weight (E, d) and bias (E,)."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.weight = parameter((cfg.num_experts, cfg.d_model), dtype, name + ".weight")
        self.bias = parameter((cfg.num_experts,), dtype, name + ".bias")
        self.top_k = cfg.experts_per_token

    def __call__(self, hidden_states: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        router_logits = A.linear(hidden_states, self.weight, self.bias)  # :127
        router_top_value, router_indices = topk(router_logits, self.top_k)  # :128
        router_scores = A.softmax(router_top_value, 1, router_top_value.dtype)  # :129
        return router_logits, router_scores, router_indices


class Experts(moe.Experts):
    """``GptOssExperts``: gate_up (E, d, 2f) and its bias (E, 2f), down (E, f, d) and its bias (E, d)."""

    is_transposed = True

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        e, d, f = cfg.num_experts, cfg.d_model, cfg.expert_width
        self.gate_up_proj = parameter((e, d, 2 * f), dtype, name + ".gate_up_proj")
        self.gate_up_proj_bias = parameter((e, 2 * f), dtype, name + ".gate_up_proj_bias")
        self.down_proj = parameter((e, f, d), dtype, name + ".down_proj")
        self.down_proj_bias = parameter((e, d), dtype, name + ".down_proj_bias")
        self.num_experts, self.intermediate_dim = e, f

    def params(self) -> list[Tensor]:
        return [self.gate_up_proj, self.gate_up_proj_bias, self.down_proj, self.down_proj_bias]

    def selected_bias(self, which: str, expert_ids_g: Tensor) -> Tensor:
        return index(getattr(self, which + "_bias"), expert_ids_g)

    def apply_gate(self, gate_up: Tensor) -> Tensor:
        """``GptOssExperts._apply_gate`` (:81-87)."""
        gate, up = strided_slice(gate_up, 0, 2), strided_slice(gate_up, 1, 2)
        gate = clamp(gate)  # max=limit
        up = clamp(up, both=True)  # min=-limit, max=limit
        glu = A.mul(gate, sigmoid(A.mul(gate, 1.702)))  # alpha
        return A.mul(A.add(up, 1), glu)


class MLP:
    """``GptOssMLP``: router, then experts; returns the router's scores too."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.router = TopKRouter(cfg, dtype, name + ".router")
        self.experts = Experts(cfg, dtype, name + ".experts")

    def params(self) -> list[Tensor]:
        return [self.router.weight, self.router.bias] + self.experts.params()

    def __call__(self, hidden_states: Tensor) -> tuple[Tensor, Tensor]:
        batch_size, sequence_length, hidden_dim = hidden_states.shape  # :141
        hidden_states = A.reshape(hidden_states, -1, hidden_dim)
        _, router_scores, router_indices = self.router(hidden_states)
        hidden_states = self.experts(hidden_states, router_indices, router_scores)
        hidden_states = A.reshape(hidden_states, batch_size, sequence_length, hidden_dim)
        return hidden_states, router_scores


class DecoderLayer(GradientCheckpointingLayer):
    """``GptOssDecoderLayer`` (:331-371)."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str):
        self.self_attn = Attention(cfg, dtype, attn, name + ".self_attn")
        self.mlp = MLP(cfg, dtype, name + ".mlp")
        self.input_layernorm = olmo2.RMSNorm(cfg.d_model, dtype, name + ".input_layernorm")
        self.post_attention_layernorm = olmo2.RMSNorm(cfg.d_model, dtype, name + ".post_attention_layernorm")

    def params(self) -> list[Tensor]:
        norms = [self.input_layernorm.weight, self.post_attention_layernorm.weight]
        return self.self_attn.params() + self.mlp.params() + norms

    def forward(self, hidden_states: Tensor, attention_mask=None, position_embeddings=None, position_ids=None):
        residual = hidden_states  # :350
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states, position_embeddings, attention_mask)
        hidden_states = A.add(residual, hidden_states)  # :362
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states, _ = self.mlp(hidden_states)  # :366: the router's scores kept until the return
        return A.add(residual, hidden_states)


class GptOssForCausalLM(llama.LlamaForCausalLM):
    """``GptOssForCausalLM`` with ``GptOssModel``: Llama's forward and loss, gpt-oss's layers, norm and masks."""

    masks_see_positions = False

    def __init__(self, cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B):
        super().__init__(cfg, seq, setup, batch, norm=olmo2.RMSNorm)

    def decoder_layer(self, name: str, norm) -> DecoderLayer:
        return DecoderLayer(self.cfg, self.dtype, self.setup.attention, name)

    def masks(self) -> dict[bool, Tensor | None]:
        return windowed_masks(self.batch, self.seq, self.dtype, self.setup.attention, self.cfg.sliding_window)

    def rotary(self, hidden_states: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        return rotary_embedding(hidden_states, position_ids, self.inv_freq)


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B) -> GptOssForCausalLM:
    """The program of ``ops.transformers.predict_step``."""
    return GptOssForCausalLM(cfg, seq, setup, batch)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = moe.unsupported(cfg, setup)
    if setup.attention != "naive":
        out.append("gpt-oss with sdpa (transformers' GptOssForCausalLM supports eager attention only here)")
    return out
