"""``GraniteForCausalLM`` (transformers 5.24 ``models/granite/modeling_granite.py``): Llama's program with its four
constant multipliers, three of them an elementwise op each (the values change no byte; a multiplier of 1.0 still
runs its op):

1. ``inputs_embeds * embedding_multiplier`` (:388): the lookup dies at once (a scalar product saves nothing), the
   product is the model's ``inputs_embeds``;
2. ``residual + hidden_states * residual_multiplier`` (:275, :280), after the attention and after the MLP;
3. ``logits / logits_scaling`` (:489): the head's output dies at once, the quotient is the logits.

``attention_multiplier`` replaces the attention's 1/√d_head (:124): a scalar, no op of its own.

HyperCLOVA X (``models/hyperclovax/modeling_hyperclovax.py``, ``HyperCLOVAXForCausalLM``) is Granite's with, when
``use_post_norm`` (its default; ``norm_placement`` "sandwich"), an RMSNorm after each sub-block before the
scaled residual add (``post_norm1``, ``post_norm2``: "Peri-LN", :275-281, :326, :333; registered after the two
norms), and its logits multiplied by ``logits_scaling`` (:496), not divided.  No torch.
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..engine import Affine
from ..tensors import Tensor
from . import llama
from .llama import B

SCALE = 1.0  # the multipliers' values: bytes do not depend on them (a Python number, wrapped where the run wraps)


class DecoderLayer(llama.DecoderLayer):
    """``GraniteDecoderLayer`` (:218-282) and ``HyperCLOVAXDecoderLayer`` (its post-norms)."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str, norm=llama.RMSNorm):
        super().__init__(cfg, dtype, attn, name, norm)
        peri = cfg.norm_placement == "sandwich"  # HyperCLOVA X's use_post_norm (else nn.Identity: no op)
        self.post_norm1 = norm(cfg.d_model, dtype, name + ".post_norm1") if peri else None
        self.post_norm2 = norm(cfg.d_model, dtype, name + ".post_norm2") if peri else None

    def params(self) -> list[Tensor]:
        return super().params() + ([self.post_norm1.weight, self.post_norm2.weight] if self.post_norm1 else [])

    def forward(
        self, hidden_states: Tensor, attention_mask=None, position_embeddings=None, position_ids=None
    ) -> Tensor:
        residual = hidden_states  # :262
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states, position_embeddings, attention_mask)
        if self.post_norm1 is not None:  # HyperCLOVA X :326
            hidden_states = self.post_norm1(hidden_states)
        hidden_states = A.add(residual, A.mul(hidden_states, SCALE))  # :275
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        if self.post_norm2 is not None:  # HyperCLOVA X :333
            hidden_states = self.post_norm2(hidden_states)
        return A.add(residual, A.mul(hidden_states, SCALE))  # :280


class GraniteForCausalLM(llama.LlamaForCausalLM):
    def decoder_layer(self, name: str, norm) -> DecoderLayer:
        return DecoderLayer(self.cfg, self.dtype, self.setup.attention, name, norm)

    def embed(self) -> Tensor:
        return A.mul(super().embed(), SCALE)  # :388

    def head(self, logits: Tensor) -> Tensor:
        if self.cfg.hf_model_type == "hyperclovax":  # modeling_hyperclovax.py:496
            return A.mul(logits, SCALE)
        return A.div(logits, SCALE)  # :489


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B) -> GraniteForCausalLM:
    """The program of ``ops.transformers.predict_step``."""
    return GraniteForCausalLM(cfg, seq, setup, batch)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """Llama's (``llama.unsupported``); HyperCLOVA X's post-norms (``norm_placement`` "sandwich") are modelled."""
    if cfg.hf_model_type == "hyperclovax" and cfg.norm_placement == "sandwich":
        return [r for r in llama.unsupported(cfg, setup) if "norm, MLP" not in r]
    return llama.unsupported(cfg, setup)
