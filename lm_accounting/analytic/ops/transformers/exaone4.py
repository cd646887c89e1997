"""transformers 5.24's ``Exaone4ForCausalLM`` training step, transliterated (``models/exaone4/modeling_exaone4.py``).

The model, its norm (``Exaone4RMSNorm`` is Llama's), rotary table, MLP and loss are Llama's (``llama.py``), the
layer OLMo-2's (``olmo2.DecoderLayer.forward``: post-norms after each sub-block, no pre-norm).  What EXAONE 4 does
differently:

* per-head q/k RMSNorms on the transposed (B, h, S, d) states once q, k and v are made (:224-230,
  ``llama.Attention.norm_at`` "heads");
* with a window (``sliding_window`` set), its full-attention layers skip RoPE (:233-235, "global NoPE":
  ``ModelConfig.nope_layers``, read by ``hf_config``);
* the masks (:393-397): the full one every forward, the sliding one beside it when some layer is windowed, each
  layer taking its type's (:402-406).
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from ..tensors import Tensor
from . import llama, olmo2
from .llama import MLP, B, LlamaForCausalLM, RMSNorm, windowed_masks


class Attention(llama.Attention):
    """``Exaone4Attention`` (modeling_exaone4.py:186-258): Llama's with its q/k norms on the transposed states."""

    norm_at = "heads"


class DecoderLayer(olmo2.DecoderLayer):
    """``Exaone4DecoderLayer`` (modeling_exaone4.py:277-316): OLMo-2's forward with EXAONE 4's modules."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str):
        self.self_attn = Attention(cfg, dtype, attn, name + ".self_attn")
        self.mlp = MLP(cfg, dtype, name + ".mlp")
        self.post_attention_layernorm = RMSNorm(cfg.d_model, dtype, name + ".post_attention_layernorm")
        self.post_feedforward_layernorm = RMSNorm(cfg.d_model, dtype, name + ".post_feedforward_layernorm")


class Exaone4ForCausalLM(LlamaForCausalLM):
    """``Exaone4ForCausalLM`` with ``Exaone4Model`` (modeling_exaone4.py:338-460): Llama's model with EXAONE 4's
    layers and masks."""

    def decoder_layer(self, name: str, norm) -> DecoderLayer:
        return DecoderLayer(self.cfg, self.dtype, self.setup.attention, name)

    def masks(self) -> dict[bool, Tensor | None]:
        windowed = self.cfg.windowed_layers > 0  # "sliding_attention" in layer_types (:396)
        masks = windowed_masks(
            self.batch, self.seq, self.dtype, self.setup.attention, self.cfg.sliding_window, windowed
        )
        return masks if windowed else dict.fromkeys((False, True), masks[False])


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch=B) -> Exaone4ForCausalLM:
    """The program of ``ops.transformers.predict_step`` (the same on a meta and a cpu target)."""
    return Exaone4ForCausalLM(cfg, seq, setup, batch)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = [r for r in llama.unsupported(cfg, setup) if "norm, MLP" not in r]
    if cfg.norm != "rmsnorm" or cfg.norm_placement != "post" or cfg.mlp != "swiglu" or cfg.positions != "rope":
        out.append("an exaone4 model with another norm, norm placement, MLP or positions")
    if not cfg.qk_norm or cfg.qk_norm_scope != "head":
        out.append("an exaone4 model without per-head q/k norms")
    if cfg.qkv_bias or cfg.output_bias or cfg.mlp_bias:
        out.append("an exaone4 model with biases")
    return out
