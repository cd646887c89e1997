"""transformers 5.24's ``GPT2LMHeadModel`` training step, transliterated.

Each function follows one forward of ``transformers/models/gpt2/modeling_gpt2.py`` (line numbers of
transformers 5.24) on symbolic tensors, so torch's autograd engine (``ops.tensors``) frees what the real model
frees.  The run is the one ``measure.hf`` measures (``llama.py``'s docstring): ``use_cache=False``, the loss
from the model, no ``attention_mask``.  What GPT-2 does differently from Llama:

* ``Conv1D`` (``pytorch_utils.py``:95-121): ``torch.addmm(bias, x.view(-1, nx), weight)`` with the weight
  stored (in, out), then a view;
* ``nn.LayerNorm`` with a bias (``native_layer_norm``: the output and fp32 ``mean``/``rstd``);
* learned positions (``wpe``) added to the token embeddings, both held until ``GPT2Model.forward`` returns;
* dropout in training: ``embd_pdrop``, ``attn_pdrop`` and ``resid_pdrop`` (0.1 each, ``GPT2Config``'s
  defaults; ``hf_config.to_hf_dict`` writes none): on cpu and meta a noise tensor per use (``aten_activation``);
* ``gelu_new`` (``activations.py`` ``NewGELUActivation``): eight elementwise ops, four of their tensors saved;
* its own eager attention (softmax in the model dtype, then ``attn_dropout``), and sdpa with ``dropout_p``
  = ``attn_pdrop``, which makes torch run the math path on cpu and meta (``aten_sdpa_math``);
* the fused ``c_attn`` split into q, k, v (one ``SplitBackward0``: its backward ``cat``s the three gradients).
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from .. import cuda
from ..aten_activation import dropout, tanh
from ..aten_layer_norm import layer_norm
from ..aten_sdpa_math import sdpa_math
from ..aten_split import split
from ..engine import Affine
from ..tensors import Tensor, empty, no_grad, parameter
from .llama import (
    DTYPES,
    B,
    GradientCheckpointingLayer,
    LlamaForCausalLM,
    arange_plus,
    eager_mask,
    find_packed_sequence_indices,
    head_and_loss,
)

PDROP = 0.1
"""``GPT2Config``'s ``resid_pdrop``, ``embd_pdrop`` and ``attn_pdrop`` (configuration_gpt2.py:84-86)."""

SQRT_2_OVER_PI = 0.7978845608028654


class LayerNorm:
    """``nn.LayerNorm(d)``: weight and bias."""

    def __init__(self, size: int, dtype: str, device: str, name: str):
        self.device = device
        self.weight = parameter((size,), dtype, name + ".weight")
        self.bias = parameter((size,), dtype, name + ".bias")

    def params(self) -> list[Tensor]:
        return [self.weight, self.bias]

    def __call__(self, x: Tensor) -> Tensor:
        return layer_norm(x, self.weight, self.bias, device=self.device)


class Conv1D:
    """``transformers.pytorch_utils.Conv1D(nf, nx)``: weight (nx, nf), bias (nf,)."""

    def __init__(self, nf: int, nx: int, dtype: str, name: str):
        self.nf = nf
        self.weight = parameter((nx, nf), dtype, name + ".weight")
        self.bias = parameter((nf,), dtype, name + ".bias")

    def params(self) -> list[Tensor]:
        return [self.weight, self.bias]

    def __call__(self, x: Tensor) -> Tensor:
        size_out = x.shape[:-1] + (self.nf,)  # pytorch_utils.py:118
        x = A.addmm(self.bias, A.view(x, -1, x.shape[-1]), self.weight)  # :119
        return A.view(x, *size_out)  # :120


def gelu_new(x: Tensor) -> Tensor:
    """``NewGELUActivation.forward`` (activations.py:66):
    ``0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))``,
    evaluated left to right as Python does."""
    return A.mul(A.mul(x, 0.5), A.add(tanh(A.mul(A.add(x, A.mul(A.pow_(x, 3.0), 0.044715)), SQRT_2_OVER_PI)), 1.0))


def eager_attention_forward(module: Attention, query, key, value, attention_mask) -> tuple[Tensor, Tensor]:
    """modeling_gpt2.py:54-73: the softmax in the weights' dtype (fp32 under autocast), then dropout."""
    attn_weights = A.mul(A.matmul(query, A.transpose(key, -1, -2)), module.scaling)  # :59
    if attention_mask is not None:
        attn_weights = A.add(attn_weights, attention_mask)  # :62
    attn_weights = A.softmax(attn_weights, -1)  # :64
    attn_weights = A.to(attn_weights, value.dtype)  # :67 (a copy where autocast made the softmax fp32)
    attn_weights = dropout(attn_weights, module.pdrop, device=module.device)  # :68
    attn_output = A.matmul(attn_weights, value)  # :70
    attn_output = A.transpose(attn_output, 1, 2)  # :71
    return attn_output, attn_weights


