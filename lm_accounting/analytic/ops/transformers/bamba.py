"""transformers 5.24's ``BambaForCausalLM`` training step, transliterated (``models/bamba/modeling_bamba.py``, line
numbers of transformers 5.24).

Llama's model skeleton (``llama.LlamaForCausalLM``: the embedding, ``create_causal_mask`` with its packed-sequence
check, the rotary table, a final RMSNorm, an untied head, ``ForCausalLMLoss``) around Bamba's decoder layer
(``BambaDecoderLayer``, :842-902): ``input_layernorm``, the mixer, the residual, ``pre_ff_layernorm``, the SwiGLU
``feed_forward`` (``BambaMLP`` = ``llama.MLP``), the residual; the mixer is

* on the layers of ``attn_layer_indices``: ``BambaAttention`` (:182-247), Llama's projections (``attention_bias``
  on all four) with RoPE on the first ``rotary_dim`` of each head, sliced, rotated and concatenated back
  (StableLM's ``stablelm.Attention``; ``partial_rotary_factor`` 0.5, hard-coded by ``BambaConfig``);
* elsewhere ``BambaMixer`` (:584-802), whose forward and ``mamba2_chunk_scan`` are Nemotron-H's line for line
  (``mamba2.Mamba2Mixer``).

What else Bamba does differently: ``position_ids`` is ``arange(S)`` with no offset added (:976); the layer returns
(hidden states, attention weights) and the model keeps the weights (``attn_weights``) until the next layer returns
(:989-998): eager attention's probabilities live through the next layer, so a layer after an attention layer is
replayed on its own.  amp-bf16 as Nemotron-H's (``nemotron_h``).  Not modelled: a ``z_loss_coefficient`` above 0 (the
config reader ignores the field; the program has no z-loss).
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..engine import Affine
from ..tensors import Tensor, empty, no_grad, repeated, split_runs
from . import llama, mamba2, stablelm
from .glm import rotary_parts
from .llama import B


class Attention(stablelm.Attention):
    """``BambaAttention`` (:182-247): StableLM's partial RoPE, the end of Nemotron-H's forward (the attention's
    output dies at ``o_proj``, then q, k and v at the return)."""

    def rotate(self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """``apply_rotary_pos_emb`` (:144-179): q's rotated share concatenated back before k's."""
        cos, sin = A.unsqueeze(cos, 1), A.unsqueeze(sin, 1)
        rotary_dim = cos.shape[-1]
        q_rot, q_pass = rotary_parts(q, rotary_dim)
        k_rot, k_pass = rotary_parts(k, rotary_dim)
        q_embed = A.add(A.mul(q_rot, cos), A.mul(llama.rotate_half(q_rot), sin))
        k_embed = A.add(A.mul(k_rot, cos), A.mul(llama.rotate_half(k_rot), sin))
        q_embed = A.cat((q_embed, q_pass), -1)
        k_embed = A.cat((k_embed, k_pass), -1)
        return q_embed, k_embed

    def __call__(self, hidden_states: Tensor, position_embeddings, attention_mask) -> tuple[Tensor, Tensor | None]:
        input_shape = hidden_states.shape[:-1]  # :217
        hidden_shape = (*input_shape, -1, self.head_dim)
        query_states = A.transpose(A.view(self.q_proj(hidden_states), *hidden_shape), 1, 2)  # :220-222
        key_states = A.transpose(A.view(self.k_proj(hidden_states), *hidden_shape), 1, 2)
        value_states = A.transpose(A.view(self.v_proj(hidden_states), *hidden_shape), 1, 2)
        cos, sin = position_embeddings  # :224
        query_states, key_states = self.rotate(query_states, key_states, cos, sin)
        attn_output, attn_weights = self.attend(query_states, key_states, value_states, attention_mask)  # :233
        attn_output = A.contiguous(A.reshape(attn_output, *input_shape, -1))  # :244
        attn_output = self.o_proj(attn_output)
        return attn_output, attn_weights


class DecoderLayer(llama.GradientCheckpointingLayer):
    """``BambaDecoderLayer`` (:842-902): returns (hidden states, the attention weights or None)."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str, norm, kind: str):
        self.kind = kind
        self.feed_forward = llama.MLP(cfg, dtype, name + ".feed_forward")
        self.input_layernorm = norm(cfg.d_model, dtype, name + ".input_layernorm")
        self.pre_ff_layernorm = norm(cfg.d_model, dtype, name + ".pre_ff_layernorm")
        if kind == "M":
            self.mixer = mamba2.Mamba2Mixer(cfg, dtype, name + ".mamba")
        else:
            self.mixer = Attention(cfg, dtype, attn, name + ".self_attn")

    def params(self) -> list[Tensor]:
        norms = [self.input_layernorm.weight, self.pre_ff_layernorm.weight]
        return self.feed_forward.params() + norms + self.mixer.params()

    def forward(
        self, hidden_states: Tensor, attention_mask=None, position_ids=None, position_embeddings=None
    ) -> tuple[Tensor, Tensor | None]:
        residual = hidden_states  # :874
        hidden_states = self.input_layernorm(hidden_states)
        if self.kind == "M":
            hidden_states = self.mixer(hidden_states)  # :879-885
            self_attn_weights = None
        else:
            hidden_states, self_attn_weights = self.mixer(hidden_states, position_embeddings, attention_mask)
        hidden_states = A.add(residual, hidden_states)  # :897
        residual = hidden_states
        hidden_states = self.pre_ff_layernorm(hidden_states)
        hidden_states = self.feed_forward(hidden_states)
        hidden_states = A.add(residual, hidden_states)  # :902
        return hidden_states, self_attn_weights


