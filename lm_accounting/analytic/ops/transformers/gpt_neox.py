"""transformers 5.24's ``GPTNeoXForCausalLM`` training step, transliterated (``models/gpt_neox/modeling_gpt_neox.py``).

The masks, the rotary tables (``cat``ed frequencies), the attention interfaces and the loss are Llama's
(``llama.py``), the LayerNorm GPT-2's (``gpt2.py``: ``native_layer_norm`` with a bias).  What GPT-NeoX (Pythia)
does differently:

* one fused ``query_key_value`` (:194-196): viewed as (B, S, h, 3·head_size), transposed, ``chunk``ed into q, k
  and v along the last dim (one ``SplitBackward0``: its backward ``cat``s the three gradients);
* ``apply_rotary_pos_emb`` on the first ``rotary_ndims`` of each head (:105-130): ``q[..., :rotary_dim]`` (the
  whole head when it is all rotated: an alias) and ``q[..., rotary_dim:]`` concatenated after the rotation;
* the MLP (:38-48): ``dense_h_to_4h``, GELU (``hidden_act``: ``gelu``, ``F.gelu``, or ``gelu_pytorch_tanh``, the
  same bytes; another GELU's ops are not transliterated), ``dense_4h_to_h``, each ``nn.Linear`` with a bias;
* the layer (:228-270): ``use_parallel_residual`` runs ``mlp(post_attention_layernorm(x)) + attn(input_layernorm(x))
  + x``, else ``attn + x`` then ``mlp(post_attention_layernorm(·)) + ·``; its dropouts (``hidden_dropout`` 0.0
  by default) return their input;
* the head ``lm_head`` (untied by default) on the final LayerNorm's output.
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..aten_activation import gelu
from ..aten_split import chunk
from ..engine import Affine
from ..tensors import Tensor
from .attention import eager_attention_forward, sdpa_attention_forward
from .gpt2 import LayerNorm
from .layernorm_lm import LayerNormCausalLM
from .llama import (
    B,
    GradientCheckpointingLayer,
    Linear,
    rotary_embedding,
    rotate_half,
)


def apply_rotary_pos_emb(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """modeling_gpt_neox.py:105-130: RoPE on the first ``cos.shape[-1]`` of each head, the rest concatenated."""
    cos = A.unsqueeze(cos, 1)
    sin = A.unsqueeze(sin, 1)
    rotary_dim = cos.shape[-1]

    def part(t: Tensor) -> tuple[Tensor, Tensor]:  # t[..., :rotary_dim] is t itself when it spans the head
        whole = rotary_dim == t.shape[-1]
        rot = A.view(t, *t.shape) if whole else A.slice_(t, -1, 0, rotary_dim)
        return rot, A.slice_(t, -1, rotary_dim, t.shape[-1])

    q_rot, q_pass = part(q)  # :121
    k_rot, k_pass = part(k)  # :122
    q_embed = A.add(A.mul(q_rot, cos), A.mul(rotate_half(q_rot), sin))  # :125
    k_embed = A.add(A.mul(k_rot, cos), A.mul(rotate_half(k_rot), sin))  # :126
    return A.cat((q_embed, q_pass), -1), A.cat((k_embed, k_pass), -1)  # :129-130


class Attention:
    """``GPTNeoXAttention`` (modeling_gpt_neox.py:167-222)."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str):
        d = cfg.d_model
        self.head_size, self.groups, self.scaling, self.attn = cfg.d_head, 1, cfg.d_head**-0.5, attn
        self.query_key_value = Linear(d, 3 * d, cfg.qkv_bias, dtype, name + ".query_key_value")
        self.dense = Linear(d, d, cfg.output_bias, dtype, name + ".dense")

    def params(self) -> list[Tensor]:
        return self.query_key_value.params() + self.dense.params()

    def __call__(self, hidden_states: Tensor, position_embeddings, attention_mask) -> tuple[Tensor, Tensor | None]:
        input_shape = hidden_states.shape[:-1]  # :192
        hidden_shape = (*input_shape, -1, 3 * self.head_size)  # :193
        qkv = A.transpose(A.view(self.query_key_value(hidden_states), *hidden_shape), 1, 2)  # :195
        query_states, key_states, value_states = chunk(qkv, 3, -1)  # :196
        del qkv
        cos, sin = position_embeddings  # :198
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)  # :199
        del cos, sin
        interface = eager_attention_forward if self.attn == "naive" else sdpa_attention_forward
        attn_output, attn_weights = interface(self, query_states, key_states, value_states, attention_mask)  # :210
        attn_output = A.contiguous(A.reshape(attn_output, *input_shape, -1))  # :221
        return self.dense(attn_output), attn_weights  # :222-224


