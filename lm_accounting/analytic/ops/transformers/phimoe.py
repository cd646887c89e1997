"""transformers 5.24's ``PhimoeForCausalLM`` training step (Phi-3.5-MoE), transliterated
(``models/phimoe/modeling_phimoe.py``).

The skeleton is the LayerNorm models' (``layernorm_lm``: the embedding kept, Llama's position ids, packed-sequence
check and one causal mask, Mistral's over ``sliding_window`` when set, a final ``nn.LayerNorm`` with its bias, the
head on an alias of the normed states); the attention is Llama's (``llama.Attention``, ``attention_bias`` on q, k,
v and o); the decoder layer is Llama's with ``nn.LayerNorm``s; the experts run ``grouped_mm`` (``PhimoeExperts`` is
``@use_experts_implementation``: ``moe.Experts``).  What PhiMoE does differently:

* ``PhimoeRotaryEmbedding.forward`` (:81-96): ``torch.max(position_ids) + 1`` (kept until it returns; read only
  for a scaled RoPE), and the inverse frequencies computed again every forward by ``compute_default_rope_parameters``
  (:62-79: ``arange``, ``/ dim``, ``base **``, ``1.0 /``: the reciprocal times 1.0), on the CPU whatever the model's
  device (no device given), then moved to the states' device (a copy on meta);
* the router (``PhimoeTopKRouter``, an ``nn.Linear`` to E logits, :463-480) runs ``sparsemixer`` in training
  (:340-460): twice, for the first and the second expert, a no-grad threshold mask (``max``, ``abs().clamp(min=)``,
  ``(max − scores) / factor > 2·jitter_eps``), ``masked_fill`` of the scores (the first time) or of the scores with
  the first expert scattered to −inf (the second), Gumbel sampling (``empty_like().exponential_().log()`` subtracted,
  ``max(dim=-1)[1]``), a softmax, ``gather`` of the sampled expert's probability, the Heun mask (``==`` the argmax,
  ``rand_like() > 0.75``, ``logical_or``, ``torch.add(0.3333, mask, alpha=0.6667)`` in fp32, ``type_as``), and
  ``PhimoeMultiplier`` (a custom autograd ``Function``: it saves the gathered probability, the sampled expert and the
  softmax, returns ``multiplier * mask_for_one``, and in backward makes the scores' gradient ``masked_gates ·
  −(grad · multiplier)`` with a ``scatter_add_``); the two multipliers and the two experts ``concat``-ed: top-2
  whatever ``num_experts_per_tok``;
* ``PhimoeSparseMoeBlock`` (:483-516) registers ``router`` before ``experts``; ``input_jitter_noise`` only 0 (the
  class's default; the reader ignores it).
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..aten_index import gather, max_dim
from ..engine import Affine
from ..tensors import Tensor, current, empty, no_grad, parameter, record
from . import moe
from .deepseek import masked_fill
from .gpt2 import LayerNorm
from .layernorm_lm import LayerNormCausalLM
from .llama import B, DecoderLayer, int_scalar_op


def inverse_frequencies(half: int) -> Tensor:
    """``compute_default_rope_parameters`` (:62-79) on the CPU: ``1.0 / (base ** (arange(0, dim, 2) / dim))``."""
    wraps = current().wraps
    a = empty((half,), "fp32", "arange")
    wrapped = A.wrap_scalar("int64") if wraps else None  # / dim
    ratio = empty((half,), "fp32", "div")
    del wrapped, a
    powered = empty((half,), "fp32", "pow")  # base ** ratio: pow.Scalar, no wrapped number
    del ratio
    reciprocal = empty((half,), "fp32", "reciprocal")  # 1.0 / t = t.reciprocal() * 1.0
    wrapped = A.wrap_scalar("fp32") if wraps else None
    inv_freq = empty((half,), "fp32", "mul")
    del wrapped, reciprocal, powered
    return inv_freq


def rotary_embedding(x: Tensor, position_ids: Tensor, half: int, device: str) -> tuple[Tensor, Tensor]:
    """``PhimoeRotaryEmbedding.forward`` (:81-96) with the default RoPE; the CPU's tensors count on a cpu target
    only; its locals die at the return in their order (``seq_len``, ``inv_freq``, ``freqs``, ``emb``)."""
    with no_grad():
        highest = empty((), "int64", "max")
        seq_len = int_scalar_op((), "add")
        del highest
    if device == "cpu":
        inv_freq = inverse_frequencies(half)
        freqs = A.mul(A.to(A.unsqueeze(position_ids, -1), "fp32"), inv_freq)
    else:  # the CPU's tensors are not the device's; ``.to(x.device)``: a copy on meta, dead once multiplied
        inv_freq = None
        freqs = A.mul(A.to(A.unsqueeze(position_ids, -1), "fp32"), empty((half,), "fp32", "_to_copy"))
    emb = A.cat((freqs, freqs), -1)
    cos = A.mul(A.unary(emb, "cos"), 1.0)  # * mscale
    sin = A.mul(A.unary(emb, "sin"), 1.0)
    out = A.to(cos, x.dtype), A.to(sin, x.dtype)
    del seq_len, inv_freq, freqs, emb, cos, sin
    return out


def phimoe_multiplier(scores: Tensor, multiplier: Tensor, selected: Tensor, masked_gates: Tensor, one: Tensor):
    """``PhimoeMultiplier.apply``: saves (multiplier, selected_experts, masked_gates); out ``multiplier *
    mask_for_one`` (no autograd inside); backward: ``grad * multiplier``, ``.mul(-1)``, ``masked_gates * that``,
    ``scatter_add_`` in place; the gradient of ``scores`` only."""
    out = empty(multiplier.shape, A.promote(multiplier, one), "mul")

    def back(ctx, g, m, s, gates):
        grad_at_output = empty(g[0].shape, g[0].dtype, "mul")
        minus = empty(g[0].shape, g[0].dtype, "mul")
        grad_at_scores_expanded = empty(gates.shape, A.promote(gates, minus), "mul")
        del minus, grad_at_output
        return grad_at_scores_expanded, None, None

    # the node's edges reach every input that requires grad (``collect_next_edges``): the gathered probability's
    # and the softmax's nodes stay alive with it, and their saved tensors (the masked_fill's mask) with them
    record(
        "PhimoeMultiplierBackward",
        (scores, multiplier, masked_gates),
        (out,),
        back,
        (multiplier, selected, masked_gates),
    )
    return out


def max_keepdim(x: Tensor, grad: bool) -> tuple[Tensor, Tensor]:
    """``x.max(dim=-1, keepdim=True)``: (values, int64 indices), with a ``MaxBackward0`` where grad mode makes
    one (``aten_index.max_dim``; it never runs: no gradient reaches the values)."""
    if grad:
        return max_dim(x, keepdim=True)
    t = x.shape[0]
    return empty((t, 1), x.dtype, "max"), empty((t, 1), "int64", "max")


def threshold(scores: Tensor) -> tuple[Tensor, Tensor]:
    """The first round's no-grad ``factor = scores.abs().clamp(min=maxima)`` and ``((maxima − scores) / factor) >
    2·jitter_eps`` (:365-367): (mask, factor); the second round's is written out where its factor replaces this one."""
    magnitude = empty(scores.shape, scores.dtype, "abs")
    factor = empty(scores.shape, scores.dtype, "clamp")
    del magnitude
    gap = empty(scores.shape, scores.dtype, "sub")
    ratio = empty(scores.shape, scores.dtype, "div")
    del gap
    mask = empty(scores.shape, "bool", "gt")
    del ratio
    return mask, factor


