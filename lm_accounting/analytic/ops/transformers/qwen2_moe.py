"""transformers 5.24's ``Qwen2MoeForCausalLM`` training step, transliterated
(``models/qwen2_moe/modeling_qwen2_moe.py``).

The model, its attention (Qwen2's: q/k/v biases, none on o), its norms and its loss are Llama's (``llama.py``); the
router and the experts are Qwen3-MoE's (``moe.py``: ``Qwen2MoeTopKRouter`` is ``Qwen3MoeTopKRouter``, the
experts run ``grouped_mm``), the layers sparse by ``decoder_sparse_step`` (``moe.MoeDecoderLayer``; dense ones
are ``Qwen2MoeMLP`` of ``intermediate_size``).  What Qwen2-MoE does differently:

* ``Qwen2MoeSparseMoeBlock`` (:332-351) registers ``gate``, ``experts``, ``shared_expert`` (a ``Qwen2MoeMLP`` of
  ``shared_expert_intermediate_size``) and ``shared_expert_gate`` (``nn.Linear(d, 1)``, no bias), and runs the
  shared expert first, then the router and the experts, then ``F.sigmoid(shared_expert_gate(x)) *
  shared_expert_output`` and the sum;
* ``Qwen2MoeModel.forward`` (:475-486) builds both masks every forward, ``create_causal_mask`` and
  ``create_sliding_window_causal_mask`` (the config's ``sliding_window``, 0 without ``use_sliding_window``:
  ``configuration_qwen2_moe.py``:112, a mask no sdpa skip serves), each layer taking its ``layer_types``' one.
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..aten_pointwise import sigmoid
from ..engine import Affine
from ..tensors import Tensor
from . import moe
from .deepseek import MLP
from .llama import B, Linear, windowed_masks


class SparseMoeBlock(moe.SparseMoeBlock):
    """``Qwen2MoeSparseMoeBlock``: Qwen3-MoE's router and experts (router first), the gated shared expert."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        super().__init__(cfg, dtype, name)
        self.shared_expert = MLP(cfg.d_model, cfg.shared_width, dtype, name + ".shared_expert")
        self.shared_expert_gate = Linear(cfg.d_model, 1, False, dtype, name + ".shared_expert_gate")

    def params(self) -> list[Tensor]:
        shared = self.shared_expert.params() + self.shared_expert_gate.params()
        return [self.gate.weight] + self.experts.params() + shared

    def __call__(self, hidden_states: Tensor) -> Tensor:
        batch_size, sequence_length, hidden_dim = hidden_states.shape  # :341
        hidden_states_reshaped = A.view(hidden_states, -1, hidden_dim)
        shared_expert_output = self.shared_expert(hidden_states_reshaped)
        _, routing_weights, selected_experts = self.gate(hidden_states_reshaped)
        expert_output = self.experts(hidden_states_reshaped, selected_experts, routing_weights)
        gate = sigmoid(self.shared_expert_gate(hidden_states_reshaped))  # :347
        shared_expert_output = A.mul(gate, shared_expert_output)
        del gate
        expert_output = A.add(expert_output, shared_expert_output)  # :349
        return A.reshape(expert_output, batch_size, sequence_length, hidden_dim)


class DecoderLayer(moe.MoeDecoderLayer):
    """``Qwen2MoeDecoderLayer`` (:354-399): Llama's layer, Qwen2-MoE's sparse block where the layer has one."""

    sparse_class = SparseMoeBlock


class Qwen2MoeForCausalLM(moe.MoeForCausalLM):
    """``Qwen2MoeForCausalLM`` without ``output_router_logits`` (no auxiliary loss)."""

    layer_class = DecoderLayer

    def masks(self) -> dict[bool, Tensor | None]:
        # the config's window is 0 without use_sliding_window (a window is refused by ``hf_config._qwen_window``)
        return windowed_masks(self.batch, self.seq, self.dtype, self.setup.attention, 0)


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B) -> Qwen2MoeForCausalLM:
    """The program of ``ops.transformers.predict_step``."""
    return Qwen2MoeForCausalLM(cfg, seq, setup, batch)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    return moe.unsupported(cfg, setup)
