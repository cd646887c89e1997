"""transformers 5.24's ``GraniteMoeHybridForCausalLM`` (Granite-4.0-H) training step, transliterated
(``models/granitemoehybrid/modeling_granitemoehybrid.py``, line numbers of transformers 5.24).

Granite's program (``granite.py``: the embeddings times ``embedding_multiplier``, ``residual + h *
residual_multiplier`` twice per layer, the logits divided by ``logits_scaling``, ``attention_multiplier`` a scalar)
with the hybrid's layer (``GraniteMoeHybridDecoderLayer``, :943-1010): ``input_layernorm``, the mixer,
``post_attention_layernorm``, then ``shared_mlp`` (a fused SwiGLU of ``shared_intermediate_size``,
``GraniteMoeHybridMLP``, :747-770), plus GraniteMoe's ``block_sparse_moe`` (router, then grouped_mm experts:
``granitemoe.MoE``) summed with it when ``num_local_experts`` > 0.  The mixer is

* on the "mamba" layers ``GraniteMoeHybridMambaLayer`` (:505-723): Nemotron-H's Mamba2 mixer line for line
  (``mamba2.Mamba2Mixer``);
* elsewhere ``GraniteMoeHybridAttention`` (:123-192): Llama's projections (``attention_bias`` on all four), full
  RoPE when ``position_embedding_type`` is "rope", none otherwise (the model then builds no rotary table), the end
  of Nemotron-H's forward (the output dies at ``o_proj``, then q, k and v).

The model (:1046-1128): the lookup times ``embedding_multiplier``, ``position_ids`` = ``arange(S) + 0``,
``create_causal_mask`` without ``position_ids`` (no packed-sequence check), the layers called with the mask and the
rotary table only.  amp-bf16 as Nemotron-H's (``nemotron_h``).  Not modelled: ``output_router_logits`` (the
auxiliary loss: the config reader ignores the flag; the program has none).
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..aten_index import split_with_sizes
from ..engine import Affine
from ..tensors import Tensor, repeated, split_runs
from . import granite, granitemoe, llama, mamba2, nemotron_h
from .llama import B, Linear


class Attention(nemotron_h.Attention):
    """``GraniteMoeHybridAttention``: Nemotron-H's forward with Llama's RoPE where the model has a table."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str):
        super().__init__(cfg, dtype, attn, name)
        self.use_rope = cfg.positions == "rope"

    def __call__(self, hidden_states: Tensor, position_embeddings, attention_mask) -> tuple[Tensor, Tensor | None]:
        input_shape = hidden_states.shape[:-1]  # :160
        hidden_shape = (*input_shape, -1, self.head_dim)
        query_states = A.transpose(A.view(self.q_proj(hidden_states), *hidden_shape), 1, 2)  # :163-165
        key_states = A.transpose(A.view(self.k_proj(hidden_states), *hidden_shape), 1, 2)
        value_states = A.transpose(A.view(self.v_proj(hidden_states), *hidden_shape), 1, 2)
        if position_embeddings is not None:  # :167-169
            cos, sin = position_embeddings
            query_states, key_states = llama.apply_rotary_pos_emb(query_states, key_states, cos, sin)
        attn_output, attn_weights = self.attend(query_states, key_states, value_states, attention_mask)  # :177
        attn_output = A.contiguous(A.reshape(attn_output, *input_shape, -1))  # :187
        attn_output = self.o_proj(attn_output)
        return attn_output, attn_weights


