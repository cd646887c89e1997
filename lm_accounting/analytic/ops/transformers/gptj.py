"""transformers 5.24's ``GPTJForCausalLM`` training step, transliterated (``models/gptj/modeling_gptj.py``).

The masks, the sdpa interface and the loss are Llama's (``llama.py``), the LayerNorm and ``gelu_new`` GPT-2's
(``gpt2.py``).  What GPT-J does differently:

* its rotary table is a buffer, ``embed_positions`` (:52-65): n_positions × rotary_dim in fp32 (sin then cos),
  sized by the config's context (``n_positions``; the model analysed is built for the context it runs at,
  ``analytic.sizes.at_context``), indexed by the positions (``aten.index``), cast to the model's dtype and split;
* RoPE on the first ``rotary_dim`` of each head before the heads are transposed (:144-156): per call the sin and
  cos ``repeat_interleave``d (unsqueeze, expand, a contiguous copy), ``rotate_every_two`` over interleaved pairs
  (strided slices, ``stack``, ``flatten``), k before q, each concatenated with its pass-through part;
* its eager attention (:80-101): q and k cast to fp32 first (``.to(torch.float32)``), the softmax in fp32, cast to
  v's dtype;
* q/k/v and ``out_proj`` without biases, registered k, v, q, out (:124-127); the MLP ``fc_in``, the activation,
  ``fc_out`` with biases; the block ``attn(ln_1(x)) + mlp(ln_1(x)) + x`` (:226-239); the LM head with a bias.
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..aten_activation import gelu
from ..aten_index import index, stack, strided_slice
from ..aten_split import split
from ..engine import Affine
from ..tensors import Tensor, empty
from .gpt2 import LayerNorm, gelu_new
from .layernorm_lm import LayerNormCausalLM
from .llama import (
    B,
    GradientCheckpointingLayer,
    Linear,
    sdpa_attention_forward,
)

ACTIVATIONS = {"gelu_new": gelu_new, "gelu": gelu, "gelu_pytorch_tanh": gelu}
"""``activation_function`` -> its ops (``activations.py``: ``NewGELUActivation``; one ``F.gelu``)."""


def repeat_interleave_last(t: Tensor) -> Tensor:
    """``torch.repeat_interleave(t[:, :, None, :], 2, 3)`` (:75-76): the int-repeats path, ``unsqueeze``,
    ``expand``, a contiguous ``clone``, ``flatten``."""
    t = A.unsqueeze(t, 2)
    *lead, n = t.shape
    return A.view(A.clone(A.expand(A.unsqueeze(t, -1), *lead, n, 2), contiguous=True), *lead, 2 * n)


def rotate_every_two(x: Tensor) -> Tensor:
    """modeling_gptj.py:67-71."""
    x1 = strided_slice(x, 0, 2)
    x2 = strided_slice(x, 1, 2)
    x = stack((A.neg(x2), x1), -1)
    return A.view(x, *x.shape[:-2], 2 * x.shape[-2])  # flatten(-2): a view of the stack


def apply_rotary_pos_emb(tensor: Tensor, sin: Tensor, cos: Tensor) -> Tensor:
    """modeling_gptj.py:74-77."""
    sin = repeat_interleave_last(sin)
    cos = repeat_interleave_last(cos)
    return A.add(A.mul(tensor, cos), A.mul(rotate_every_two(tensor), sin))


def eager_attention_forward(module: Attention, query, key, value, attention_mask) -> tuple[Tensor, Tensor]:
    """modeling_gptj.py:80-101 (dropout 0 returns its input)."""
    attn_weights = A.mul(A.matmul(A.to(query, "fp32"), A.transpose(A.to(key, "fp32"), 2, 3)), module.scaling)
    if attention_mask is not None:
        attn_weights = A.add(attn_weights, attention_mask)
    attn_weights = A.to(A.softmax(attn_weights, -1), value.dtype)
    attn_output = A.matmul(attn_weights, value)
    return A.contiguous(A.transpose(attn_output, 1, 2)), attn_weights


class Attention:
    """``GPTJAttention`` (modeling_gptj.py:104-186)."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str):
        d, hd = cfg.d_model, cfg.d_head
        self.head_dim, self.groups, self.scaling, self.attn = hd, 1, hd**-0.5, attn
        self.rotary_dim = cfg.rope_dim
        self.k_proj = Linear(d, d, False, dtype, name + ".k_proj")
        self.v_proj = Linear(d, d, False, dtype, name + ".v_proj")
        self.q_proj = Linear(d, d, False, dtype, name + ".q_proj")
        self.out_proj = Linear(d, d, False, dtype, name + ".out_proj")

    def params(self) -> list[Tensor]:
        return self.k_proj.params() + self.v_proj.params() + self.q_proj.params() + self.out_proj.params()

    def part(self, t: Tensor) -> tuple[Tensor, Tensor]:
        """``t[:, :, :, :rotary_dim]`` (``t`` itself when it spans the head) and ``t[:, :, :, rotary_dim:]``."""
        r = self.rotary_dim
        rot = A.view(t, *t.shape) if r == t.shape[-1] else A.slice_(t, -1, 0, r)
        return rot, A.slice_(t, -1, r, t.shape[-1])

    def __call__(self, hidden_states: Tensor, position_embeddings, attention_mask) -> tuple[Tensor, Tensor | None]:
        input_shape = hidden_states.shape[:-1]  # :138
        hidden_shape = (*input_shape, -1, self.head_dim)
        query = A.view(self.q_proj(hidden_states), *hidden_shape)  # :141-143
        key = A.view(self.k_proj(hidden_states), *hidden_shape)
        value = A.transpose(A.view(self.v_proj(hidden_states), *hidden_shape), 1, 2)
        sin, cos = position_embeddings  # :145
        # the locals live until the forward returns (a checkpointed block's first forward frees nothing else)
        k_rot, k_pass = self.part(key)  # :147-148
        q_rot, q_pass = self.part(query)  # :150-151
        k_rot = apply_rotary_pos_emb(k_rot, sin, cos)  # :153
        q_rot = apply_rotary_pos_emb(q_rot, sin, cos)  # :154
        key = A.cat((k_rot, k_pass), -1)  # :156
        query = A.cat((q_rot, q_pass), -1)  # :157
        query = A.transpose(query, 1, 2)  # :162-163
        key = A.transpose(key, 1, 2)
        interface = eager_attention_forward if self.attn == "naive" else sdpa_attention_forward
        attn_output, attn_weights = interface(self, query, key, value, attention_mask)  # :172-181
        attn_output = A.contiguous(A.reshape(attn_output, *input_shape, -1))  # :183
        return self.out_proj(attn_output), attn_weights  # :184-186 (resid_dropout: p = 0)