def sdpa_attention_forward(module: Attention, query, key, value, attention_mask) -> tuple[Tensor, None]:
    """``integrations/sdpa_attention.py`` ``sdpa_attention_forward``: no mask (is_causal), dropout_p =
    attn_pdrop; ``attn_output.reshape(...)`` is the tensor itself, then transposed and made contiguous."""
    if module.device == "cuda":  # the fused kernels draw dropout's mask inside: cuDNN (16-bit) or memory-efficient
        query, key, value = A.lower(query, key, value)
        attn_output = cuda.scaled_dot_product_attention(query, key, value, pinned=False)(query, key, value)[0]
    else:
        attn_output = sdpa_math(query, key, value, causal=True, dropout_p=module.pdrop, device=module.device)
    return A.contiguous(A.transpose(attn_output, 1, 2)), None


class Attention:
    """``GPT2Attention`` (modeling_gpt2.py:76-228), self-attention only."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, device: str, name: str):
        d = cfg.d_model
        self.embed_dim, self.head_dim, self.scaling = d, d // cfg.num_heads, (d // cfg.num_heads) ** -0.5
        self.attn, self.device, self.pdrop = attn, device, PDROP
        self.c_attn = Conv1D(3 * d, d, dtype, name + ".c_attn")
        self.c_proj = Conv1D(d, d, dtype, name + ".c_proj")

    def params(self) -> list[Tensor]:
        return self.c_attn.params() + self.c_proj.params()

    def __call__(self, hidden_states: Tensor, attention_mask) -> tuple[Tensor, Tensor | None]:
        """The output and the attention weights (eager; None for sdpa): the caller's ``_`` holds them."""
        query_states, key_states, value_states = split(self.c_attn(hidden_states), self.embed_dim, 2)  # :187
        shape_kv = (*key_states.shape[:-1], -1, self.head_dim)  # :188
        key_states = A.transpose(A.view(key_states, *shape_kv), 1, 2)  # :189
        value_states = A.transpose(A.view(value_states, *shape_kv), 1, 2)  # :190
        shape_q = (*query_states.shape[:-1], -1, self.head_dim)  # :192
        query_states = A.transpose(A.view(query_states, *shape_q), 1, 2)  # :193
        interface = eager_attention_forward if self.attn == "naive" else sdpa_attention_forward
        attn_output, attn_weights = interface(self, query_states, key_states, value_states, attention_mask)  # :213-222
        attn_output = A.contiguous(A.reshape(attn_output, *attn_output.shape[:-2], -1))  # :224
        attn_output = self.c_proj(attn_output)  # :225
        attn_output = dropout(attn_output, self.pdrop, device=self.device)  # :226 resid_dropout
        return attn_output, attn_weights  # the locals above die here


class MLP:
    """``GPT2MLP`` (modeling_gpt2.py:231-245) with ``gelu_new``."""

    def __init__(self, cfg: ModelConfig, dtype: str, device: str, name: str):
        self.device = device
        self.c_fc = Conv1D(cfg.d_ff, cfg.d_model, dtype, name + ".c_fc")
        self.c_proj = Conv1D(cfg.d_model, cfg.d_ff, dtype, name + ".c_proj")

    def params(self) -> list[Tensor]:
        return self.c_fc.params() + self.c_proj.params()

    def __call__(self, hidden_states: Tensor) -> Tensor:
        hidden_states = self.c_fc(hidden_states)  # :241
        hidden_states = gelu_new(hidden_states)  # :242
        hidden_states = self.c_proj(hidden_states)  # :243
        return dropout(hidden_states, PDROP, device=self.device)  # :244