def gumbel_argmax(masked_gates: Tensor) -> Tensor:
    """``(masked_gates − empty_like(masked_gates).exponential_().log()).max(dim=-1)[1].unsqueeze(-1)``: the
    difference dies, then the max's values (and with them its ``MaxBackward0``); the indices live on, saved by the
    nodes that take them (``gather``, ``scatter``, ``PhimoeMultiplier``)."""
    noise = empty(masked_gates.shape, masked_gates.dtype, "empty_like")  # exponential_ in place
    logged = empty(masked_gates.shape, masked_gates.dtype, "log")
    del noise
    shifted = A.sub(masked_gates, logged)
    del logged
    values, indices = max_dim(shifted)
    del shifted, values
    return A.unsqueeze(indices, -1)


def heun_mask(selected: Tensor, max_ind: Tensor, max_scores: Tensor, dtype: str) -> Tensor:
    """``torch.add(0.3333, logical_or(selected == max_ind, rand_like(max_scores)[.uniform_()] > 0.75),
    alpha=0.6667).type_as(masked_gates)`` (:390-397, :447-454)."""
    t = max_scores.shape[0]
    same = empty((t, 1), "bool", "eq")
    noise = empty((t, 1), max_scores.dtype, "rand_like")  # uniform_ in place
    wrapped = A.wrap_scalar("fp32")  # > 0.75
    heun = empty((t, 1), "bool", "gt")
    del wrapped, noise
    either = empty((t, 1), "bool", "logical_or")
    del heun, same
    start = A.wrap_scalar("fp32")  # torch.add(0.3333, ...): the number as a 0-d tensor
    mask = empty((t, 1), "fp32", "add")
    del start, either
    return A.to(mask, dtype)


