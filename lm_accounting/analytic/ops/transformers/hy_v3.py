"""transformers 5.24's ``HYV3ForCausalLM`` training step (Hunyuan v3), transliterated
(``models/hy_v3/modeling_hy_v3.py``).

The model, its mask (``create_causal_mask``, no window), its rotary table, its norms and its loss are Llama's
(``llama.py``); the experts run ``grouped_mm`` (``HYV3Experts`` is ``@use_experts_implementation``:
``moe.Experts``); the layers are dense before ``mlp_layer_types``' first "sparse" (``HYV3MLP`` of
``intermediate_size``, ``mlp_bias``: ``moe.MoeDecoderLayer``).  What Hunyuan v3 does differently:

* ``HYV3Attention.forward`` (:228-268): q, k and v projected, viewed and transposed, then the per-head q/k RMSNorms
  on the (B, h, S, d) states (EXAONE 4's place: ``llama.Attention.norm_at`` "heads"), then RoPE; ``attention_bias``
  on q, k, v and o;
* ``HYV3TopKRouter.forward`` (:280-298): an fp32 ``F.linear`` of ``hidden_states.float()`` (the weight kept fp32:
  ``_keep_in_fp32_modules_strict``), sigmoid, the fp32 ``e_score_correction_bias`` added, ``topk`` of the sum (its
  values a local until the return), ``gather`` of the scores, divided by ``sum + 1e-20`` (not in place), times
  ``router_scaling_factor``;
* ``HYV3MoE`` (:340-366) registers ``gate``, ``experts``, the buffer, ``shared_experts`` (an ``HYV3MLP`` of
  ``moe_intermediate_size × num_shared_experts``) and runs the router and the experts, then the shared experts, and
  sums them: with ``enable_moe_fp32_combine`` (the class's default) as ``(routed.float() + shared.float()).to(
  dtype)``.
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..aten_index import gather, topk
from ..aten_pointwise import divide, sigmoid
from ..engine import Affine
from ..tensors import Tensor, empty, parameter
from . import deepseek, llama, moe
from .llama import MLP, B


class Attention(llama.Attention):
    """``HYV3Attention``: the per-head q/k norms on the transposed states, before RoPE."""

    norm_at = "heads"


class TopKRouter:
    """``HYV3TopKRouter``: the fp32 weight (E, d)."""

    def __init__(self, cfg: ModelConfig, name: str):
        self.weight = parameter((cfg.num_experts, cfg.d_model), "fp32", name + ".weight")
        self.top_k, self.hidden_dim = cfg.experts_per_token, cfg.d_model

    def __call__(self, hidden_states: Tensor, e_score_correction_bias: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        hidden_states = A.reshape(hidden_states, -1, self.hidden_dim)  # :285
        router_logits = A.linear(A.to(hidden_states, "fp32"), self.weight)  # :286
        routing_weights = sigmoid(router_logits)  # :287
        scores_for_choice = A.add(routing_weights, e_score_correction_bias)  # :288
        _, top_k_index = topk(scores_for_choice, self.top_k)  # :289
        top_k_weights = gather(routing_weights, 1, top_k_index)  # :290
        # autocast: sum is an fp32 op (AT_FORALL_FP32_SET_OPT_DTYPE), the scores bf16 (the linear's, the sigmoid's)
        denominator = A.add(A.sum_(top_k_weights, -1, keepdim=True, dtype=A.opt_dtype(None)), 1e-20)
        top_k_weights = divide(top_k_weights, denominator)  # :291
        top_k_weights = A.mul(top_k_weights, 2.826)  # :293 (router_scaling_factor: any number)
        return router_logits, top_k_weights, top_k_index


class SparseMoeBlock:
    """``HYV3MoE``: gate, experts, the fp32 buffer ``e_score_correction_bias`` (E,), shared experts."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.gate = TopKRouter(cfg, name + ".gate")
        self.experts = moe.Experts(cfg, dtype, name + ".experts")
        self.e_score_correction_bias = empty((cfg.num_experts,), "fp32", name + ".e_score_correction_bias")
        self.shared_experts = MLP(cfg, dtype, name + ".shared_experts", cfg.shared_width)
        self.fp32_combine = cfg.moe_fp32_combine

    def params(self) -> list[Tensor]:
        return [self.gate.weight] + self.experts.params() + self.shared_experts.params()

    def __call__(self, hidden_states: Tensor) -> Tensor:
        batch_size, seq_len, hidden_dim = hidden_states.shape  # :352
        hidden_states = A.view(hidden_states, -1, hidden_dim)
        _, top_k_weights, top_k_index = self.gate(hidden_states, self.e_score_correction_bias)
        routed_output = self.experts(hidden_states, top_k_index, top_k_weights)
        if self.fp32_combine:  # :358-361
            routed = A.to(routed_output, "fp32")
            shared = A.to(self.shared_experts(hidden_states), "fp32")
            hidden_states = A.to(A.add(routed, shared), hidden_states.dtype)
            del routed, shared
        else:
            hidden_states = A.add(routed_output, self.shared_experts(hidden_states))  # :363
        return A.reshape(hidden_states, batch_size, seq_len, hidden_dim)


class DecoderLayer(moe.MoeDecoderLayer):
    """``HYV3DecoderLayer`` (:369-409): Llama's layer with Hunyuan v3's attention and sparse block."""

    attention_class = Attention
    sparse_class = SparseMoeBlock


class HYV3ForCausalLM(moe.MoeForCausalLM):
    """``HYV3ForCausalLM`` with ``HYV3Model`` (Llama's forward)."""

    layer_class = DecoderLayer


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B) -> HYV3ForCausalLM:
    """The program of ``ops.transformers.predict_step``."""
    return HYV3ForCausalLM(cfg, seq, setup, batch)


def fp32_kept_parameters(cfg: ModelConfig) -> int:
    """The router weights (E, d) of the sparse layers, fp32 in a 16-bit model (``_keep_in_fp32_modules_strict``)."""
    return deepseek.fp32_kept_parameters(cfg)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    return moe.unsupported(cfg, setup)