class SharedMLP:
    """``GraniteMoeHybridMLP`` (:747-770): ``input_linear`` to 2·F, ``chunk``, SiLU(first) · second,
    ``output_linear``."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.width = cfg.shared_width if cfg.moe else cfg.d_ff
        self.input_linear = Linear(cfg.d_model, 2 * self.width, False, dtype, name + ".input_linear")
        self.output_linear = Linear(self.width, cfg.d_model, False, dtype, name + ".output_linear")

    def params(self) -> list[Tensor]:
        return self.input_linear.params() + self.output_linear.params()

    def __call__(self, hidden_states: Tensor) -> Tensor:
        hidden_states = self.input_linear(hidden_states)  # :766
        chunked_hidden_states = split_with_sizes(hidden_states, [self.width] * 2, -1)
        hidden_states = A.mul(A.silu(chunked_hidden_states[0]), chunked_hidden_states[1])
        return self.output_linear(hidden_states)  # :769


class DecoderLayer(llama.GradientCheckpointingLayer):
    """``GraniteMoeHybridDecoderLayer`` (:943-1010)."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str, norm, kind: str):
        self.kind = kind
        self.input_layernorm = norm(cfg.d_model, dtype, name + ".input_layernorm")
        self.post_attention_layernorm = norm(cfg.d_model, dtype, name + ".post_attention_layernorm")
        self.block_sparse_moe = granitemoe.MoE(cfg, dtype, name + ".block_sparse_moe") if cfg.moe else None
        self.shared_mlp = SharedMLP(cfg, dtype, name + ".shared_mlp")
        if kind == "M":
            self.mixer = mamba2.Mamba2Mixer(cfg, dtype, name + ".mamba")
        else:
            self.mixer = Attention(cfg, dtype, attn, name + ".self_attn")

    def params(self) -> list[Tensor]:
        """Registered in this order: the norms, ``block_sparse_moe``, ``shared_mlp``, then the mixer (``self_attn``
        and ``mamba`` are set to None first, modules only once built)."""
        out = [self.input_layernorm.weight, self.post_attention_layernorm.weight]
        out += self.block_sparse_moe.params() if self.block_sparse_moe is not None else []
        return out + self.shared_mlp.params() + self.mixer.params()

    def forward(self, hidden_states: Tensor, attention_mask=None, position_embeddings=None) -> Tensor:
        residual = hidden_states  # :979
        hidden_states = self.input_layernorm(hidden_states)
        if self.kind == "M":
            hidden_states = self.mixer(hidden_states)  # :983-988
        else:
            hidden_states, _ = self.mixer(hidden_states, position_embeddings, attention_mask)  # :990-997
        hidden_states = A.add(residual, A.mul(hidden_states, granite.SCALE))  # :999
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        if self.block_sparse_moe is not None:
            moe_hidden_states = self.block_sparse_moe(hidden_states)  # :1004
            hidden_states = A.add(moe_hidden_states, self.shared_mlp(hidden_states))
        else:
            hidden_states = self.shared_mlp(hidden_states)  # :1007
        return A.add(residual, A.mul(hidden_states, granite.SCALE))  # :1009


class GraniteMoeHybridForCausalLM(llama.LlamaForCausalLM):
    """``GraniteMoeHybridForCausalLM`` with ``GraniteMoeHybridModel`` (:1046-1300), without
    ``output_router_logits``."""

    def __init__(self, cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B):
        super().__init__(cfg, seq, setup, batch)
        if cfg.positions != "rope":  # ``rotary_emb`` is None (:1059): no buffers
            self.inv_freq = self.original_inv_freq = None

    def decoder_layer(self, name: str, norm) -> DecoderLayer:
        i = int(name.rsplit(".", 1)[1])
        return DecoderLayer(self.cfg, self.dtype, self.setup.attention, name, norm, self.cfg.layer_kind(i))

    def runs(self) -> list[tuple[int, int]]:
        return split_runs(mamba2.layer_runs(self.cfg))  # FSDP2's units cut runs of one letter

    def model(self) -> Tensor:
        """``GraniteMoeHybridModel.forward`` (:1068-1128)."""
        inputs_embeds = A.mul(A.embedding(self.embed_tokens, self.input_ids), granite.SCALE)  # :1083-1085
        position_ids = A.unsqueeze(llama.arange_plus(self.seq), 0)  # :1090-1092
        mask = self.masks()[False]  # :1094-1106, without position_ids
        hidden_states = inputs_embeds
        position_embeddings = None
        if self.cfg.positions == "rope":
            position_embeddings = self.rotary(hidden_states, position_ids)  # :1111
        for first, times in self.runs():  # :1113-1121
            with repeated(times):
                layer = self.layers[first]
                # a checkpointed layer's kwargs (the mask, cos and sin) live until its recomputation
                kwargs = dict(
                    attention_mask=mask if layer.kind == "*" else None, position_embeddings=position_embeddings
                )
                hidden_states = layer(hidden_states, **kwargs)
                del kwargs
        hidden_states = self.norm(hidden_states)  # :1122
        del position_ids, mask, position_embeddings
        return hidden_states

    def head(self, logits: Tensor) -> Tensor:
        return A.div(logits, granite.SCALE)  # ``logits / self.config.logits_scaling``


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B) -> GraniteMoeHybridForCausalLM:
    """The program of ``ops.transformers.predict_step``."""
    return GraniteMoeHybridForCausalLM(cfg, seq, setup, batch)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = mamba2.unproven_sizes(cfg) if cfg.mamba_layers else []
    if setup.checkpoint == "selective":
        out.append("transformers has no selective activation checkpointing")
    if cfg.mlp != "swiglu" or not cfg.mixer_ffn or set(cfg.layer_pattern or "") - set("M*"):
        out.append("a granitemoehybrid model other than Mamba2 or attention mixers each with a SwiGLU")
    return out
