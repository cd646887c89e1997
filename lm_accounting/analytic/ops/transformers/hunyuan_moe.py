"""transformers 5.24's ``HunYuanMoEV1ForCausalLM`` training step (Hunyuan-A13B), transliterated
(``models/hunyuan_v1_moe/modeling_hunyuan_v1_moe.py``).

The model, its mask (``create_causal_mask``), its rotary table, its norms and its loss are Llama's (``llama.py``);
the attention is HunYuan-Dense's (``llama.Attention`` with ``norm_at`` "rope": ``query_layernorm`` and
``key_layernorm`` per head after RoPE, :182-222; ``attention_bias`` on q, k, v and o); the experts run
``grouped_mm`` (``HunYuanMoEV1Experts`` is ``@use_experts_implementation``: ``moe.Experts``).  What HunYuan-MoE does
differently:

* ``HunYuanMoEV1Gate`` (:225-243): ``wg``, an ``nn.Linear`` made fp32 (``dtype=torch.float32``: fp32 in a 16-bit
  model too), so the hidden states are cast to fp32 first (``.float()``: a copy in 16-bit); softmax in fp32,
  ``topk``, the values divided in place by their sum (always: ``moe.div_``), cast back to the logits' dtype (bf16
  under autocast, whose ``F.linear`` makes bf16 logits);
* ``HunYuanMoEV1Moe`` (:285-301) registers ``gate``, ``experts``, ``shared_mlp`` (a ``HunYuanMoEV1MLP`` of
  ``intermediate_size``, Llama's) and runs the shared MLP first on the (B, S, d) states, then the router and the
  experts, then the sum, ungated.
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..aten_index import topk
from ..engine import Affine
from ..tensors import Tensor, parameter
from . import llama, moe
from .llama import MLP, B


class Attention(llama.Attention):
    """``HunYuanMoEV1Attention``: HunYuan-Dense's, the per-head q/k norms after RoPE."""

    norm_at = "rope"


class Gate:
    """``HunYuanMoEV1Gate``: ``wg`` (E, d), fp32."""

    def __init__(self, cfg: ModelConfig, name: str):
        self.wg = parameter((cfg.num_experts, cfg.d_model), "fp32", name + ".wg.weight")
        self.top_k = cfg.experts_per_token

    def __call__(self, hidden_states: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        hidden_states = A.reshape(hidden_states, -1, hidden_states.shape[-1])  # :235
        hidden_states = A.to(hidden_states, "fp32")  # :237 (the weight is fp32)
        router_logits = A.linear(hidden_states, self.wg)  # :238
        routing_weights = A.softmax(router_logits, 1, "fp32")  # :239
        routing_weights, selected_experts = topk(routing_weights, self.top_k)  # :240
        routing_weights = moe.div_(routing_weights, A.sum_(routing_weights, -1, keepdim=True))  # :241
        return router_logits, A.to(routing_weights, router_logits.dtype), selected_experts  # :243


class SparseMoeBlock:
    """``HunYuanMoEV1Moe``: gate, experts, shared MLP."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.gate = Gate(cfg, name + ".gate")
        self.experts = moe.Experts(cfg, dtype, name + ".experts")
        self.shared_mlp = MLP(cfg, dtype, name + ".shared_mlp")

    def params(self) -> list[Tensor]:
        return [self.gate.wg] + self.experts.params() + self.shared_mlp.params()

    def __call__(self, hidden_states: Tensor) -> Tensor:
        batch_size, sequence_length, hidden_dim = hidden_states.shape  # :294
        hidden_states_mlp = self.shared_mlp(hidden_states)
        hidden_states = A.view(hidden_states, -1, hidden_dim)
        _, routing_weights, selected_experts = self.gate(hidden_states)
        final_hidden_states = self.experts(hidden_states, selected_experts, routing_weights)
        final_hidden_states = A.reshape(final_hidden_states, batch_size, sequence_length, hidden_dim)  # :298-300
        return A.add(final_hidden_states, hidden_states_mlp)  # :301


class DecoderLayer(moe.MoeDecoderLayer):
    """``HunYuanMoEV1DecoderLayer`` (:304-345): Llama's layer with HunYuan's attention and sparse block."""

    attention_class = Attention
    sparse_class = SparseMoeBlock


class HunYuanMoEV1ForCausalLM(moe.MoeForCausalLM):
    """``HunYuanMoEV1ForCausalLM`` with ``HunYuanMoEV1Model`` (Llama's forward)."""

    layer_class = DecoderLayer


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B) -> HunYuanMoEV1ForCausalLM:
    """The program of ``ops.transformers.predict_step``."""
    return HunYuanMoEV1ForCausalLM(cfg, seq, setup, batch)


def fp32_kept_parameters(cfg: ModelConfig) -> int:
    """The routers' ``wg`` (E, d) of every layer: made fp32 in a 16-bit model (``HunYuanMoEV1Gate.__init__``)."""
    return cfg.num_experts * cfg.d_model * cfg.num_layers


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    return moe.unsupported(cfg, setup)
