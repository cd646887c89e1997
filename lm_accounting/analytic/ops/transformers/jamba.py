"""transformers 5.24's ``JambaForCausalLM`` training step, transliterated (``models/jamba/modeling_jamba.py``, line
numbers of transformers 5.24).

Llama's two-sublayer layer (``JambaAttentionDecoderLayer`` :732-768, ``JambaMambaDecoderLayer`` :771-802:
``input_layernorm``, the mixer, the residual, ``pre_ff_layernorm``, the FFN, the residual; ``JambaRMSNorm`` is
Llama's) whose mixer is

* ``*``: ``JambaAttention`` (:155-207): Llama's attention without positions or biases (``nemotron_h.Attention``),
  eager or sdpa;
* ``S``: ``JambaMambaMixer`` (:446-624): Mamba's mixer (``mamba.Mixer``: the conv, ``x_proj``, the sequential
  ``mamba_selective_scan``, the same function line for line) without the ``mamba_inner_fn`` call, with RMSNorms
  with gains on dt, B and C (``dt_layernorm``, ``b_layernorm``, ``c_layernorm``);

and whose FFN is ``JambaSparseMoeBlock`` (:701-729: ``JambaTopKRouter``, a softmax in fp32, top-k left
unnormalised, cast to the input's dtype; then
``JambaExperts`` under transformers' default ``grouped_mm``, ``moe.Experts``) on the layers ``layer_moe`` says, a
SwiGLU ``JambaMLP`` (:627-641, ``llama.MLP``) on the others.

The model (:861-915): the embedding, ``position_ids``, ``create_causal_mask`` (with the packed-sequence check) for
the attention layers and ``create_recurrent_attention_mask`` (None without a padding mask) for the Mamba ones, the
layers (runs of alike middle layers replayed once), ``final_layernorm``; ``JambaForCausalLM`` (:1012-1086): the head
and ``ForCausalLMLoss``, without ``output_router_logits`` (the class default; the reader ignores the field, so an
auxiliary loss asked for by a config.json is not modelled).

amp-bf16: ``llama.LlamaForCausalLM.loss``'s autocast region (Mamba's ops as ``mamba`` says).  Not transliterated
(``unsupported``): selective checkpointing (transformers has none).  No torch.
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..aten_index import topk
from ..engine import Affine
from ..tensors import Tensor, repeated, runs_of, split_runs
from . import llama, mamba, moe, nemotron_h
from .llama import B, RMSNorm


class MambaMixer(mamba.Mixer):
    """``JambaMambaMixer`` (:446-624)."""

    calls_mamba_inner_fn = False

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        super().__init__(cfg, dtype, name)
        self.dt_layernorm = RMSNorm(self.time_step_rank, dtype, name + ".dt_layernorm")
        self.b_layernorm = RMSNorm(self.ssm_state_size, dtype, name + ".b_layernorm")
        self.c_layernorm = RMSNorm(self.ssm_state_size, dtype, name + ".c_layernorm")

    def params(self) -> list[Tensor]:
        norms = [self.dt_layernorm.weight, self.b_layernorm.weight, self.c_layernorm.weight]
        return super().params() + norms

    def normed(self, time_step: Tensor, B_: Tensor, C_: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """:571-573."""
        time_step = self.dt_layernorm(time_step)
        B_ = self.b_layernorm(B_)
        C_ = self.c_layernorm(C_)
        return time_step, B_, C_


class TopKRouter(moe.TopKRouter):
    """``JambaTopKRouter`` (:683-698): a softmax in fp32, the top-k left unnormalised and cast to the *input's*
    dtype (fp32 under amp-bf16, where Qwen3-MoE's casts to the bf16 logits' dtype)."""

    def __call__(self, hidden_states: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        router_logits = A.linear(hidden_states, self.weight)  # (T, E)
        routing_weights = A.softmax(router_logits, -1, "fp32")
        top_k_weights, top_k_index = topk(routing_weights, self.top_k)
        return router_logits, A.to(top_k_weights, hidden_states.dtype), top_k_index


class SparseMoeBlock(moe.SparseMoeBlock):
    """``JambaSparseMoeBlock`` (:701-729): ``router`` registered before ``experts``."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.mixtral = False
        self.gate = TopKRouter(cfg, dtype, name + ".router", mixtral=False)
        self.experts = moe.Experts(cfg, dtype, name + ".experts")

    def params(self) -> list[Tensor]:
        return [self.gate.weight] + self.experts.params()


