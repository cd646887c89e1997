"""transformers 5.24's ``FalconH1ForCausalLM`` training step, transliterated (``models/falcon_h1/
modeling_falcon_h1.py``, line numbers of transformers 5.24).

Llama's model skeleton (``llama.LlamaForCausalLM``: ``arange(S) + 0``, ``create_causal_mask`` with its
packed-sequence check, the rotary table, a final RMSNorm, an untied head, ``ForCausalLMLoss``) around Falcon-H1's
layer (``FalconH1DecoderLayer``, :867-948): ``input_layernorm``, then the Mamba2 mixer and attention side by side on
its output, each scaled, summed into the residual; ``pre_ff_layernorm`` and the MLP.  What Falcon-H1 does
differently (its multipliers are Python numbers: each a ``mul`` whose value changes no byte):

* the mixer (``FalconH1Mixer``, :589-825): Nemotron-H's (``mamba2.Mamba2Mixer``) with its input times
  ``ssm_in_multiplier``, ``in_proj``'s output times the ``mup_vector`` buffer (1, 1, W) each mixer registers (its
  saved operand), ``scan_output.view`` (not reshape) and, without ``mamba_rms_norm`` (the class's default),
  ``scan_output * silu(gate)`` in place of the gated RMSNorm; with it, ``FalconH1RMSNormGated`` (:238-273: the
  gate's SiLU in fp32 multiplied before the norm or after it, as ``mamba_norm_before_gate`` says, the weight viewed
  per group before it multiplies);
* its output times ``ssm_out_multiplier``; attention on ``hidden_states * attention_in_multiplier``, its output
  times ``attention_out_multiplier`` (:917-934);
* ``FalconH1Attention`` (:169-235): Llama's with the keys times ``key_multiplier`` and Nemotron-H's end (the
  output dies at ``o_proj``, then q, k and v);
* ``FalconH1MLP`` (:828-844): ``up_proj(x) * act(gate_proj(x) * gate_multiplier)``, ``down_proj(y) *
  down_multiplier``;
* the embeddings times ``embedding_multiplier``, the logits times ``lm_head_multiplier``.

amp-bf16 as Nemotron-H's (``nemotron_h``).
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..aten_index import split_with_sizes
from ..aten_pointwise import exp
from ..engine import Affine
from ..tensors import Tensor, empty, no_grad, parameter
from . import llama, mamba2, nemotron_h
from .llama import B, Linear

SCALE = 1.0  # the multipliers' values: bytes do not depend on them


class RMSNormGated:
    """``FalconH1RMSNormGated`` (:238-273) on a (B, S, W) input: the gate multiplied before the norm
    (``norm_before_gate`` false) or after it, the norm per group in fp32, cast back to the input's dtype."""

    def __init__(self, size: int, groups: int, dtype: str, name: str, norm_before_gate: bool):
        self.weight = parameter((size,), dtype, name + ".weight")
        self.n_groups, self.norm_before_gate = groups, norm_before_gate

    def __call__(self, hidden_states: Tensor, gate: Tensor) -> Tensor:
        input_dtype = hidden_states.dtype  # :247
        if not self.norm_before_gate:
            hidden_states = A.mul(hidden_states, A.silu(A.to(gate, "fp32")))  # :250-251
        batch_size, seq_len, dim = hidden_states.shape  # :254
        hidden_states = A.to(hidden_states, "fp32")  # :258
        group = dim // self.n_groups
        hidden_states = A.view(hidden_states, batch_size, seq_len, self.n_groups, group)  # :260
        variance = A.mean(A.pow_(hidden_states, 2), -1, keepdim=True)
        hidden_states = A.mul(hidden_states, A.rsqrt(A.add(variance, 1e-6)))  # :263
        hidden_states = A.mul(A.view(self.weight, self.n_groups, group), hidden_states)  # :265
        hidden_states = A.view(hidden_states, batch_size, seq_len, dim)
        if self.norm_before_gate:
            hidden_states = A.mul(hidden_states, A.silu(A.to(gate, "fp32")))  # :271-272
        return A.to(hidden_states, input_dtype)  # :273


