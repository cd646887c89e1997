"""transformers 5.24's ``Lfm2MoeForCausalLM`` training step, transliterated (``models/lfm2_moe/modeling_lfm2_moe.py``,
line numbers of transformers 5.24).

LFM2's model, layers, short convolutions and attention (``lfm2``: the file is LFM2's but for the feed-forward
block); the first ``num_dense_layers`` layers keep ``Lfm2MoeMLP`` (Llama's SwiGLU of ``intermediate_size``), the
others ``Lfm2MoeSparseMoeBlock`` (:173-189): the states viewed as (T, d), the router, the experts, reshaped back.

* ``Lfm2MoeTopKRouter.forward`` (:151-163): ``F.linear`` to E logits, their sigmoid; with ``use_expert_bias``
  (``ModelConfig.router_buffer_bias``) the fp32 buffer ``expert_bias`` (E,) added (the sum is fp32), ``topk`` of
  the sum (its values and the sum locals until the return), ``gather`` of the sigmoid's scores, ``type_as`` the
  logits; else ``topk`` of the scores; with ``norm_topk_prob`` the weights divided by their sum + 1e-6 (not in
  place; the sum an fp32 op under autocast); times ``routed_scaling_factor`` (a Python number, whatever its value).
* ``Lfm2MoeExperts`` is ``@use_experts_implementation``: transformers' default ``grouped_mm`` (``moe.Experts``:
  ``gate_up_proj`` (E, 2f, d), SiLU gate, ``down_proj`` (E, d, f)); registered before the router.

``grouped_mm``'s meta kernel takes bf16 only (``moe``): an fp32 model is measured on cpu tensors.
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..aten_index import gather, topk
from ..aten_pointwise import divide, sigmoid
from ..engine import Affine
from ..tensors import Tensor, empty, parameter
from . import lfm2, llama, moe
from .llama import B


class TopKRouter:
    """``Lfm2MoeTopKRouter`` (:138-163): the weight (E, d)."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.weight = parameter((cfg.num_experts, cfg.d_model), dtype, name + ".weight")
        self.top_k, self.norm_topk_prob = cfg.experts_per_token, cfg.norm_topk_prob
        self.use_expert_bias = cfg.router_buffer_bias

    def __call__(self, hidden_states: Tensor, expert_bias: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        router_logits = A.linear(hidden_states, self.weight)  # :152
        routing_weights = sigmoid(router_logits)
        if self.use_expert_bias:
            scores_for_routing = A.add(routing_weights, expert_bias)  # :155
            _, selected_experts = topk(scores_for_routing, self.top_k)
            routing_weights = A.to(gather(routing_weights, 1, selected_experts), router_logits.dtype)  # :157
        else:
            routing_weights, selected_experts = topk(routing_weights, self.top_k)  # :159
        if self.norm_topk_prob:
            # under autocast ``sum`` is an fp32 op (AT_FORALL_FP32_SET_OPT_DTYPE): the quotient is fp32
            denominator = A.add(A.sum_(routing_weights, -1, keepdim=True, dtype=A.opt_dtype(None)), 1e-6)
            routing_weights = divide(routing_weights, denominator)
        routing_weights = A.mul(routing_weights, 1.0)  # :162 (* routed_scaling_factor)
        return router_logits, routing_weights, selected_experts


class SparseMoeBlock:
    """``Lfm2MoeSparseMoeBlock`` (:166-189): experts, gate, the fp32 buffer ``expert_bias`` (E,)."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.experts = moe.Experts(cfg, dtype, name + ".experts")
        self.gate = TopKRouter(cfg, dtype, name + ".gate")
        bias = cfg.router_buffer_bias
        self.expert_bias = empty((cfg.num_experts,), "fp32", name + ".expert_bias") if bias else None

    def params(self) -> list[Tensor]:
        return self.experts.params() + [self.gate.weight]

    def __call__(self, hidden_states: Tensor) -> Tensor:
        batch_size, sequence_length, hidden_dim = hidden_states.shape  # :182
        hidden_states_reshaped = A.view(hidden_states, -1, hidden_dim)
        _, routing_weights, selected_experts = self.gate(hidden_states_reshaped, self.expert_bias)
        final_hidden_states = self.experts(hidden_states_reshaped, selected_experts, routing_weights)
        return A.reshape(final_hidden_states, batch_size, sequence_length, hidden_dim)  # :189


class Lfm2MoeForCausalLM(lfm2.Lfm2ForCausalLM):
    """``Lfm2MoeForCausalLM`` with ``Lfm2MoeModel`` (LFM2's forward), without ``output_router_logits``."""

    def feed_forward(self, name: str, layer: int):
        if self.cfg.layer_moe(layer):
            return SparseMoeBlock(self.cfg, self.dtype, name + ".feed_forward")
        return llama.MLP(self.cfg, self.dtype, name + ".feed_forward")


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B) -> Lfm2MoeForCausalLM:
    """The program of ``ops.transformers.predict_step``."""
    return Lfm2MoeForCausalLM(cfg, seq, setup, batch)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    return lfm2.unsupported(cfg, setup)