class DecoderLayer(llama.GradientCheckpointingLayer):
    """``JambaAttentionDecoderLayer`` / ``JambaMambaDecoderLayer`` (:732-802)."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str, kind: str, sparse: bool):
        self.kind = kind
        if kind == "*":
            self.mixer = nemotron_h.Attention(cfg, dtype, attn, name + ".self_attn")
        else:
            self.mixer = MambaMixer(cfg, dtype, name + ".mamba")
        self.feed_forward = (SparseMoeBlock if sparse else llama.MLP)(cfg, dtype, name + ".feed_forward")
        self.input_layernorm = RMSNorm(cfg.d_model, dtype, name + ".input_layernorm")
        self.pre_ff_layernorm = RMSNorm(cfg.d_model, dtype, name + ".pre_ff_layernorm")

    def params(self) -> list[Tensor]:
        norms = [self.input_layernorm.weight, self.pre_ff_layernorm.weight]
        return self.mixer.params() + self.feed_forward.params() + norms

    def forward(self, hidden_states: Tensor, attention_mask=None, position_embeddings=None, position_ids=None):
        residual = hidden_states  # :753 / :791
        hidden_states = self.input_layernorm(hidden_states)
        if self.kind == "*":  # ``_`` keeps eager's probabilities until the layer returns
            hidden_states, _ = self.mixer(hidden_states, None, attention_mask)
        else:
            hidden_states = self.mixer(hidden_states)
        hidden_states = A.add(residual, hidden_states)
        residual = hidden_states
        hidden_states = self.pre_ff_layernorm(hidden_states)
        hidden_states = self.feed_forward(hidden_states)
        return A.add(residual, hidden_states)


class JambaForCausalLM(llama.LlamaForCausalLM):
    """``JambaForCausalLM`` with ``JambaModel``: Llama's model without rotary embeddings (no ``inv_freq``)."""

    def rotary_pairs(self) -> int:
        return 0  # no rotary table: its buffers are empty

    def rotary(self, hidden_states: Tensor, position_ids: Tensor):
        return None

    def decoder_layer(self, name: str, norm: type[RMSNorm]) -> DecoderLayer:
        i = int(name.rsplit(".", 1)[1])
        cfg = self.cfg
        return DecoderLayer(cfg, self.dtype, self.setup.attention, name, cfg.layer_kind(i), cfg.layer_moe(i))

    def run_layers(self, hidden_states: Tensor, kwargs) -> Tensor:
        """The layers in order (:893-901); checkpointed, the middle ones in runs of one kind (mixer and FFN), each
        replayed once, else one by one (``mamba.one_by_one``)."""
        n, cfg = self.cfg.num_layers, self.cfg
        kind = [(cfg.layer_kind(i), cfg.layer_moe(i)) for i in range(n)]
        runs = split_runs(runs_of(kind))  # FSDP2's units cut runs of one kind
        for first, times in runs if self.setup.checkpoint == "full" else mamba.one_by_one(n):
            # the Mamba layers get ``create_recurrent_attention_mask``'s None: a checkpointed one holds no mask
            layer_kwargs = {**kwargs(first), **({} if kind[first][0] == "*" else {"attention_mask": None})}
            with repeated(times):
                hidden_states = self.layers[first](hidden_states, **layer_kwargs)
            del layer_kwargs
        return hidden_states


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B) -> JambaForCausalLM:
    """The program of ``ops.transformers.predict_step``."""
    return JambaForCausalLM(cfg, seq, setup, batch)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    return mamba.unsupported(cfg, setup)  # transformers 5.24's Jamba has no sliding window (the reader ignores it)