class Mixer(mamba2.Mamba2Mixer):
    """``FalconH1Mixer`` (:589-825): its gated RMSNorm with ``mamba_rms_norm``, else ``nn.Identity()``."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str, buffer_dtype: str | None = None):
        super().__init__(cfg, dtype, name)
        groups, before = cfg.mamba_groups, cfg.mamba_norm_before_gate
        self.norm = (
            RMSNormGated(self.intermediate_size, groups, dtype, name + ".norm", before) if cfg.mamba_norm else None
        )
        self.mup_vector = empty((1, 1, cfg.mamba_in_width), buffer_dtype or dtype, name + ".mup_vector")  # a buffer

    def params(self) -> list[Tensor]:
        own = [self.dt_bias, self.A_log, self.D, self.conv_weight, self.conv_bias]
        norm = [self.norm.weight] if self.norm is not None else []
        return own + self.in_proj.params() + norm + self.out_proj.params()

    def __call__(self, hidden_states: Tensor) -> Tensor:
        batch_size, seq_len, _ = hidden_states.shape  # :677
        dtype = hidden_states.dtype
        hidden_states = A.mul(hidden_states, SCALE)  # :689 ssm_in_multiplier
        projected_states = self.in_proj(hidden_states)
        projected_states = A.mul(projected_states, self.mup_vector)  # :691
        A_ = A.neg(exp(A.to(self.A_log, "fp32")))  # :693
        sizes = [self.intermediate_size, self.conv_dim, self.num_heads]
        gate, hidden_states_B_C, dt = split_with_sizes(projected_states, sizes, -1)  # :718
        hidden_states_B_C = A.transpose(hidden_states_B_C, 1, 2)
        weight = A.squeeze(self.conv_weight, 1)
        hidden_states_B_C = self.causal_conv1d_fn(hidden_states_B_C, weight, self.conv_bias)  # :741
        del weight
        hidden_states_B_C = A.transpose(hidden_states_B_C, 1, 2)  # :753
        n = self.n_groups * self.ssm_state_size
        hidden_states, B_, C_ = split_with_sizes(hidden_states_B_C, [self.intermediate_size, n, n], -1)
        scan_output = None  # first in the decode branch (:782), before ``scan_result`` (:795)
        scan_result = mamba2.mamba2_chunk_scan(
            A.view(hidden_states, batch_size, seq_len, -1, self.head_dim),
            dt,
            A_,
            A.view(B_, batch_size, seq_len, self.n_groups, -1),
            A.view(C_, batch_size, seq_len, self.n_groups, -1),
            self.chunk_size,
            self.D,
            self.dt_bias,
        )  # :795-809
        scan_output = A.view(scan_result, batch_size, seq_len, -1)  # :817
        if self.norm is not None:  # :818-823
            scan_output = self.norm(scan_output, gate)
        else:
            scan_output = A.mul(scan_output, A.silu(gate))
        return self.out_proj(A.to(scan_output, dtype))  # :826


class Attention(nemotron_h.Attention):
    """``FalconH1Attention`` (:169-235)."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str):
        super().__init__(cfg, dtype, attn, name)
        self.use_rope = True

    def __call__(self, hidden_states: Tensor, position_embeddings, attention_mask) -> tuple[Tensor, Tensor | None]:
        input_shape = hidden_states.shape[:-1]  # :204
        hidden_shape = (*input_shape, -1, self.head_dim)
        query_states = A.transpose(A.view(self.q_proj(hidden_states), *hidden_shape), 1, 2)  # :207-209
        key_states = A.mul(A.transpose(A.view(self.k_proj(hidden_states), *hidden_shape), 1, 2), SCALE)
        value_states = A.transpose(A.view(self.v_proj(hidden_states), *hidden_shape), 1, 2)
        cos, sin = position_embeddings  # :211
        query_states, key_states = llama.apply_rotary_pos_emb(query_states, key_states, cos, sin)
        attn_output, attn_weights = self.attend(query_states, key_states, value_states, attention_mask)  # :221
        attn_output = A.contiguous(A.reshape(attn_output, *input_shape, -1))  # :232
        attn_output = self.o_proj(attn_output)
        return attn_output, attn_weights


