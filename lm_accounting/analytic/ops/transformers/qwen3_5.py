"""transformers 5.24's ``Qwen3_5ForCausalLM`` and ``Qwen3_5MoeForCausalLM`` training steps, transliterated
(``models/qwen3_5/modeling_qwen3_5.py`` and ``models/qwen3_5_moe/modeling_qwen3_5_moe.py``, line numbers of the
first).

Qwen3-Next's program (``qwen3_next.py``): the same gated attention, (1 + w) RMSNorms, causal conv1d, chunked gated
delta rule (``torch_chunk_gated_delta_rule`` is the same function) and gated RMSNorm; Qwen3.5-MoE's sparse block is
Qwen3-Next's (its router always normalises the top-k weights), in every layer; Qwen3.5's MLP a dense SwiGLU in every
layer.  What Qwen3.5 does differently:

* ``Qwen3_5GatedDeltaNet`` (:500-656) projects with four unfused ``nn.Linear`` (``in_proj_qkv``, ``in_proj_z``,
  ``in_proj_b``, ``in_proj_a``, registered after ``conv1d``, ``norm`` and ``out_proj``): no reordering, the conv's
  input the transposed ``in_proj_qkv`` output itself;
* ``Qwen3_5TextModel`` (:1203-1290) builds position ids (4, B, S) (``view(1, 1, -1).expand(4, B, -1)``), the first
  row the text positions (the mask's), the other three the rotary table's: ``Qwen3_5TextRotaryEmbedding`` (:136-201)
  computes (3, B, S, r/2) frequencies, their cos and sin, and recomposes each (``recomposition_frequencies``: the
  multimodal rows copied into strided slices of the first, then ``cat`` of it with itself), sin before cos.
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..aten_index import split_with_sizes
from ..aten_pointwise import sigmoid
from ..engine import Affine
from ..tensors import Tensor, empty, parameter
from . import moe, qwen3_next
from .llama import B, Linear
from .qwen3_next import GatedDeltaNet, RMSNormGated


class GatedDeltaNet35(GatedDeltaNet):
    """``Qwen3_5GatedDeltaNet`` in training: no cache, no padding mask."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.num_v_heads, self.num_k_heads = cfg.linear_value_heads, cfg.linear_key_heads
        self.head_k_dim, self.head_v_dim = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.key_dim, self.value_dim = cfg.linear_key_dim, self.head_v_dim * self.num_v_heads
        self.conv_dim = self.key_dim * 2 + self.value_dim
        d, h = cfg.d_model, self.num_v_heads
        self.dt_bias = parameter((h,), dtype, name + ".dt_bias")
        self.A_log = parameter((h,), dtype, name + ".A_log")
        self.conv1d_weight = parameter((self.conv_dim, 1, cfg.linear_conv_kernel), dtype, name + ".conv1d.weight")
        self.norm = RMSNormGated(self.head_v_dim, dtype, name + ".norm")
        self.out_proj = Linear(self.value_dim, d, False, dtype, name + ".out_proj")
        self.in_proj_qkv = Linear(d, self.conv_dim, False, dtype, name + ".in_proj_qkv")
        self.in_proj_z = Linear(d, self.value_dim, False, dtype, name + ".in_proj_z")
        self.in_proj_b = Linear(d, h, False, dtype, name + ".in_proj_b")
        self.in_proj_a = Linear(d, h, False, dtype, name + ".in_proj_a")

    def params(self) -> list[Tensor]:
        own = [self.dt_bias, self.A_log, self.conv1d_weight, self.norm.weight] + self.out_proj.params()
        projections = (self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a)
        return own + [w for p in projections for w in p.params()]

    def __call__(self, hidden_states: Tensor) -> Tensor:
        """:571-656; its locals live until it returns, as in Python."""
        batch_size, seq_len, _ = hidden_states.shape  # :583
        mixed_qkv = self.in_proj_qkv(hidden_states)  # :591-598
        mixed_qkv = A.transpose(mixed_qkv, 1, 2)
        z = self.in_proj_z(hidden_states)
        z = A.reshape(z, batch_size, seq_len, -1, self.head_v_dim)
        b = self.in_proj_b(hidden_states)
        a = self.in_proj_a(hidden_states)
        mixed_qkv = self.causal_conv1d_fn(mixed_qkv)  # :611-617
        mixed_qkv = A.transpose(mixed_qkv, 1, 2)  # :623
        query, key, value = split_with_sizes(mixed_qkv, [self.key_dim, self.key_dim, self.value_dim], -1)
        query = A.reshape(query, batch_size, seq_len, -1, self.head_k_dim)  # :634-636
        key = A.reshape(key, batch_size, seq_len, -1, self.head_k_dim)
        value = A.reshape(value, batch_size, seq_len, -1, self.head_v_dim)
        beta = sigmoid(b)  # :638
        g = qwen3_next.decay(self.A_log, a, self.dt_bias)  # :640
        core_attn_out = qwen3_next.chunk_gated_delta_rule(query, key, value, g, beta, seq_len)  # :655-667
        core_attn_out = A.reshape(core_attn_out, -1, self.head_v_dim)  # :676-680
        z = A.reshape(z, -1, self.head_v_dim)
        core_attn_out = self.norm(core_attn_out, z)
        core_attn_out = A.reshape(core_attn_out, batch_size, seq_len, -1)
        output = self.out_proj(core_attn_out)
        return output


class DecoderLayer(qwen3_next.DecoderLayer):
    """``Qwen3_5DecoderLayer`` / ``Qwen3_5MoeDecoderLayer``: Qwen3-Next's layer with Qwen3.5's Gated DeltaNet."""

    mixer_class = GatedDeltaNet35


class Qwen3_5ForCausalLM(qwen3_next.Qwen3NextForCausalLM):
    """``Qwen3_5ForCausalLM`` / ``Qwen3_5MoeForCausalLM`` with their text models, without ``output_router_logits``."""

    layer_class = DecoderLayer

    def rotary(self, hidden_states: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        """``Qwen3_5TextRotaryEmbedding.forward`` (:177-201) of the three rows (3, B, S) of expanded positions: no
        tensor of it requires grad."""
        b, s = self.batch, self.seq
        freqs = A.mul(empty((3, b, s, 1), "fp32", "_to_copy"), self.inv_freq)  # :180 (the cast of an expand)
        cos = A.mul(A.unary(freqs, "cos"), 1.0)  # :181-182 (* attention_scaling)
        sin = A.mul(A.unary(freqs, "sin"), 1.0)
        sin = recomposition_frequencies(sin)  # :184-185
        cos = recomposition_frequencies(cos)
        return A.to(cos, hidden_states.dtype), A.to(sin, hidden_states.dtype)


def recomposition_frequencies(freq: Tensor) -> Tensor:
    """:188-197: the H and W rows copied into strided slices of the first (no bytes), then ``cat`` with itself."""
    freqs_thw = A.select(freq, 0, 0)
    return A.cat((freqs_thw, freqs_thw), -1)


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B) -> Qwen3_5ForCausalLM:
    """The program of ``ops.transformers.predict_step``."""
    return Qwen3_5ForCausalLM(cfg, seq, setup, batch)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = moe.unsupported(cfg, setup)
    if cfg.sliding_window is not None:
        out.append("a qwen3_5 model with a window")
    return out
