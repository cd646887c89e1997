"""transformers 5.24's ``BloomForCausalLM`` training step, transliterated (``models/bloom/modeling_bloom.py``,
line numbers of transformers 5.24).  Eager attention only: the class supports no other (``from_config(...,
attn_implementation="sdpa")`` raises).

GPT-2's shape of model (pre-LayerNorm blocks, a final LayerNorm, a tied head: ``gpt2``'s ``LayerNorm``) with
Llama's projections (``llama.Linear``).  What BLOOM does differently:

* no positions: ALiBi (:46-60, :510-512), the slopes made on the device (``full``, ``arange``, ``pow``; a ``cat``
  with the odd powers when the heads are not a power of 2) times ``arange(S)``, ``repeat``ed to (B·h, 1, S) and cast
  to the hidden states' dtype; ``slopes`` and ``alibi`` live until the model's forward returns;
* ``word_embeddings_layernorm`` on the embedding (:500);
* the fused ``query_key_value`` viewed as (B, S, h, 3, hd) and ``select``ed per q, k, v (:215-218): each select's
  backward is a zero-filled tensor of the fused shape; q, k and v reshaped to (B·h, S, hd) (copies, except at
  B = 1), the scores ``alibi.baddbmm(q, kᵀ, beta=1, alpha=1/√hd)`` (:271-276), the eager mask added, an fp32
  softmax cast back, ``bmm`` with v, heads merged (a permute and a reshape: a copy), ``dense``;
* ``dropout_add`` (:93-109): dropout at ``hidden_dropout`` (0: its input), then the residual added;
* ``BloomGelu`` (:112-164): a custom ``autograd.Function`` that saves its input, runs ``x * 0.5 * (1.0 +
  tanh(0.79788456 * x * (1 + 0.044715 * x * x)))`` without autograd (nine elementwise ops, temporaries freed as
  they go) and computes its own backward (eighteen ops);
* the block returns (output, attention probabilities) and the model keeps that tuple (``outputs``) until the next
  block returns, so a checkpointed layer's probabilities live through the next layer (:524-540).

Not modelled: ``pretraining_tp > 1`` with ``slow_but_exact`` (sliced matmuls; ``hf_config`` keeps neither field).
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..aten_activation import tanh
from ..engine import Affine
from ..tensors import Storage, Tensor, current, empty, no_grad, parameter, record
from .gpt2 import LayerNorm
from .llama import DTYPES, B, GradientCheckpointingLayer, Linear, LlamaForCausalLM, eager_mask, head_and_loss


def bloom_gelu(x: Tensor) -> Tensor:
    """``BloomGelu``: ``GeLUFunction.apply(x)`` (modeling_bloom.py:142-164): the forward without autograd, the
    input saved after it, the custom backward ``bloom_gelu_back``."""
    with no_grad():
        out = _gelu_forward(x)
    record("GeLUFunctionBackward", (x,), (out,), lambda ctx, g, inp: (_gelu_back(g[0], inp),), (x,))
    return out


def _gelu_forward(x: Tensor) -> Tensor:
    """``bloom_gelu_forward`` (:112-121), evaluated left to right: ``x * 0.5``, ``0.79788456 * x``, ``0.044715 *
    x``, ``* x``, ``1 + ``, ``*``, ``tanh``, ``1.0 + ``, ``*``."""
    half = A.mul(x, 0.5)
    scaled = A.mul(x, 0.79788456)
    inner = A.add(A.mul(A.mul(x, 0.044715), x), 1)
    arg = A.mul(scaled, inner)
    del scaled, inner
    tanh_arg = tanh(arg)
    del arg
    return A.mul(half, A.add(tanh_arg, 1.0))


def _gelu_back(g: Tensor, x: Tensor) -> Tensor:
    """``bloom_gelu_back`` (:124-139): ``tanh_out = tanh(0.79788456 * x * (1 + 0.044715 * x * x))``; ``ff = 0.5 *
    x * ((1 - tanh_out * tanh_out) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1 + tanh_out)``; ``ff * g``."""
    scaled = A.mul(x, 0.79788456)
    inner = A.add(A.mul(A.mul(x, 0.044715), x), 1)
    arg = A.mul(scaled, inner)
    del scaled, inner
    tanh_out = tanh(arg)
    del arg
    half_x = A.mul(x, 0.5)
    one_minus = A.add(A.mul(tanh_out, tanh_out), 1)  # ``1 - t·t``: rsub, the same bytes
    poly = A.add(A.mul(A.mul(x, 0.1070322243), x), 0.79788456)
    product = A.mul(one_minus, poly)
    del one_minus, poly
    left = A.mul(half_x, product)
    del half_x, product
    right = A.mul(A.add(tanh_out, 1), 0.5)
    ff = A.add(left, right)
    del left, right
    return A.mul(ff, g)  # tanh_out and ff die as the function returns


def alibi_slopes(heads: int) -> Tensor:
    """``_get_alibi_slopes`` (:46-60) on the hidden states' device: fp32 (heads,)."""
    power = 1 << (heads.bit_length() - 1)  # closest_power_of_2
    base = empty((), "fp32", "full")
    powers = empty((power,), "int32", "arange")
    slopes = empty((power,), "fp32", "pow")
    if power != heads:
        extra_base = empty((), "fp32", "full")
        remaining = min(power, heads - power)
        extra_powers = empty((remaining,), "int32", "arange")
        extra = empty((remaining,), "fp32", "pow")
        slopes = empty((heads,), "fp32", "cat")
        del extra, extra_base, extra_powers
    del base, powers
    return slopes


