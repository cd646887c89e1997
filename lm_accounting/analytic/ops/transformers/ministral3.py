"""transformers 5.24's ``Ministral3ForCausalLM`` training step, transliterated (``models/ministral3/
modeling_ministral3.py``): Mistral's (the ``llama`` program: its model, layer, MLP, one mask over the optional
window, loss) with Llama 4's attention scale on the query.

After RoPE each layer multiplies q by ``get_llama_4_attn_scale(position_ids, beta, original_max)`` cast to q's
dtype (:105-109, :147-151): ``1 + beta * log(1 + floor(position_ids / original_max))`` over the (1, S) positions
(int64 over a Python int: a true division to fp32, then four elementwise ops, each Python number wrapped on a plain
CPU run), viewed (1, 1, S, 1).  The product saves that factor (``MulBackward0``: the scalar's side needs no
gradient).  The values (``rope_parameters``' ``llama_4_scaling_beta``, ``original_max_position_embeddings``)
change no byte.  No torch.
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..tensors import Tensor, empty
from . import llama
from .llama import B, DecoderLayer, LlamaForCausalLM

BETA = 0.1  # the class's llama_4_scaling_beta: bytes do not depend on it


def llama_4_attn_scale(seq: int) -> Tensor:
    """``get_llama_4_attn_scale`` (:105-109) over the (1, S) int64 positions: the (1, 1, S, 1) fp32 factor."""
    wrapped = A.wrap_scalar("int64")  # positions_ids / original_max: true division, int64 to fp32
    quotient = empty((1, seq), "fp32", "div")
    del wrapped
    floored = A.unary(quotient, "floor")
    del quotient
    plus = A.add(floored, 1)  # 1 + floor(...)
    del floored
    logged = A.unary(plus, "log")
    del plus
    scaled = A.mul(logged, BETA)  # beta * log(...)
    del logged
    scaling = A.add(scaled, 1)
    del scaled
    return A.unsqueeze(A.unsqueeze(scaling, 1), 3)  # scaling[:, None, :, None]


class Attention(llama.Attention):
    """``Ministral3Attention`` (modeling_ministral3.py): Llama's with the query scaled after RoPE."""

    def rotate(self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        q, k = super().rotate(q, k, cos, sin)  # :146
        return A.mul(q, A.to(llama_4_attn_scale(q.shape[2]), q.dtype)), k  # :147-151


class Ministral3DecoderLayer(DecoderLayer):
    attention_class = Attention


class Ministral3ForCausalLM(LlamaForCausalLM):
    """``Ministral3ForCausalLM``: Llama's (Mistral's) model with Ministral 3's attention."""

    def decoder_layer(self, name: str, norm) -> DecoderLayer:
        return Ministral3DecoderLayer(self.cfg, self.dtype, self.setup.attention, name, norm)


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch=B) -> Ministral3ForCausalLM:
    """The program of ``ops.transformers.predict_step`` (the same on a meta and a cpu target)."""
    return Ministral3ForCausalLM(cfg, seq, setup, batch)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """Llama's (``llama.unsupported``)."""
    return llama.unsupported(cfg, setup)