class MLP:
    """``GPTJMLP`` (modeling_gptj.py:190-204)."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.act = ACTIVATIONS[cfg.hf_activation or "gelu_new"]
        self.fc_in = Linear(cfg.d_model, cfg.d_ff, True, dtype, name + ".fc_in")
        self.fc_out = Linear(cfg.d_ff, cfg.d_model, True, dtype, name + ".fc_out")

    def params(self) -> list[Tensor]:
        return self.fc_in.params() + self.fc_out.params()

    def __call__(self, hidden_states: Tensor) -> Tensor:
        return self.fc_out(self.act(self.fc_in(hidden_states)))  # :199-203 (dropout: p = 0)


class Block(GradientCheckpointingLayer):
    """``GPTJBlock`` (modeling_gptj.py:207-239)."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, device: str, name: str):
        self.ln_1 = LayerNorm(cfg.d_model, dtype, device, name + ".ln_1")
        self.attn = Attention(cfg, dtype, attn, name + ".attn")
        self.mlp = MLP(cfg, dtype, name + ".mlp")

    def params(self) -> list[Tensor]:
        return self.ln_1.params() + self.attn.params() + self.mlp.params()

    def forward(
        self, hidden_states: Tensor, attention_mask=None, position_embeddings=None, position_ids=None
    ) -> Tensor:
        residual = hidden_states  # :227
        hidden_states = self.ln_1(hidden_states)  # :228
        # :229-237; ``_`` keeps eager's probabilities until the block returns
        attn_output, _ = self.attn(hidden_states, position_embeddings, attention_mask)
        feed_forward_hidden_states = self.mlp(hidden_states)  # :238
        return A.add(A.add(attn_output, feed_forward_hidden_states), residual)  # :239


class GPTJForCausalLM(LayerNormCausalLM):
    """``GPTJForCausalLM`` with ``GPTJModel`` (modeling_gptj.py:266-430), labels given: the shared skeleton
    (``layernorm_lm``; :294-358, :395-430) with GPT-J's blocks, ``wte``, ``h``, ``ln_f``, its sin/cos table
    (``embed_positions``, a buffer) and the head's bias (:418)."""

    layer_class = Block
    names = ("wte", "h", "ln_f")
    head_bias = True

    def rotary_buffers(self) -> list[Tensor]:
        return [empty((self.cfg.context_length, self.cfg.rope_dim), "fp32", "embed_positions")]

    def rotary(self, x: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        """``GPTJRotaryEmbedding.forward`` (:61-64): (sin, cos), two views of one gathered, cast table."""
        sincos = A.to(index(self.buffers[0], position_ids), x.dtype)
        sin, cos = split(sincos, sincos.shape[-1] // 2, -1)
        return sin, cos


def causal_lm(
    cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B, device: str = "meta"
) -> GPTJForCausalLM:
    """The program of ``ops.transformers.predict_step`` on target ``device`` ("meta" or "cpu"; LayerNorm's
    statistics differ)."""
    return GPTJForCausalLM(cfg, seq, setup, batch, device)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = []
    if setup.checkpoint == "selective":
        out.append("transformers has no selective activation checkpointing")
    if cfg.norm != "layernorm" or cfg.mlp != "gelu" or cfg.parallel_block != "one_norm" or cfg.moe or cfg.qk_norm:
        out.append("a gptj model with another norm, MLP, block, experts or q/k norms")
    if cfg.kv_heads != cfg.num_heads or cfg.qkv_bias or cfg.output_bias or not cfg.mlp_bias:
        out.append("a gptj model with grouped-query attention or other biases")
    if (cfg.hf_activation or "gelu_new") not in ACTIVATIONS:
        out.append(f"activation_function {cfg.hf_activation} (its ops are not transliterated)")
    return out
