"""transformers 5.24's ``GPTBigCodeForCausalLM`` training step, transliterated (``models/gpt_bigcode/
modeling_gpt_bigcode.py``, line numbers of transformers 5.24).

GPT-2's model and block (``gpt2``: learned positions added to the embedding, LayerNorms with biases, dropout
after the embedding, each projection and the attention probabilities) with what GPTBigCode does differently:

* ``nn.Linear`` projections (``c_attn``, ``c_proj``, ``c_fc``), not GPT-2's ``Conv1D``;
* multi-query attention (``multi_query``, default true): ``c_attn`` makes d + 2 head_dim features, unsqueezed
  and split into q, k, v (:201-205), so K and V are one head (B, 1, S, hd); without it one view, transpose and
  split into per-head q, k, v (:206-212);
* Llama's attention interfaces: eager repeats K and V to every head and runs the softmax in fp32 (:90-113), sdpa
  passes ``enable_gqa`` (no mask, head_dim <= 256: ``integrations/sdpa_attention.py`` ``use_gqa_in_sdpa``) with
  ``dropout_p`` = ``attn_pdrop``, which above 0 makes torch run the math path on cpu and meta
  (``aten_sdpa_math``), at 0 the CPU's flash kernel (``llama.sdpa_attention_forward``);
* the activation ``activation_function`` (``gelu_pytorch_tanh`` by default: one ``F.gelu``);
* the dropouts ``attn_pdrop``, ``resid_pdrop`` and ``embd_pdrop`` at the config.json's values, else the class's
  0.1 (configuration_gpt_bigcode.py:65-67); at 0 each returns its input;
* ``create_causal_mask`` before the position lookup (:441-447), and a (positions, positions) bool ``bias``
  buffer (:381-383) that no forward reads.
"""

from __future__ import annotations

from ....config import ModelConfig
from ....hf_config import GPT_BIGCODE_DROPOUT
from ....setup import TrainingSetup
from .. import aten as A
from .. import cuda
from ..aten_activation import dropout
from ..aten_index import split_with_sizes
from ..aten_sdpa_math import sdpa_math
from ..engine import Affine
from ..tensors import Tensor, empty, no_grad
from . import gpt2
from .gpt2 import GPT2LMHeadModel, LayerNorm
from .llama import B, Linear, arange_plus, eager_mask, find_packed_sequence_indices, repeat_kv
from .llama import sdpa_attention_forward as flash_sdpa
from .phi import ACTIVATIONS


def pdrop(cfg: ModelConfig, field: str) -> float:
    """A dropout probability: the config.json's, else the class's (``GPT_BIGCODE_DROPOUT``)."""
    return dict(cfg.dropout).get(field, GPT_BIGCODE_DROPOUT[field])


def eager_attention_forward(module: Attention, query, key, value, attention_mask) -> tuple[Tensor, Tensor]:
    """modeling_gpt_bigcode.py:90-113: Llama's with ``attn_dropout`` on the probabilities."""
    key_states = repeat_kv(key, module.groups)  # :100
    value_states = repeat_kv(value, module.groups)  # :101
    attn_weights = A.mul(A.matmul(query, A.transpose(key_states, 2, 3)), module.scaling)  # :103
    if attention_mask is not None:
        attn_weights = A.add(attn_weights, attention_mask)  # :105
    attn_weights = A.to(A.softmax(attn_weights, -1, "fp32"), query.dtype)  # :107
    attn_weights = dropout(attn_weights, module.attn_pdrop, device=module.device)  # :108
    attn_output = A.matmul(attn_weights, value_states)  # :110
    return A.contiguous(A.transpose(attn_output, 1, 2)), attn_weights  # :111


