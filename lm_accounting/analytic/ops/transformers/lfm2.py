"""transformers 5.24's ``Lfm2ForCausalLM`` training step, transliterated (``models/lfm2/modeling_lfm2.py``, line
numbers of transformers 5.24).

Llama's model skeleton (``llama.LlamaForCausalLM``: the embedding, ``position_ids`` = ``arange(S) + 0``,
``create_causal_mask`` with its packed-sequence check, the rotary table, the layers, a final RMSNorm named
``embedding_norm``, the head tied to the embeddings by default, ``ForCausalLMLoss``; ``create_recurrent_attention_mask``
is None without a padding mask) around ``Lfm2DecoderLayer`` (:370-411): ``x + mixer(operator_norm(x))``, then
``x + feed_forward(ffn_norm(x))``, the norms Llama's (``Lfm2RMSNorm``), the MLP Llama's SwiGLU (``Lfm2MLP``: w1, w3,
w2), the mixer by ``layer_types``

* "full_attention": ``Lfm2Attention`` (:193-247): Llama's with per-head RMSNorms on q and k before the transpose
  (``q_layernorm``, ``k_layernorm``: ``llama.Attention``'s ``norm_at`` "view"), full RoPE, ``out_proj``; eager or
  sdpa;
* "conv": ``Lfm2ShortConv`` (:291-367) on its CPU path (``causal_conv1d_fn``'s PyTorch fallback, :270-288):
  ``in_proj`` to 3·d, transposed to (B, 3·d, S) and chunked into the gates B and C and the input x; B·x; the
  depthwise ``F.conv1d`` of ``conv_L_cache`` taps padded by K − 1 and cut to S (no activation); C times it;
  transposed back, made contiguous, ``out_proj``.

amp-bf16: autocast's lists as ``model.autocast`` emulates them (``conv1d`` a lower-precision op, ``aten_scan``).
Not transliterated (``unsupported``): transformers' selective checkpointing (it has none).
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..aten_index import split_with_sizes
from ..aten_scan import causal_conv1d
from ..engine import Affine
from ..tensors import Tensor, parameter, repeated, runs_of, split_runs
from . import llama
from .llama import B, Linear


class ShortConv:
    """``Lfm2ShortConv`` (:291-367): registered ``conv`` (weight (d, 1, K), the bias with ``conv_bias``), ``in_proj``
    and ``out_proj`` (biased with ``conv_bias``)."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        d, bias = cfg.d_model, cfg.short_conv_bias
        self.conv_weight = parameter((d, 1, cfg.short_conv_kernel), dtype, name + ".conv.weight")
        self.conv_bias = parameter((d,), dtype, name + ".conv.bias") if bias else None
        self.in_proj = Linear(d, 3 * d, bias, dtype, name + ".in_proj")
        self.out_proj = Linear(d, d, bias, dtype, name + ".out_proj")

    def params(self) -> list[Tensor]:
        conv = [self.conv_weight] + ([self.conv_bias] if self.conv_bias is not None else [])
        return conv + self.in_proj.params() + self.out_proj.params()

    def __call__(self, hidden_states: Tensor) -> Tensor:
        d = hidden_states.shape[-1]
        BCx = A.transpose(self.in_proj(hidden_states), -1, -2)  # :340
        B_, C_, x = split_with_sizes(BCx, [d, d, d], -2)  # ``chunk(3, dim=-2)``: views
        hidden_states = A.mul(B_, x)  # :342
        weight = A.squeeze(self.conv_weight, 1)
        hidden_states = causal_conv1d(hidden_states, weight, self.conv_bias, activation=False)  # :361 (:270-288)
        del weight
        y = A.mul(C_, hidden_states)  # :366
        y = A.contiguous(A.transpose(y, -1, -2))
        return self.out_proj(y)


class DecoderLayer(llama.GradientCheckpointingLayer):
    """``Lfm2DecoderLayer`` (:370-411); ``feed_forward`` a model's own (LFM2-MoE's sparse block)."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str, feed_forward):
        self.kind = "C" if cfg.layer_kind(int(name.rsplit(".", 1)[1])) == "C" else "*"
        if self.kind == "*":
            self.mixer = llama.Attention(cfg, dtype, attn, name + ".self_attn")  # ``out_proj`` labelled o_proj
        else:
            self.mixer = ShortConv(cfg, dtype, name + ".conv")
        self.feed_forward = feed_forward
        self.operator_norm = llama.RMSNorm(cfg.d_model, dtype, name + ".operator_norm")
        self.ffn_norm = llama.RMSNorm(cfg.d_model, dtype, name + ".ffn_norm")

    def params(self) -> list[Tensor]:
        norms = [self.operator_norm.weight, self.ffn_norm.weight]
        return self.mixer.params() + self.feed_forward.params() + norms

    def forward(
        self, hidden_states: Tensor, attention_mask=None, position_embeddings=None, position_ids=None
    ) -> Tensor:
        residual = hidden_states  # :394
        if self.kind == "*":  # ``_`` keeps eager's probabilities until the layer returns
            hidden_states, _ = self.mixer(self.operator_norm(hidden_states), position_embeddings, attention_mask)
        else:
            hidden_states = self.mixer(self.operator_norm(hidden_states))
        hidden_states = A.add(hidden_states, residual)  # :409
        return A.add(hidden_states, self.feed_forward(self.ffn_norm(hidden_states)))  # :410


def layer_runs(cfg: ModelConfig) -> list[tuple[int, int]]:
    """(first layer, count): ``tensors.runs_of`` the layers' mixer (a short convolution or attention) and
    feed-forward (a mixture of experts or not) kinds."""
    return runs_of([(cfg.layer_kind(i) == "C", cfg.layer_moe(i)) for i in range(cfg.num_layers)])


class Lfm2ForCausalLM(llama.LlamaForCausalLM):
    """``Lfm2ForCausalLM`` with ``Lfm2Model`` (:432-604), labels given (``embedding_norm`` labelled norm)."""

    def feed_forward(self, name: str, layer: int):
        """The layer's feed-forward block (a subclass's own: LFM2-MoE's sparse block)."""
        return llama.MLP(self.cfg, self.dtype, name + ".feed_forward")

    def decoder_layer(self, name: str, norm) -> DecoderLayer:
        ffn = self.feed_forward(name, int(name.rsplit(".", 1)[1]))
        return DecoderLayer(self.cfg, self.dtype, self.setup.attention, name, ffn)

    def run_layers(self, hidden_states: Tensor, kwargs) -> Tensor:
        for first, times in split_runs(layer_runs(self.cfg)):  # :488-496; FSDP2's units cut runs of one kind
            with repeated(times):
                hidden_states = self.layers[first](hidden_states, **kwargs(first))
        return hidden_states


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B) -> Lfm2ForCausalLM:
    """The program of ``ops.transformers.predict_step``."""
    return Lfm2ForCausalLM(cfg, seq, setup, batch)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = []
    if setup.checkpoint == "selective":
        out.append("transformers has no selective activation checkpointing")
    return out
