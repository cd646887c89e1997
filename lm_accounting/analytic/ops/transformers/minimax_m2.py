"""transformers 5.24's ``MiniMaxM2ForCausalLM`` training step, transliterated
(``models/minimax_m2/modeling_minimax_m2.py``).

The model, its mask (``create_causal_mask``, no window), its rotary table, its norms and its loss are Llama's
(``llama.py``); the attention is OLMoE's (``olmoe.Attention``: q and k RMSNormed over the whole projection with
Llama's norm, :276-338) with RoPE on the first ``rotary_dim`` of each head (StableLM's ``stablelm.Attention.rotate``:
slices, rotated, concatenated back); every layer is sparse, the experts under ``grouped_mm``
(``MiniMaxM2Experts`` is ``@use_experts_implementation``: ``moe.Experts``).  What MiniMax-M2 does differently:

* ``MiniMaxM2TopKRouter.forward`` (:54-65): ``F.linear`` of the states cast to the weight's dtype, a sigmoid of the
  logits' fp32 copy (``.float()``: a copy in 16-bit and under autocast), the score-correction bias added (a buffer of
  the model's dtype, ``MiniMaxM2SparseMoeBlock.e_score_correction_bias``), ``topk`` of the sum (its values a local
  until the return), ``gather`` of the sigmoid's scores, divided in place by their sum (``moe.div_``);
* ``MiniMaxM2SparseMoeBlock`` (:107-125) registers ``gate`` before ``experts``; ``router_jitter_noise`` only 0 (the
  class's default; the reader ignores it, as Mixtral's).
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..aten_index import gather, topk
from ..aten_pointwise import sigmoid
from ..engine import Affine
from ..tensors import Tensor, empty, parameter
from . import moe, olmoe, stablelm
from .llama import B


class Attention(olmoe.Attention):
    """``MiniMaxM2Attention``: OLMoE's with RoPE on the first ``rotary_dim`` of each head."""

    rotate = stablelm.Attention.rotate


class TopKRouter:
    """``MiniMaxM2TopKRouter``: the weight (E, d)."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.weight = parameter((cfg.num_experts, cfg.d_model), dtype, name + ".weight")
        self.top_k, self.hidden_dim = cfg.experts_per_token, cfg.d_model

    def __call__(self, hidden_states: Tensor, e_score_correction_bias: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        hidden_states = A.reshape(hidden_states, -1, self.hidden_dim)  # :55
        router_logits = A.linear(A.to(hidden_states, self.weight.dtype), self.weight)  # :56
        routing_weights = sigmoid(A.to(router_logits, "fp32"))  # :58
        scores_for_choice = A.add(routing_weights, e_score_correction_bias)  # :59
        _, top_k_index = topk(scores_for_choice, self.top_k)  # :60
        top_k_weights = gather(routing_weights, 1, top_k_index)  # :61
        top_k_weights = moe.div_(top_k_weights, A.sum_(top_k_weights, -1, keepdim=True))  # :62
        router_scores = top_k_weights
        return router_logits, router_scores, top_k_index


class SparseMoeBlock:
    """``MiniMaxM2SparseMoeBlock``: gate, experts, the buffer ``e_score_correction_bias`` (E,)."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.gate = TopKRouter(cfg, dtype, name + ".gate")
        self.experts = moe.Experts(cfg, dtype, name + ".experts")
        self.e_score_correction_bias = empty((cfg.num_experts,), dtype, name + ".e_score_correction_bias")

    def params(self) -> list[Tensor]:
        return [self.gate.weight] + self.experts.params()

    def __call__(self, hidden_states: Tensor) -> Tensor:
        batch_size, sequence_length, hidden_dim = hidden_states.shape  # :117
        hidden_states = A.view(hidden_states, -1, hidden_dim)
        _, top_k_weights, top_k_index = self.gate(hidden_states, self.e_score_correction_bias)
        hidden_states = self.experts(hidden_states, top_k_index, top_k_weights)
        return A.reshape(hidden_states, batch_size, sequence_length, hidden_dim)  # :124


class DecoderLayer(moe.MoeDecoderLayer):
    """``MiniMaxM2DecoderLayer`` (:341-378): Llama's layer with MiniMax-M2's attention and sparse block."""

    attention_class = Attention
    sparse_class = SparseMoeBlock


class MiniMaxM2ForCausalLM(moe.MoeForCausalLM):
    """``MiniMaxM2ForCausalLM`` with ``MiniMaxM2Model`` (Llama's forward); the rotary table of ``rotary_dim``."""

    layer_class = DecoderLayer

    def rotary_pairs(self) -> int:
        return self.cfg.rope_dim // 2


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B) -> MiniMaxM2ForCausalLM:
    """The program of ``ops.transformers.predict_step``."""
    return MiniMaxM2ForCausalLM(cfg, seq, setup, batch)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    return moe.unsupported(cfg, setup)