def sdpa_attention_forward(module: Attention, query, key, value, attention_mask) -> tuple[Tensor, None]:
    """``integrations/sdpa_attention.py`` ``sdpa_attention_forward`` (no mask: ``is_causal``): K and V keep their
    head (``enable_gqa``) up to head_dim 256, else are repeated; dropout above 0 runs the math path."""
    if module.attn_pdrop == 0:
        return flash_sdpa(module, query, key, value, attention_mask)
    if module.groups > 1 and key.shape[-1] > 256:  # use_gqa_in_sdpa: no fused kernel's head size
        key, value = repeat_kv(key, module.groups), repeat_kv(value, module.groups)
    query, key, value = A.lower(query, key, value)  # autocast: scaled_dot_product_attention is lower precision
    if module.device == "cuda" and (query.dtype != "fp32" or key.shape[1] == query.shape[1]):
        # the fused kernels draw dropout's mask inside (``gpt2.sdpa_attention_forward``); fp32 with one K/V head
        # has none (the memory-efficient kernel takes no GQA: ``llama.sdpa_attention_forward``), so the math path
        attn_output = cuda.scaled_dot_product_attention(query, key, value, pinned=False)(query, key, value)[0]
    else:
        attn_output = sdpa_math(query, key, value, causal=True, dropout_p=module.attn_pdrop, device=module.device)
    return A.contiguous(A.transpose(attn_output, 1, 2)), None


class Attention:
    """``GPTBigCodeAttention`` (modeling_gpt_bigcode.py:116-239), self-attention only."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, device: str, name: str):
        d, h, kv = cfg.d_model, cfg.num_heads, cfg.kv_heads
        self.embed_dim, self.head_dim, self.num_heads = d, d // h, h
        self.multi_query = cfg.num_kv_heads == 1  # ``hf_config``: multi_query
        self.groups, self.scaling, self.attn, self.device = h // kv, (d // h) ** -0.5, attn, device
        self.attn_pdrop, self.resid_pdrop = pdrop(cfg, "attn_pdrop"), pdrop(cfg, "resid_pdrop")
        self.c_attn = Linear(d, d + 2 * kv * self.head_dim, True, dtype, name + ".c_attn")  # :156
        self.c_proj = Linear(d, d, True, dtype, name + ".c_proj")  # :158

    def params(self) -> list[Tensor]:
        return self.c_attn.params() + self.c_proj.params()

    def __call__(self, hidden_states: Tensor, attention_mask) -> tuple[Tensor, Tensor | None]:
        input_shape = hidden_states.shape[:-1]  # :174
        hd = self.head_dim
        if self.multi_query:  # :201-205
            fused = A.unsqueeze(self.c_attn(hidden_states), 1)
            query, key, value = split_with_sizes(fused, (self.embed_dim, hd, hd), 3)
            del fused
            query = A.transpose(A.view(query, *input_shape, -1, hd), 1, 2)
        else:  # :206-212
            fused = A.view(self.c_attn(hidden_states), *hidden_states.shape[:2], self.num_heads, 3 * hd)
            query, key, value = split_with_sizes(A.transpose(fused, 1, 2), 3 * [hd], 3)
            del fused
        interface = eager_attention_forward if self.attn == "naive" else sdpa_attention_forward
        attn_output, attn_weights = interface(self, query, key, value, attention_mask)  # :225-233
        attn_output = A.contiguous(A.reshape(attn_output, *input_shape, -1))  # :236
        attn_output = self.c_proj(attn_output)  # :237
        return dropout(attn_output, self.resid_pdrop, device=self.device), attn_weights  # :238-239


class MLP:
    """``GPTBigCodeMLP`` (modeling_gpt_bigcode.py:242-257)."""

    def __init__(self, cfg: ModelConfig, dtype: str, device: str, name: str):
        self.act, self.device = ACTIVATIONS[cfg.hf_activation or "gelu_pytorch_tanh"], device
        self.resid_pdrop = pdrop(cfg, "resid_pdrop")
        self.c_fc = Linear(cfg.d_model, cfg.d_ff, True, dtype, name + ".c_fc")
        self.c_proj = Linear(cfg.d_ff, cfg.d_model, True, dtype, name + ".c_proj")

    def params(self) -> list[Tensor]:
        return self.c_fc.params() + self.c_proj.params()

    def __call__(self, hidden_states: Tensor) -> Tensor:
        hidden_states = self.c_proj(self.act(self.c_fc(hidden_states)))  # :253-255
        return dropout(hidden_states, self.resid_pdrop, device=self.device)  # :256


class Block(gpt2.Block):
    """``GPTBigCodeBlock`` (modeling_gpt_bigcode.py:260-329): GPT-2's forward, self-attention only."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, device: str, name: str):
        self.ln_1 = LayerNorm(cfg.d_model, dtype, device, name + ".ln_1")
        self.attn = Attention(cfg, dtype, attn, device, name + ".attn")
        self.ln_2 = LayerNorm(cfg.d_model, dtype, device, name + ".ln_2")
        self.mlp = MLP(cfg, dtype, device, name + ".mlp")