class Block(GradientCheckpointingLayer):
    """``GPT2Block`` (modeling_gpt2.py:248-312)."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, device: str, name: str):
        self.ln_1 = LayerNorm(cfg.d_model, dtype, device, name + ".ln_1")
        self.attn = Attention(cfg, dtype, attn, device, name + ".attn")
        self.ln_2 = LayerNorm(cfg.d_model, dtype, device, name + ".ln_2")
        self.mlp = MLP(cfg, dtype, device, name + ".mlp")

    def params(self) -> list[Tensor]:
        return self.ln_1.params() + self.attn.params() + self.ln_2.params() + self.mlp.params()

    def forward(self, hidden_states: Tensor, attention_mask=None) -> Tensor:
        residual = hidden_states  # :275
        hidden_states = self.ln_1(hidden_states)  # :276
        attn_output, _ = self.attn(hidden_states, attention_mask)  # :277-283
        hidden_states = A.add(attn_output, residual)  # :285
        residual = hidden_states  # :306
        hidden_states = self.ln_2(hidden_states)  # :307
        feed_forward_hidden_states = self.mlp(hidden_states)  # :308
        return A.add(residual, feed_forward_hidden_states)  # :310


class GPT2LMHeadModel(LlamaForCausalLM):
    """``GPT2LMHeadModel`` with ``GPT2Model`` (modeling_gpt2.py:485-725), labels given: one training step's
    forward and loss (``loss()``, Llama's: the step's wrapper), its parameters in ``model.parameters()`` order
    and its inputs; ``block_class``: a model's own block (GPTBigCode's)."""

    block_class = Block

    def __init__(
        self,
        cfg: ModelConfig,
        seq: int,
        setup: TrainingSetup,
        batch: Affine | int = B,
        device: str = "meta",
    ):
        dtype = DTYPES[setup.precision]
        self.cfg, self.seq, self.batch, self.setup, self.dtype, self.device = cfg, seq, batch, setup, dtype, device
        self.wte = parameter((cfg.vocab_size, cfg.d_model), dtype, "wte.weight")
        self.wpe = parameter((cfg.position_rows, cfg.d_model), dtype, "wpe.weight")
        self.h = [self.block_class(cfg, dtype, setup.attention, device, f"h.{i}") for i in range(cfg.num_layers)]
        for block in self.h:
            block.gradient_checkpointing = setup.checkpoint == "full"
        self.ln_f = LayerNorm(cfg.d_model, dtype, device, "ln_f")
        self.lm_head = None if cfg.tie_embeddings else parameter((cfg.vocab_size, cfg.d_model), dtype, "lm_head.weight")
        self.input_ids = empty((batch, seq), "int64", "input_ids")
        self.labels = empty((batch, seq), "int64", "labels")

    def parameters(self) -> list[Tensor]:
        out = [self.wte, self.wpe]
        for block in self.h:
            out += block.params()
        out += self.ln_f.params()
        return out + ([self.lm_head] if self.lm_head is not None else [])

    def transformer(self) -> Tensor:
        """``GPT2Model.forward`` (modeling_gpt2.py:514-627)."""
        input_ids = A.view(self.input_ids, -1, self.seq)  # :549
        inputs_embeds = A.embedding(self.wte, input_ids)  # :569
        position_ids = A.unsqueeze(arange_plus(self.seq), 0)  # :572-574
        position_embeds = A.embedding(self.wpe, position_ids)  # :576
        hidden_states = A.add(inputs_embeds, position_embeds)  # :577
        with no_grad():
            find_packed_sequence_indices(A.expand(position_ids, self.batch, -1))
        causal_mask = None
        if self.setup.attention == "naive":  # :583-589; sdpa without padding skips the mask (is_causal)
            causal_mask = eager_mask(self.batch, self.seq, self.dtype, None)
        hidden_states = dropout(hidden_states, PDROP, device=self.device)  # :603
        for block in self.h:  # :607-617
            hidden_states = block(hidden_states, attention_mask=causal_mask)
        hidden_states = self.ln_f(hidden_states)  # :619
        return A.view(hidden_states, -1, self.seq, hidden_states.shape[-1])  # :621

    def forward(self) -> tuple[Tensor, Tensor]:
        """``GPT2LMHeadModel.forward`` (:650-712) with ``ForCausalLMLoss``: (logits, loss), the output the step
        keeps (``LlamaForCausalLM.loss`` runs it, under autocast for amp-bf16)."""
        head = self.lm_head if self.lm_head is not None else self.wte
        return head_and_loss(self.transformer(), head, self.labels, self.cfg.vocab_size)


def causal_lm(
    cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B, device: str = "meta"
) -> GPT2LMHeadModel:
    """The program of ``ops.transformers.predict_step`` on target ``device`` ("meta" or "cpu"; LayerNorm's
    statistics differ)."""
    return GPT2LMHeadModel(cfg, seq, setup, batch, device)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = []
    if setup.checkpoint == "selective":
        out.append("transformers has no selective activation checkpointing")
    if cfg.norm != "layernorm" or cfg.mlp != "gelu" or cfg.positions != "learned" or cfg.norm_placement != "pre":
        out.append("a gpt2 model with another norm, MLP, positions or norm placement")
    if not (cfg.qkv_bias and cfg.output_bias and cfg.mlp_bias):
        out.append("a gpt2 model without biases (transformers' Conv1D always has one)")
    if cfg.kv_heads != cfg.num_heads or cfg.d_head * cfg.num_heads != cfg.d_model or cfg.moe:
        out.append("a gpt2 model with grouped-query attention, a head size other than d_model / heads, or experts")
    return out