class BambaForCausalLM(llama.LlamaForCausalLM):
    """``BambaForCausalLM`` with ``BambaModel`` (:928-1087), labels given, ``z_loss_coefficient`` 0."""

    def decoder_layer(self, name: str, norm) -> DecoderLayer:
        i = int(name.rsplit(".", 1)[1])
        return DecoderLayer(self.cfg, self.dtype, self.setup.attention, name, norm, self.cfg.layer_kind(i))

    def rotary_pairs(self) -> int:
        return self.cfg.rope_dim // 2

    def runs(self) -> list[tuple[int, int]]:
        """(first layer, count): the first and the last layer alone, the middle ones in runs of one kind, a layer
        after an attention layer alone (the previous weights live through it), each run replayed once."""
        n, kind = self.cfg.num_layers, self.cfg.layer_kind
        key = lambda i: (kind(i), kind(i - 1) == "*")
        out, i = [(0, 1)], 1
        while i < n - 1:
            j = i + 1
            while j < n - 1 and key(j) == key(i) and not key(j)[1]:
                j += 1
            out.append((i, j - i))
            i = j
        return split_runs(out + ([(n - 1, 1)] if n > 1 else []))  # FSDP2's units cut runs of one kind

    def model(self) -> Tensor:
        """``BambaModel.forward`` (:952-1008)."""
        inputs_embeds = A.embedding(self.embed_tokens, self.input_ids)  # :968
        hidden_states = inputs_embeds
        position_ids = A.unsqueeze(empty((self.seq,), "int64", "arange"), 0)  # :976
        with no_grad():  # create_causal_mask's packed-sequence check
            llama.find_packed_sequence_indices(A.expand(position_ids, self.batch, -1))
        mask = self.masks()[False]  # :980-992
        position_embeddings = self.rotary(hidden_states, position_ids)  # :993
        attn_weights = None
        for first, times in self.runs():  # :995-1004
            with repeated(times):
                layer = self.layers[first]
                # a checkpointed layer's kwargs (mask, position_ids, cos and sin) live until its recomputation
                kwargs = dict(
                    attention_mask=mask if layer.kind == "*" else None,
                    position_ids=position_ids,
                    position_embeddings=position_embeddings,
                )
                hidden_states, attn_weights = layer(hidden_states, **kwargs)
                del kwargs
        hidden_states = self.norm(hidden_states)  # :1006
        del mask, position_ids, position_embeddings, attn_weights
        return hidden_states


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B) -> BambaForCausalLM:
    """The program of ``ops.transformers.predict_step``."""
    return BambaForCausalLM(cfg, seq, setup, batch)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = mamba2.unproven_sizes(cfg) if cfg.mamba_layers else []
    if setup.checkpoint == "selective":
        out.append("transformers has no selective activation checkpointing")
    if cfg.moe or cfg.mlp != "swiglu" or not cfg.mixer_ffn or set(cfg.layer_pattern or "") - set("M*"):
        out.append("a bamba model other than Mamba2 or attention mixers each with a SwiGLU")
    return out