class GPTBigCodeForCausalLM(GPT2LMHeadModel):
    """``GPTBigCodeForCausalLM`` with ``GPTBigCodeModel`` (modeling_gpt_bigcode.py:367-581), labels given: GPT-2's
    parameters (``wte``, ``wpe``, the blocks, ``ln_f``, an untied ``lm_head``) and head, with its own blocks,
    ``bias`` buffer and model forward."""

    block_class = Block

    def __init__(self, cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B, device="meta"):
        super().__init__(cfg, seq, setup, batch, device)
        rows = cfg.position_rows
        self.bias = empty((rows, rows), "bool", "tril")  # :381-383, non-persistent

    def transformer(self) -> Tensor:
        """``GPTBigCodeModel.forward`` (modeling_gpt_bigcode.py:400-499)."""
        inputs_embeds = A.embedding(self.wte, self.input_ids)  # :434
        position_ids = A.unsqueeze(arange_plus(self.seq), 0)  # :436-439
        with no_grad():
            find_packed_sequence_indices(A.expand(position_ids, self.batch, -1))
        causal_mask = None  # :441-447; sdpa without padding skips the mask (is_causal)
        if self.setup.attention == "naive":
            causal_mask = eager_mask(self.batch, self.seq, self.dtype, None)
        position_embeds = A.embedding(self.wpe, position_ids)  # :470
        hidden_states = A.add(inputs_embeds, position_embeds)  # :471
        hidden_states = dropout(hidden_states, pdrop(self.cfg, "embd_pdrop"), device=self.device)  # :478
        for block in self.h:  # :481-490
            hidden_states = block(hidden_states, attention_mask=causal_mask)
        hidden_states = self.ln_f(hidden_states)  # :492
        return A.view(hidden_states, *inputs_embeds.shape[:-1], hidden_states.shape[-1])  # :494


def causal_lm(
    cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B, device: str = "meta"
) -> GPTBigCodeForCausalLM:
    """The program of ``ops.transformers.predict_step`` on target ``device`` ("meta" or "cpu"; LayerNorm's
    statistics differ)."""
    return GPTBigCodeForCausalLM(cfg, seq, setup, batch, device)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = []
    if setup.checkpoint == "selective":
        out.append("transformers has no selective activation checkpointing")
    if cfg.norm != "layernorm" or cfg.mlp != "gelu" or cfg.positions != "learned" or cfg.norm_placement != "pre":
        out.append("a gpt_bigcode model with another norm, MLP, positions or norm placement")
    if cfg.kv_heads not in (1, cfg.num_heads) or cfg.d_head * cfg.num_heads != cfg.d_model or cfg.moe:
        out.append("a gpt_bigcode model with grouped K/V heads, a head size other than d_model / heads, or experts")
    if (cfg.hf_activation or "gelu_pytorch_tanh") not in ACTIVATIONS:
        out.append(f"activation_function {cfg.hf_activation} (not transliterated: {', '.join(ACTIVATIONS)} are)")
    return out