class MLP:
    """``GPTNeoXMLP`` (modeling_gpt_neox.py:38-48)."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.dense_h_to_4h = Linear(cfg.d_model, cfg.d_ff, True, dtype, name + ".dense_h_to_4h")
        self.dense_4h_to_h = Linear(cfg.d_ff, cfg.d_model, True, dtype, name + ".dense_4h_to_h")

    def params(self) -> list[Tensor]:
        return self.dense_h_to_4h.params() + self.dense_4h_to_h.params()

    def __call__(self, hidden_states: Tensor) -> Tensor:
        return self.dense_4h_to_h(gelu(self.dense_h_to_4h(hidden_states)))  # :46-48


class Layer(GradientCheckpointingLayer):
    """``GPTNeoXLayer`` (modeling_gpt_neox.py:228-270)."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, device: str, name: str):
        self.parallel = cfg.parallel_block == "two_norms"
        self.input_layernorm = LayerNorm(cfg.d_model, dtype, device, name + ".input_layernorm")
        self.post_attention_layernorm = LayerNorm(cfg.d_model, dtype, device, name + ".post_attention_layernorm")
        self.attention = Attention(cfg, dtype, attn, name + ".attention")
        self.mlp = MLP(cfg, dtype, name + ".mlp")

    def params(self) -> list[Tensor]:
        norms = self.input_layernorm.params() + self.post_attention_layernorm.params()
        return norms + self.attention.params() + self.mlp.params()

    def forward(
        self, hidden_states: Tensor, attention_mask=None, position_embeddings=None, position_ids=None
    ) -> Tensor:
        # :248-256; ``_`` keeps eager's probabilities until the layer returns
        attn_output, _ = self.attention(self.input_layernorm(hidden_states), position_embeddings, attention_mask)
        if self.parallel:  # :260-263
            mlp_output = self.mlp(self.post_attention_layernorm(hidden_states))
            return A.add(A.add(mlp_output, attn_output), hidden_states)
        attn_output = A.add(attn_output, hidden_states)  # :265
        mlp_output = self.mlp(self.post_attention_layernorm(attn_output))  # :266
        return A.add(mlp_output, attn_output)  # :268


class GPTNeoXForCausalLM(LayerNormCausalLM):
    """``GPTNeoXForCausalLM`` with ``GPTNeoXModel`` (modeling_gpt_neox.py:291-455), labels given: the shared skeleton
    (``layernorm_lm``; :310-360, :430-455) with GPT-NeoX's layers, ``embed_in``, ``final_layer_norm`` and its rotary
    embedding (:345)."""

    layer_class = Layer
    names = ("embed_in", "layers", "final_layer_norm")

    def rotary(self, hidden_states: Tensor, position_ids: Tensor):
        return rotary_embedding(hidden_states, position_ids, self.inv_freq)


def causal_lm(
    cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B, device: str = "meta"
) -> GPTNeoXForCausalLM:
    """The program of ``ops.transformers.predict_step`` on target ``device`` ("meta" or "cpu"; LayerNorm's
    statistics differ)."""
    return GPTNeoXForCausalLM(cfg, seq, setup, batch, device)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = []
    if setup.checkpoint == "selective":
        out.append("transformers has no selective activation checkpointing")
    if cfg.norm != "layernorm" or cfg.mlp != "gelu" or not cfg.mlp_bias or cfg.parallel_block == "one_norm":
        out.append("a gpt_neox model with another norm, MLP or block")
    if cfg.kv_heads != cfg.num_heads or cfg.d_head * cfg.num_heads != cfg.d_model or cfg.moe or cfg.qk_norm:
        out.append("a gpt_neox model with grouped-query attention, another head size, experts or q/k norms")
    if (cfg.hf_activation or "gelu") not in F_GELU:
        out.append(
            f"hidden_act {cfg.hf_activation} (its ops are not transliterated; F.gelu's are: {', '.join(F_GELU)})"
        )
    return out


F_GELU = ("gelu", "gelu_pytorch_tanh")
"""The ``hidden_act`` values whose module is one ``F.gelu`` (``GELUActivation``, ``GELUTanh``)."""
