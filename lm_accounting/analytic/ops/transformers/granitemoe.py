"""transformers 5.24's ``GraniteMoeForCausalLM`` and ``GraniteMoeSharedForCausalLM`` training steps, transliterated
(``models/granitemoe/modeling_granitemoe.py``, ``models/granitemoeshared/modeling_granitemoeshared.py``: the same
router, experts, attention and model, line for line).

Granite's program (``granite.py``: the residual multiplier's two products per layer, the logits divided by
``logits_scaling``, ``attention_multiplier`` a scalar) with a mixture of experts in every layer.  What Granite-MoE
does differently:

* ``GraniteMoeTopKRouter.forward`` (:127-131): ``F.linear`` to E logits, ``.float()`` (a copy in 16-bit), ``topk``
  of the logits (not of probabilities), a softmax over the k values only, ``type_as(hidden_states)``; the block
  (``GraniteMoeMoE``, :175-190: ``router``, then ``experts``) keeps the fp32 logits until it returns;
* the experts are ``GraniteMoeExperts`` under ``grouped_mm`` (``@use_experts_implementation``: ``moe.Experts``);
* the layer registers its two norms before ``block_sparse_moe`` (:331-339), which orders ``model.parameters()``;
* ``GraniteMoeModel.forward`` (:440-447) multiplies the embeddings by ``embedding_multiplier`` after the causal
  mask is made (Granite before it): ``llama.LlamaForCausalLM.scale_embeddings``;
* GraniteMoeShared (``shared_intermediate_size`` > 0) adds ``shared_mlp`` (``GraniteMoeSharedMLP``, :70-94: a fused
  ``input_linear`` to 2·F, ``chunk``, SiLU of the first half times the second, ``output_linear``) to the experts'
  output, ungated (``GraniteMoeSharedDecoderLayer.forward``, :346-385).
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..aten_index import split_with_sizes, topk
from ..engine import Affine
from ..tensors import Tensor, parameter
from . import granite, moe
from .llama import B, Linear


class TopKRouter:
    """``GraniteMoeTopKRouter`` (:113-131): the weight (E, d)."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.weight = parameter((cfg.num_experts, cfg.d_model), dtype, name + ".weight")
        self.top_k = cfg.experts_per_token

    def __call__(self, hidden_states: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        router_logits = A.to(A.linear(hidden_states, self.weight), "fp32")  # :128 (num_tokens, num_experts)
        top_k_logits, top_k_index = topk(router_logits, self.top_k)  # :129
        top_k_weights = A.to(A.softmax(top_k_logits, -1), hidden_states.dtype)  # :130
        return router_logits, top_k_weights, top_k_index


class MoE:
    """``GraniteMoeMoE`` (:175-190): ``router`` registered before ``experts``."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.router = TopKRouter(cfg, dtype, name + ".router")
        self.experts = moe.Experts(cfg, dtype, name + ".experts")

    def params(self) -> list[Tensor]:
        return [self.router.weight] + self.experts.params()

    def __call__(self, layer_input: Tensor) -> Tensor:
        bsz, length, emb_size = layer_input.shape  # :185
        hidden_states = A.reshape(layer_input, -1, emb_size)
        _, top_k_weights, top_k_index = self.router(hidden_states)
        layer_output = self.experts(hidden_states, top_k_index, top_k_weights)
        return A.view(layer_output, bsz, length, emb_size)  # :190


class SharedMLP:
    """``GraniteMoeSharedMLP`` (modeling_granitemoeshared.py:70-94) of width ``cfg.shared_width``."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.width = cfg.shared_width
        self.input_linear = Linear(cfg.d_model, 2 * self.width, False, dtype, name + ".input_linear")
        self.output_linear = Linear(self.width, cfg.d_model, False, dtype, name + ".output_linear")

    def params(self) -> list[Tensor]:
        return self.input_linear.params() + self.output_linear.params()

    def __call__(self, hidden_states: Tensor) -> Tensor:
        hidden_states = self.input_linear(hidden_states)  # :89
        chunked_hidden_states = split_with_sizes(hidden_states, [self.width] * 2, -1)  # :90 chunk(2, dim=-1)
        hidden_states = A.mul(A.silu(chunked_hidden_states[0]), chunked_hidden_states[1])  # :91
        return self.output_linear(hidden_states)  # :92


class DecoderLayer(granite.DecoderLayer):
    """``GraniteMoeDecoderLayer`` (:331-365): Granite's layer with ``block_sparse_moe`` (held as ``mlp``), the norms
    registered first; GraniteMoeShared's ``shared_mlp`` last."""

    mlp_class = MoE

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str, norm):
        super().__init__(cfg, dtype, attn, name, norm)
        self.shared_mlp = SharedMLP(cfg, dtype, name + ".shared_mlp") if cfg.shared_experts else None

    def params(self) -> list[Tensor]:
        norms = [self.input_layernorm.weight, self.post_attention_layernorm.weight]
        shared = self.shared_mlp.params() if self.shared_mlp is not None else []
        return self.self_attn.params() + norms + self.mlp.params() + shared

    def forward(
        self, hidden_states: Tensor, attention_mask=None, position_embeddings=None, position_ids=None
    ) -> Tensor:
        if self.shared_mlp is None:  # GraniteMoeDecoderLayer.forward = Granite's
            return super().forward(hidden_states, attention_mask, position_embeddings, position_ids)
        # GraniteMoeSharedDecoderLayer.forward (modeling_granitemoeshared.py:346-385)
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states, position_embeddings, attention_mask)
        hidden_states = A.add(residual, A.mul(hidden_states, granite.SCALE))  # :373
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        moe_hidden_states = self.mlp(hidden_states)  # :377; a local until the layer returns
        hidden_states = A.add(moe_hidden_states, self.shared_mlp(hidden_states))  # :382
        return A.add(residual, A.mul(hidden_states, granite.SCALE))  # :383


class GraniteMoeForCausalLM(granite.GraniteForCausalLM):
    """``GraniteMoeForCausalLM`` / ``GraniteMoeSharedForCausalLM`` without ``output_router_logits``."""

    def decoder_layer(self, name: str, norm) -> DecoderLayer:
        return DecoderLayer(self.cfg, self.dtype, self.setup.attention, name, norm)

    def embed(self) -> Tensor:
        return A.embedding(self.embed_tokens, self.input_ids)  # :433; scaled after the mask

    def scale_embeddings(self, inputs_embeds: Tensor) -> Tensor:
        return A.mul(inputs_embeds, granite.SCALE)  # :447


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B) -> GraniteMoeForCausalLM:
    """The program of ``ops.transformers.predict_step``."""
    return GraniteMoeForCausalLM(cfg, seq, setup, batch)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    return moe.unsupported(cfg, setup)