class Attention:
    """``BloomAttention`` (modeling_bloom.py:167-311), ``pretraining_tp`` 1."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        d, h = cfg.d_model, cfg.num_heads
        self.num_heads, self.head_dim, self.inv_norm_factor = h, d // h, (d // h) ** -0.5
        self.query_key_value = Linear(d, 3 * d, True, dtype, name + ".query_key_value")
        self.dense = Linear(d, d, True, dtype, name + ".dense")

    def params(self) -> list[Tensor]:
        return self.query_key_value.params() + self.dense.params()

    def merge_heads(self, x: Tensor) -> Tensor:
        """``_merge_heads`` (:221-243): a view, ``permute(0, 2, 1, 3)`` (the layout of ``transpose(1, 2)``) and a
        reshape (a copy)."""
        bh, seq, _ = x.shape
        x = A.view(x, bh // self.num_heads, self.num_heads, seq, self.head_dim)
        x = A.transpose(x, 1, 2)
        return A.reshape(x, bh // self.num_heads, seq, self.num_heads * self.head_dim)

    def __call__(self, hidden_states: Tensor, residual: Tensor, alibi: Tensor, attention_mask) -> tuple[Tensor, Tensor]:
        batch_size, q_length, _ = hidden_states.shape  # :257
        h, hd = self.num_heads, self.head_dim
        fused_qkv = self.query_key_value(hidden_states)  # :258
        fused = A.view(fused_qkv, batch_size, q_length, h, 3, hd)  # :215
        query_layer = A.transpose(A.select(fused, 3, 0), 1, 2)  # :216-218
        key_layer = A.transpose(A.select(fused, 3, 1), 1, 2)
        value_layer = A.transpose(A.select(fused, 3, 2), 1, 2)
        del fused
        query_layer = A.reshape(query_layer, batch_size * h, -1, hd)  # :266
        key_layer = A.transpose(A.reshape(key_layer, batch_size * h, -1, hd), -1, -2)  # :267
        value_layer = A.reshape(value_layer, batch_size * h, -1, hd)  # :268
        attention_scores = A.baddbmm(alibi, query_layer, key_layer, self.inv_norm_factor)  # :271-276
        attn_weights = A.view(attention_scores, batch_size, h, q_length, -1)  # :279
        if attention_mask is not None:
            attn_weights = A.add(attn_weights, attention_mask)  # :281
        attention_probs = A.to(A.softmax(attn_weights, -1, "fp32"), query_layer.dtype)  # :284
        # :287 attention_dropout (p = 0: its input)
        attention_probs_reshaped = A.view(attention_probs, batch_size * h, q_length, -1)  # :290
        context_layer = A.bmm(attention_probs_reshaped, value_layer)  # :293
        context_layer = self.merge_heads(context_layer)  # :296
        output_tensor = self.dense(context_layer)  # :308
        output_tensor = A.add(residual, output_tensor)  # :310 dropout_add (p = 0)
        return output_tensor, attention_probs


class MLP:
    """``BloomMLP`` (modeling_bloom.py:314-342), ``pretraining_tp`` 1."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.dense_h_to_4h = Linear(cfg.d_model, cfg.d_ff, True, dtype, name + ".dense_h_to_4h")
        self.dense_4h_to_h = Linear(cfg.d_ff, cfg.d_model, True, dtype, name + ".dense_4h_to_h")

    def params(self) -> list[Tensor]:
        return self.dense_h_to_4h.params() + self.dense_4h_to_h.params()

    def __call__(self, hidden_states: Tensor, residual: Tensor) -> Tensor:
        hidden_states = bloom_gelu(self.dense_h_to_4h(hidden_states))  # :327
        intermediate_output = self.dense_4h_to_h(hidden_states)  # :338
        return A.add(residual, intermediate_output)  # :340 dropout_add (p = 0)


