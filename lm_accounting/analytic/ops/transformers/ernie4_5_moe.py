"""transformers 5.24's ``Ernie4_5_MoeForCausalLM`` training step, transliterated
(``models/ernie4_5_moe/modeling_ernie4_5_moe.py``).

The model, its mask, its norms and its loss are Llama's (``llama.py``); the attention and the rotary table are ERNIE
4.5's (``interleaved.ErnieAttention``: RoPE over interleaved pairs in fp32, ``olmo2.rotary_embedding``'s fp32
table); the experts run ``grouped_mm`` (``Ernie4_5_MoeExperts`` is ``@use_experts_implementation``:
``moe.Experts``); a layer i is sparse from ``moe_layer_start_index`` on when (i + 1) % ``moe_layer_interval`` == 0
(``moe.MoeDecoderLayer``; dense ones are ``Ernie4_5_MoeMLP`` of ``intermediate_size``, ``use_bias`` on its three
projections).  What ERNIE 4.5-MoE does differently:

* ``Ernie4_5_MoeTopKRouter.forward`` (:345-357), in a region with autocast disabled (``maybe_autocast(enabled=
  False)``): ``F.linear(hidden_states.float(), weight.float())`` (the weight kept fp32:
  ``_keep_in_fp32_modules_strict``), softmax in fp32, the frozen score bias added (``Ernie4_5_MoeStatics``: its
  ``e_score_correction_bias`` is a parameter that needs no gradient, so no AdamW state), ``topk`` of the sum (its
  values a local until the return), ``gather`` of the probabilities, divided by ``clamp(sum, min=moe_norm_min)``;
  then cast to the hidden states' dtype;
* ``Ernie4_5_MoeSparseMoeBlock`` (:360-387) registers ``gate``, ``experts``, ``shared_experts`` (one
  ``Ernie4_5_MoeMLP`` of ``moe_intermediate_size × moe_num_shared_experts``, ``use_bias``) and runs the shared
  experts first on the (B·S, d) states, then the router and the experts, the sum, and a cast to the input's dtype.

``use_bias`` also puts a bias on the LM head (:635), tied embeddings or not.  Under amp-bf16 the router runs in its
autocast-off region (``tensors.autocast_off``; the measured side's ``measure.hf.HFAutocast`` honours it as CUDA's
autocast does, ``cuda_regions``).
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..aten_index import gather, topk
from ..aten_pointwise import clamp, divide
from ..engine import Affine
from ..tensors import Tensor, autocast_off, empty, parameter
from . import interleaved, moe, olmo2
from .llama import MLP, B


class TopKRouter:
    """``Ernie4_5_MoeTopKRouter`` (:336-357): the fp32 weight (E, d), the frozen fp32 score bias (1, E)."""

    def __init__(self, cfg: ModelConfig, name: str):
        self.weight = parameter((cfg.num_experts, cfg.d_model), "fp32", name + ".weight")
        self.e_score_correction_bias = empty((1, cfg.num_experts), "fp32", name + ".moe_statics")
        self.top_k = cfg.experts_per_token

    def __call__(self, hidden_states: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        with autocast_off():  # :347 ``maybe_autocast(enabled=False)``
            router_logits = A.linear(A.to(hidden_states, "fp32"), self.weight)  # :348
            routing_weights = A.softmax(router_logits, 1, "fp32")  # :349
            statics = A.add(routing_weights, A.squeeze(self.e_score_correction_bias, 0))  # :350, the statics
            _, selected_experts = topk(statics, self.top_k)
            del statics
            routing_weights = gather(routing_weights, -1, selected_experts)  # :351
            routing_weights = divide(routing_weights, clamp(A.sum_(routing_weights, -1, keepdim=True)))  # :352-354
        routing_weights = A.to(routing_weights, hidden_states.dtype)  # :355
        return router_logits, routing_weights, selected_experts


class SparseMoeBlock:
    """``Ernie4_5_MoeSparseMoeBlock``: gate, experts, shared experts (when ``moe_num_shared_experts`` > 0)."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.gate = TopKRouter(cfg, name + ".gate")
        self.experts = moe.Experts(cfg, dtype, name + ".experts")
        shared = cfg.shared_experts > 0
        self.shared_experts = MLP(cfg, dtype, name + ".shared_experts", cfg.shared_width) if shared else None

    def params(self) -> list[Tensor]:
        shared = self.shared_experts.params() if self.shared_experts is not None else []
        return [self.gate.weight] + self.experts.params() + shared

    def __call__(self, hidden_states: Tensor) -> Tensor:
        batch_size, sequence_length, hidden_dim = hidden_states.shape  # :374
        hidden_states = A.view(hidden_states, -1, hidden_dim)
        if self.shared_experts is not None:
            shared_output = self.shared_experts(hidden_states)
        _, top_k_weights, top_k_index = self.gate(hidden_states)
        final_hidden_states = self.experts(hidden_states, top_k_index, top_k_weights)
        if self.shared_experts is not None:
            final_hidden_states = A.add(final_hidden_states, shared_output)  # :384
        final_hidden_states = A.reshape(final_hidden_states, batch_size, sequence_length, hidden_dim)
        return A.to(final_hidden_states, hidden_states.dtype)  # :387


class DecoderLayer(moe.MoeDecoderLayer):
    """``Ernie4_5_MoeDecoderLayer`` (:390-440): Llama's layer with ERNIE 4.5's attention and sparse block."""

    attention_class = interleaved.ErnieAttention
    sparse_class = SparseMoeBlock


class Ernie4_5_MoeForCausalLM(moe.MoeForCausalLM):
    """``Ernie4_5_MoeForCausalLM`` with ``Ernie4_5_MoeModel`` (Llama's forward, ERNIE 4.5's fp32 rotary table)."""

    layer_class = DecoderLayer

    def __init__(self, cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B):
        super().__init__(cfg, seq, setup, batch)
        if cfg.lm_head_bias:  # nn.Linear(d, vocab, bias=use_bias), tied or not (:635)
            self.lm_head_bias = parameter((cfg.vocab_size,), self.dtype, "lm_head.bias")

    def rotary(self, hidden_states: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        return olmo2.rotary_embedding(position_ids, self.inv_freq)


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B) -> Ernie4_5_MoeForCausalLM:
    """The program of ``ops.transformers.predict_step``."""
    return Ernie4_5_MoeForCausalLM(cfg, seq, setup, batch)


def fp32_kept_parameters(cfg: ModelConfig) -> int:
    """The router weights (E, d) of the sparse layers, fp32 in a 16-bit model (``_keep_in_fp32_modules_strict``)."""
    return cfg.num_experts * cfg.d_model * cfg.moe_layers


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    return moe.unsupported(cfg, setup)
