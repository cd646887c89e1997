"""transformers 5.24's ``Phi3ForCausalLM`` training step, transliterated (``models/phi3/modeling_phi3.py``).

The model, its norms, its rotary embedding, its masks and its loss are Llama's (``llama.py``).  What Phi-3
does differently:

* one fused ``qkv_proj``, sliced into q, k and v (:219-223): three ``SliceBackward0`` nodes, each of whose
  backward makes a zero-filled gradient of the whole projection (``slice_backward``), summed in its input buffer;
* ``apply_rotary_pos_emb`` for a partial rotary dim (:159-186): ``q[..., :rotary_dim]`` (the whole head: an
  alias) and the empty ``q[..., rotary_dim:]`` concatenated after the rotation (``cat``: one more copy of q and
  of k, and a whole-size ``slice_backward`` for the empty pass-through part);
* one fused ``gate_up_proj``, ``chunk``ed into gate and up (:58-64: one ``SplitBackward0``);
* residual dropout (``resid_pdrop``, 0.0 by default: the identity) and a sliding window when
  ``sliding_window`` is set (``create_sliding_window_causal_mask``, :386).
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..aten_split import chunk
from ..tensors import Tensor, no_grad
from .attention import eager_attention_forward, sdpa_attention_forward
from .llama import (
    B,
    Linear,
    LlamaForCausalLM,
    arange_plus,
    eager_mask,
    find_packed_sequence_indices,
    rotary_embedding,
    rotate_half,
    sdpa_mask,
)
from .llama import DecoderLayer as LlamaDecoderLayer
from .llama import unsupported as llama_unsupported


def apply_rotary_pos_emb(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """modeling_phi3.py:159-186 (``partial_rotary_factor`` 1: the rotary dim is the head)."""
    cos = A.unsqueeze(cos, 1)
    sin = A.unsqueeze(sin, 1)
    rotary_dim = cos.shape[-1]
    q_rot, q_pass = A.view(q, *q.shape), A.slice_(q, -1, rotary_dim, q.shape[-1])  # :181 (the first an alias)
    k_rot, k_pass = A.view(k, *k.shape), A.slice_(k, -1, rotary_dim, k.shape[-1])
    q_embed = A.cat((A.add(A.mul(q_rot, cos), A.mul(rotate_half(q_rot), sin)), q_pass), -1)  # :184
    k_embed = A.cat((A.add(A.mul(k_rot, cos), A.mul(rotate_half(k_rot), sin)), k_pass), -1)  # :185
    return q_embed, k_embed


class Attention:
    """``Phi3Attention`` (modeling_phi3.py:189-253); no q/k norms (``norm`` unused)."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str, norm=None):
        d, h, kv, hd = cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.d_head
        self.head_dim, self.heads, self.kv, self.groups, self.scaling, self.attn = hd, h, kv, h // kv, hd**-0.5, attn
        self.o_proj = Linear(h * hd, d, False, dtype, name + ".o_proj")
        self.qkv_proj = Linear(d, h * hd + 2 * kv * hd, False, dtype, name + ".qkv_proj")

    def params(self) -> list[Tensor]:
        return self.o_proj.params() + self.qkv_proj.params()

    def __call__(self, hidden_states: Tensor, position_embeddings, attention_mask) -> tuple[Tensor, Tensor | None]:
        input_shape = hidden_states.shape[:-1]  # :216
        hidden_shape = (*input_shape, -1, self.head_dim)
        qkv = self.qkv_proj(hidden_states)  # :219
        query_pos = self.heads * self.head_dim  # :220
        kv_size = self.kv * self.head_dim
        query_states = A.slice_(qkv, -1, 0, query_pos)  # :221
        key_states = A.slice_(qkv, -1, query_pos, query_pos + kv_size)  # :222
        value_states = A.slice_(qkv, -1, query_pos + kv_size, query_pos + 2 * kv_size)  # :223
        query_states = A.transpose(A.view(query_states, *hidden_shape), 1, 2)  # :225
        key_states = A.transpose(A.view(key_states, *hidden_shape), 1, 2)  # :226
        value_states = A.transpose(A.view(value_states, *hidden_shape), 1, 2)  # :227
        cos, sin = position_embeddings  # :229
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)  # :230
        interface = eager_attention_forward if self.attn == "naive" else sdpa_attention_forward
        attn_output, attn_weights = interface(self, query_states, key_states, value_states, attention_mask)
        attn_output = A.contiguous(A.reshape(attn_output, *input_shape, -1))  # :251
        attn_output = self.o_proj(attn_output)  # :252
        return attn_output, attn_weights  # the locals die here


class MLP:
    """``Phi3MLP`` (modeling_phi3.py:49-64)."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.gate_up_proj = Linear(cfg.d_model, 2 * cfg.d_ff, False, dtype, name + ".gate_up_proj")
        self.down_proj = Linear(cfg.d_ff, cfg.d_model, False, dtype, name + ".down_proj")

    def params(self) -> list[Tensor]:
        return self.gate_up_proj.params() + self.down_proj.params()

    def __call__(self, hidden_states: Tensor) -> Tensor:
        up_states = self.gate_up_proj(hidden_states)  # :59
        gate, up_states = chunk(up_states, 2, -1)  # :61
        up_states = A.mul(up_states, A.silu(gate))  # :62
        return self.down_proj(up_states)  # :64


class DecoderLayer(LlamaDecoderLayer):
    """``Phi3DecoderLayer`` (modeling_phi3.py:277-318): Llama's layer (its residual dropouts have p = 0) with
    Phi-3's fused attention and MLP."""

    attention_class = Attention
    mlp_class = MLP


class Phi3ForCausalLM(LlamaForCausalLM):
    """``Phi3ForCausalLM``: Llama's model with Phi-3's layers."""

    def decoder_layer(self, name: str, norm) -> DecoderLayer:
        return DecoderLayer(self.cfg, self.dtype, self.setup.attention, name)

    def model(self) -> Tensor:
        """``Phi3Model.forward`` (modeling_phi3.py:362-413)."""
        inputs_embeds = A.embedding(self.embed_tokens, self.input_ids)
        position_ids = A.unsqueeze(arange_plus(self.seq), 0)
        with no_grad():
            find_packed_sequence_indices(A.expand(position_ids, self.batch, -1))
        window = self.cfg.sliding_window  # :386: create_sliding_window_causal_mask when set
        if self.setup.attention == "naive":
            causal = eager_mask(self.batch, self.seq, self.dtype, window)
        else:
            causal = sdpa_mask(self.batch, self.seq, window, allow_is_causal_skip=True)
        hidden_states = inputs_embeds
        del inputs_embeds
        position_embeddings = rotary_embedding(hidden_states, position_ids, self.inv_freq)
        kwargs = dict(attention_mask=causal, position_embeddings=position_embeddings, position_ids=position_ids)
        hidden_states = self.run_layers(hidden_states, lambda i: kwargs)
        return self.norm(hidden_states)


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch=B, device: str = "meta") -> Phi3ForCausalLM:
    """The program of ``ops.transformers.predict_step`` (the same on a meta and a cpu target)."""
    return Phi3ForCausalLM(cfg, seq, setup, batch)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = [r for r in llama_unsupported(cfg, setup) if "sliding" not in r]
    if cfg.qkv_bias or cfg.output_bias or cfg.mlp_bias or cfg.qk_norm:
        out.append("a phi3 model with biases or q/k norms (Phi-3's projections have neither)")
    return out
