"""transformers 5.24's ``NemotronForCausalLM`` training step, transliterated (``models/nemotron/
modeling_nemotron.py``, line numbers of transformers 5.24).

Llama's program (``llama``: model, masks, rotary table, layer order, attention interfaces, loss) with what
Nemotron does differently:

* ``NemotronLayerNorm1P`` (:62-80) for every norm: ``F.layer_norm(x, (d,), self.weight + 1.0, self.bias)``, the
  ``weight + 1.0`` a new (d,) tensor per call (saved by the norm's backward), with gain and bias;
* RoPE on the first ``rotary_dim`` of each head (:141-169: ``rot_dim = cos.shape[-1]``, q and k sliced, rotated,
  concatenated back: StableLM's ``stablelm.Attention``), the table of that many frequencies;
* the MLP (:172-183): ``up_proj``, the activation (``relu2``: ``F.relu`` then ``torch.square``, both saving the
  ReLU's output; or ReLU, or a GELU), ``down_proj``; biases when ``mlp_bias``, q/k/v/o biases when
  ``attention_bias``.

amp-bf16: ``NemotronLayerNorm1P`` casts its input, ``weight + 1`` and bias to bf16 when ``torch.is_autocast_enabled()``
(CUDA's flag, which ``measure.hf.HFAutocast`` sets while it emulates CUDA's autocast) and runs ``F.layer_norm`` with
autocast off: a bf16 norm.
"""

from __future__ import annotations

from functools import partial

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..aten_activation import relu
from ..aten_layer_norm import layer_norm
from ..aten_scan import square
from ..engine import Affine
from ..tensors import Tensor, autocast_off, current, parameter
from .llama import B, DecoderLayer, Linear, LlamaForCausalLM
from .phi import ACTIVATIONS
from .stablelm import Attention


class LayerNorm1P:
    """``NemotronLayerNorm1P`` (modeling_nemotron.py:62-80): gain and bias, the gain used as ``weight + 1.0``."""

    def __init__(self, size: int, dtype: str, name: str, device: str = "meta"):
        self.device = device
        self.weight = parameter((size,), dtype, name + ".weight")
        self.bias = parameter((size,), dtype, name + ".bias")

    def params(self) -> list[Tensor]:
        return [self.weight, self.bias]

    def __call__(self, x: Tensor) -> Tensor:
        weight = A.add(self.weight, 1.0)  # :77
        amp = current().autocast
        if amp is None:
            return layer_norm(x, weight, self.bias, device=self.device)  # :80
        # :54-59 ``_cast_if_autocast_enabled``: ``autocast_mode._cast`` of the argument tuple, in order (input,
        # weight + 1, bias) -> bf16 copies; the fp32 weight + 1 dies when the call returns (nothing saved it)
        args = A.to(x, amp), A.to(weight, amp), A.to(self.bias, amp)
        del weight
        with autocast_off():  # :79 ``maybe_autocast(enabled=False)``: the layer norm in bf16
            return layer_norm(*args, device=self.device)


def relu2(x: Tensor) -> Tensor:
    """``ReLUSquaredActivation`` (activations.py:206-214): ``torch.square(F.relu(x))``, both saving the ReLU's output;
    ``square`` is ``pow`` below CUDA's autocast key, not above it (``aten_scan.square``)."""
    return square(relu(x))


class MLP:
    """``NemotronMLP`` (modeling_nemotron.py:172-183)."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.act = {"relu2": relu2, "relu": relu}.get(cfg.mlp) or ACTIVATIONS[cfg.hf_activation]
        self.up_proj = Linear(cfg.d_model, cfg.d_ff, cfg.mlp_bias, dtype, name + ".up_proj")
        self.down_proj = Linear(cfg.d_ff, cfg.d_model, cfg.mlp_bias, dtype, name + ".down_proj")

    def params(self) -> list[Tensor]:
        return self.up_proj.params() + self.down_proj.params()

    def __call__(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act(self.up_proj(x)))  # :183


class NemotronDecoderLayer(DecoderLayer):
    """``NemotronDecoderLayer`` (modeling_nemotron.py:291-340): Llama's forward with Nemotron's pieces."""

    attention_class = Attention
    mlp_class = MLP

    def params(self) -> list[Tensor]:
        norms = self.input_layernorm.params() + self.post_attention_layernorm.params()
        return self.self_attn.params() + self.mlp.params() + norms


class NemotronForCausalLM(LlamaForCausalLM):
    """``NemotronForCausalLM`` with ``NemotronModel`` (modeling_nemotron.py:363-517): Llama's with Nemotron's layers,
    final ``LayerNorm1P`` and rotary table over the rotated share."""

    def __init__(self, cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B, device="meta"):
        super().__init__(cfg, seq, setup, batch, partial(LayerNorm1P, device=device))

    def decoder_layer(self, name: str, norm) -> NemotronDecoderLayer:
        return NemotronDecoderLayer(self.cfg, self.dtype, self.setup.attention, name, norm)

    def rotary_pairs(self) -> int:
        return self.cfg.rope_dim // 2

    def parameters(self) -> list[Tensor]:
        out = [self.embed_tokens]
        for layer in self.layers:
            out += layer.params()
        out += self.norm.params()
        return out + ([self.lm_head] if self.lm_head is not None else [])


def causal_lm(
    cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B, device: str = "meta"
) -> NemotronForCausalLM:
    """The program of ``ops.transformers.predict_step`` on target ``device`` ("meta" or "cpu"; LayerNorm's
    statistics differ)."""
    return NemotronForCausalLM(cfg, seq, setup, batch, device)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = []
    if setup.checkpoint == "selective":
        out.append("transformers has no selective activation checkpointing")
    if cfg.norm != "layernorm" or cfg.positions != "rope" or cfg.moe or cfg.qk_norm or cfg.sliding_window:
        out.append("a nemotron model with another norm, positions, experts, q/k norms or a window")
    if cfg.mlp not in ("relu2", "relu") and (cfg.mlp != "gelu" or (cfg.hf_activation or "") not in ACTIVATIONS):
        out.append(f"hidden_act {cfg.hf_activation or cfg.mlp} (relu2, relu, {', '.join(ACTIVATIONS)} are)")
    return out