class BloomBlock(GradientCheckpointingLayer):
    """``BloomBlock`` (modeling_bloom.py:345-403): the residual from the block input; returns (output, the
    attention probabilities)."""

    def __init__(self, cfg: ModelConfig, dtype: str, device: str, name: str):
        self.input_layernorm = LayerNorm(cfg.d_model, dtype, device, name + ".input_layernorm")
        self.self_attention = Attention(cfg, dtype, name + ".self_attention")
        self.post_attention_layernorm = LayerNorm(cfg.d_model, dtype, device, name + ".post_attention_layernorm")
        self.mlp = MLP(cfg, dtype, name + ".mlp")

    def params(self) -> list[Tensor]:
        out = self.input_layernorm.params() + self.self_attention.params()
        return out + self.post_attention_layernorm.params() + self.mlp.params()

    def forward(self, hidden_states: Tensor, attention_mask=None, alibi=None) -> tuple[Tensor, Tensor]:
        layernorm_output = self.input_layernorm(hidden_states)  # :373
        residual = hidden_states  # :379
        attention_output, attn_weights = self.self_attention(layernorm_output, residual, alibi, attention_mask)
        layernorm_output = self.post_attention_layernorm(attention_output)  # :392
        residual = attention_output  # :398
        output = self.mlp(layernorm_output, residual)  # :401
        return output, attn_weights  # :403


class BloomForCausalLM(LlamaForCausalLM):
    """``BloomForCausalLM`` with ``BloomModel`` (modeling_bloom.py:416-680), labels given: Llama's step wrapper
    (``loss()``) around BLOOM's model."""

    def __init__(self, cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B, device="meta"):
        dtype = DTYPES[setup.precision]
        self.cfg, self.seq, self.batch, self.setup, self.dtype = cfg, seq, batch, setup, dtype
        self.word_embeddings = parameter((cfg.vocab_size, cfg.d_model), dtype, "word_embeddings.weight")
        self.word_embeddings_layernorm = LayerNorm(cfg.d_model, dtype, device, "word_embeddings_layernorm")
        self.h = [BloomBlock(cfg, dtype, device, f"h.{i}") for i in range(cfg.num_layers)]
        for block in self.h:
            block.gradient_checkpointing = setup.checkpoint == "full"
        self.ln_f = LayerNorm(cfg.d_model, dtype, device, "ln_f")
        self.lm_head = None if cfg.tie_embeddings else parameter((cfg.vocab_size, cfg.d_model), dtype, "lm_head.weight")
        self.input_ids = empty((batch, seq), "int64", "input_ids")
        self.labels = empty((batch, seq), "int64", "labels")

    def parameters(self) -> list[Tensor]:
        out = [self.word_embeddings] + self.word_embeddings_layernorm.params()
        for block in self.h:
            out += block.params()
        out += self.ln_f.params()
        return out + ([self.lm_head] if self.lm_head is not None else [])

    def model(self) -> Tensor:
        """``BloomModel.forward`` (modeling_bloom.py:449-555), no attention mask given."""
        inputs_embeds = A.embedding(self.word_embeddings, self.input_ids)  # :491
        hidden_states = self.word_embeddings_layernorm(inputs_embeds)  # :500
        slopes = alibi_slopes(self.cfg.num_heads)  # :510
        positions = empty((self.seq,), "int64", "arange")  # :511 ``slopes[:, None, None] * torch.arange(S)``
        promoted = Storage(self.seq * 4, "mixed_dtype_copy") if current().wraps else None  # the CPU's fp32 copy
        alibi = A.mul(A.view(slopes, self.cfg.num_heads, 1, 1), positions)  # (h, 1, S) fp32
        del promoted, positions
        alibi = A.to(empty((self.batch * self.cfg.num_heads, 1, self.seq), "fp32", "repeat"), hidden_states.dtype)
        causal_mask = eager_mask(self.batch, self.seq, self.dtype, None)  # :517-522
        outputs = None
        for block in self.h:  # :524-540; ``outputs`` keeps the last block's probabilities until the next returns
            outputs = block(hidden_states, attention_mask=causal_mask, alibi=alibi)
            hidden_states = outputs[0]
        return self.ln_f(hidden_states)  # :542

    def forward(self) -> tuple[Tensor, Tensor]:
        """``BloomForCausalLM.forward`` (:598-680) with ``ForCausalLMLoss``: (logits, loss)."""
        head = self.lm_head if self.lm_head is not None else self.word_embeddings
        return head_and_loss(self.model(), head, self.labels, self.cfg.vocab_size)


def causal_lm(
    cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B, device: str = "meta"
) -> BloomForCausalLM:
    """The program of ``ops.transformers.predict_step`` on target ``device`` ("meta" or "cpu"; LayerNorm's
    statistics differ)."""
    return BloomForCausalLM(cfg, seq, setup, batch, device)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = []
    if setup.checkpoint == "selective":
        out.append("transformers has no selective activation checkpointing")
    if setup.attention != "naive":
        out.append("BloomForCausalLM has eager attention only (transformers refuses sdpa for it)")
    if cfg.norm != "layernorm" or cfg.positions != "alibi" or not cfg.embedding_norm or cfg.moe:
        out.append("a bloom model with another norm, positions, no embedding norm, or experts")
    if cfg.kv_heads != cfg.num_heads or cfg.d_head * cfg.num_heads != cfg.d_model or cfg.d_ff != 4 * cfg.d_model:
        out.append("a bloom model with grouped K/V heads, another head size or an MLP other than 4·d")
    return out