def sparsemixer(scores: Tensor) -> tuple[Tensor, Tensor]:
    """``sparsemixer(scores, jitter_eps, training=True)`` (:340-460), its locals as there."""
    with no_grad():  # :361-367
        mask_logits_threshold, max_ind = max_keepdim(scores, grad=False)
        mask_logits_threshold, factor = threshold(scores)
    masked_gates = masked_fill(scores, mask_logits_threshold)  # :370
    selected_experts = gumbel_argmax(masked_gates)  # :371-380
    masked_gates = A.softmax(masked_gates, -1)  # :385
    multiplier_o = gather(masked_gates, -1, selected_experts)  # :386
    max_scores, max_ind = max_keepdim(masked_gates, grad=True)  # :390
    mask_for_one = heun_mask(selected_experts, max_ind, max_scores, masked_gates.dtype)  # :391-397
    multiplier = phimoe_multiplier(scores, multiplier_o, selected_experts, masked_gates, mask_for_one)  # :399-405
    masked_scores = scatter(scores, selected_experts)  # :411-416
    with no_grad():  # :417-421
        mask_logits_threshold, max_ind = max_keepdim(masked_scores, grad=False)
        magnitude = empty(scores.shape, scores.dtype, "abs")
        factor = empty(scores.shape, scores.dtype, "clamp")  # noqa: F841 (the first factor dies; a local until the return)
        del magnitude
        gap = empty(scores.shape, scores.dtype, "sub")
        ratio = empty(scores.shape, scores.dtype, "div")
        del gap
        above = empty(scores.shape, "bool", "gt")
        del ratio
        mask_logits_threshold = above  # the maxima die
        del above
    masked_gates_top2 = masked_fill(masked_scores, mask_logits_threshold)  # :424
    selected_experts_top2 = gumbel_argmax(masked_gates_top2)  # :425-438
    masked_gates_top2 = A.softmax(masked_gates_top2, -1)  # :442
    multiplier_top2_o = gather(masked_gates_top2, -1, selected_experts_top2)  # :443
    max_scores, max_ind = max_keepdim(masked_gates_top2, grad=True)  # :447
    mask_for_one_top2 = heun_mask(selected_experts_top2, max_ind, max_scores, masked_gates_top2.dtype)
    multiplier_top2 = phimoe_multiplier(
        scores, multiplier_top2_o, selected_experts_top2, masked_gates_top2, mask_for_one_top2
    )  # :456-462
    multiplier = A.cat((multiplier, multiplier_top2), -1)  # :466
    selected_experts = empty((scores.shape[0], 2), "int64", "cat")  # :467
    return multiplier, selected_experts


def scatter(scores: Tensor, index: Tensor) -> Tensor:
    """``torch.scatter(scores, -1, index, -inf)``: a copy with the entries set; saves the index (``ScatterBackward0``:
    ``grad.scatter(dim, index, 0)``, one tensor)."""
    out = empty(scores.shape, scores.dtype, "scatter", like=scores)
    record(
        "ScatterBackward0", (scores,), (out,), lambda ctx, g, i: (empty(g[0].shape, g[0].dtype, "scatter"),), (index,)
    )
    return out


class TopKRouter:
    """``PhimoeTopKRouter``: ``nn.Linear(d, E)`` without a bias, then ``sparsemixer``."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.weight = parameter((cfg.num_experts, cfg.d_model), dtype, name + ".weight")

    def __call__(self, hidden_states: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        router_logits = A.linear(hidden_states, self.weight)  # :477
        routing_weights, selected_experts = sparsemixer(router_logits)  # :478-480
        return router_logits, routing_weights, selected_experts


class SparseMoeBlock:
    """``PhimoeSparseMoeBlock``: router, experts."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.router = TopKRouter(cfg, dtype, name + ".router")
        self.experts = moe.Experts(cfg, dtype, name + ".experts")

    def params(self) -> list[Tensor]:
        return [self.router.weight] + self.experts.params()

    def __call__(self, hidden_states: Tensor) -> Tensor:
        batch_size, sequence_length, hidden_dim = hidden_states.shape  # :512
        hidden_states = A.reshape(hidden_states, -1, hidden_dim)
        _, routing_weights, selected_experts = self.router(hidden_states)
        final_hidden_states = self.experts(hidden_states, selected_experts, routing_weights)
        return A.reshape(final_hidden_states, batch_size, sequence_length, hidden_dim)


class PhimoeDecoderLayer(DecoderLayer):
    """``PhimoeDecoderLayer`` (:519-560): Llama's layer with the sparse block and ``nn.LayerNorm``s."""

    mlp_class = SparseMoeBlock

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, device: str, name: str):
        super().__init__(cfg, dtype, attn, name, norm=lambda size, dt, label: LayerNorm(size, dt, device, label))

    def params(self) -> list[Tensor]:
        norms = self.input_layernorm.params() + self.post_attention_layernorm.params()
        return self.self_attn.params() + self.mlp.params() + norms


class PhimoeForCausalLM(LayerNormCausalLM):
    """``PhimoeForCausalLM`` with ``PhimoeModel`` (the LayerNorm skeleton, Mistral's window)."""

    layer_class = PhimoeDecoderLayer

    def __init__(self, cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B, device="meta"):
        self.device = device
        super().__init__(cfg, seq, setup, batch, device)

    def window(self) -> int | None:
        return self.cfg.sliding_window

    def rotary(self, hidden_states: Tensor, position_ids: Tensor):
        return rotary_embedding(hidden_states, position_ids, self.cfg.d_head // 2, self.device)


def causal_lm(
    cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B, device: str = "meta"
) -> PhimoeForCausalLM:
    """The program of ``ops.transformers.predict_step`` on target ``device`` ("meta" or "cpu": the rotary table's
    CPU tensors, LayerNorm's statistics)."""
    return PhimoeForCausalLM(cfg, seq, setup, batch, device)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    return moe.unsupported(cfg, setup)