class MLP:
    """``FalconH1MLP`` (:828-844)."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        d, f = cfg.d_model, cfg.d_ff
        self.gate_proj = Linear(d, f, cfg.mlp_bias, dtype, name + ".gate_proj")
        self.up_proj = Linear(d, f, cfg.mlp_bias, dtype, name + ".up_proj")
        self.down_proj = Linear(f, d, cfg.mlp_bias, dtype, name + ".down_proj")

    def params(self) -> list[Tensor]:
        return self.gate_proj.params() + self.up_proj.params() + self.down_proj.params()

    def __call__(self, x: Tensor) -> Tensor:
        y = A.mul(self.up_proj(x), A.silu(A.mul(self.gate_proj(x), SCALE)))  # :841
        y = A.mul(self.down_proj(y), SCALE)  # :842
        return y


class DecoderLayer(llama.GradientCheckpointingLayer):
    """``FalconH1DecoderLayer`` (:867-948)."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str, norm, buffer_dtype: str | None = None):
        self.feed_forward = MLP(cfg, dtype, name + ".feed_forward")
        self.mamba = Mixer(cfg, dtype, name + ".mamba", buffer_dtype)
        self.self_attn = Attention(cfg, dtype, attn, name + ".self_attn")
        self.input_layernorm = norm(cfg.d_model, dtype, name + ".input_layernorm")
        self.pre_ff_layernorm = norm(cfg.d_model, dtype, name + ".pre_ff_layernorm")

    def params(self) -> list[Tensor]:
        norms = [self.input_layernorm.weight, self.pre_ff_layernorm.weight]
        return self.feed_forward.params() + self.mamba.params() + self.self_attn.params() + norms

    def forward(
        self, hidden_states: Tensor, attention_mask=None, position_ids=None, position_embeddings=None
    ) -> Tensor:
        residual = hidden_states  # :913
        hidden_states = self.input_layernorm(hidden_states)
        mamba_hidden_states = self.mamba(hidden_states)  # :916-921
        mamba_hidden_states = A.mul(mamba_hidden_states, SCALE)
        attention_hidden_states, _ = self.self_attn(A.mul(hidden_states, SCALE), position_embeddings, attention_mask)
        attention_hidden_states = A.mul(attention_hidden_states, SCALE)  # :933
        hidden_states = A.add(mamba_hidden_states, attention_hidden_states)
        hidden_states = A.add(residual, hidden_states)  # :938
        residual = hidden_states
        hidden_states = self.pre_ff_layernorm(hidden_states)
        hidden_states = self.feed_forward(hidden_states)
        return A.add(residual, hidden_states)  # :944 (returned as a 1-tuple)


class FalconH1ForCausalLM(llama.LlamaForCausalLM):
    """``FalconH1ForCausalLM`` with ``FalconH1Model`` (:1018-1175), labels given."""

    def __init__(self, cfg: ModelConfig, seq: int, setup: TrainingSetup, batch=B, buffer_dtype: str | None = None):
        self.buffer_dtype = buffer_dtype  # the mixers' ``mup_vector``: fp32 under FSDP2's bf16 policy (``ops.fsdp``)
        super().__init__(cfg, seq, setup, batch)

    def decoder_layer(self, name: str, norm) -> DecoderLayer:
        return DecoderLayer(self.cfg, self.dtype, self.setup.attention, name, norm, self.buffer_dtype)

    def embed(self) -> Tensor:
        return A.mul(super().embed(), SCALE)  # :1066

    def model(self) -> Tensor:
        """``FalconH1Model.forward`` (:1050-1111): every layer alike (the first and last replayed alone)."""
        inputs_embeds = self.embed()
        hidden_states = inputs_embeds
        position_ids = A.unsqueeze(llama.arange_plus(self.seq), 0)  # :1073-1075
        with no_grad():
            llama.find_packed_sequence_indices(A.expand(position_ids, self.batch, -1))
        mask = self.masks()[False]  # :1077-1089
        position_embeddings = self.rotary(hidden_states, position_ids)  # :1090
        kwargs = dict(attention_mask=mask, position_ids=position_ids, position_embeddings=position_embeddings)
        hidden_states = self.run_layers(hidden_states, lambda i, kw=kwargs: kw)  # :1092-1103
        hidden_states = self.norm(hidden_states)  # :1105
        del kwargs, mask, position_ids, position_embeddings
        return hidden_states

    def head(self, logits: Tensor) -> Tensor:
        return A.mul(logits, SCALE)  # :1160 lm_head_multiplier


def causal_lm(
    cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B, buffer_dtype: str | None = None
) -> FalconH1ForCausalLM:
    """The program of ``ops.transformers.predict_step``; ``buffer_dtype``: the ``mup_vector`` buffers' dtype where not
    the parameters' (fp32 under FSDP2's bf16 policy over the fp32 model, ``ops.fsdp.predict_rank``)."""
    return FalconH1ForCausalLM(cfg, seq, setup, batch, buffer_dtype)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = mamba2.unproven_sizes(cfg) if cfg.mamba_layers else []
    if setup.checkpoint == "selective":
        out.append("transformers has no selective activation checkpointing")
    if cfg.mlp != "swiglu" or cfg.moe:
        out.append("a falcon_h1 model other than its SwiGLU MLP")
    return out
