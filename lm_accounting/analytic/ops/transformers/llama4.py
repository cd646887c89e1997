"""transformers 5.24's ``Llama4ForCausalLM`` training step, transliterated (``models/llama4/modeling_llama4.py``,
the text model; ``Llama4TextConfig``, ``models/llama4/configuration_llama4.py``).

Llama's program (``llama.py``: the embedding, the position ids, the loss, the checkpointed layers) with Llama 4's
own pieces:

* ``Llama4TextRotaryEmbedding``: DeepSeek-V2's complex angles (``torch.polar``, complex64, times
  ``attention_scaling``: ``deepseek_v2.rotary_embedding_v2``); ``apply_rotary_emb``: q and k ``.float()``, split
  into pairs, ``view_as_complex``, times ``freqs_cis[:, :, None, :]``, ``view_as_real(...).flatten(3)``, then both
  ``type_as`` their input at the return; on the (B, S, heads, head_dim) states, before the heads are transposed.
* ``Llama4TextAttention.forward``: v transposed at once, q and k after RoPE; RoPE only on the layers whose
  ``no_rope_layers`` flag is 1 (``ModelConfig.nope_layers``: the others); ``Llama4TextL2Norm`` on q and k of those
  layers with ``use_qk_norm`` (``ModelConfig.l2_qk_norm``: ``x.float()``, ``x * rsqrt(x.pow(2).mean(-1) + eps)``,
  ``type_as``); on the NoPE layers with ``attn_temperature_tuning`` q times ``log1p(floor((arange(S).float() +
  1) / floor_scale)) * attn_scale + 1`` viewed (1, S, 1, 1) and expanded (an fp32 factor: q's product is fp32, cast
  back; the positions and the factor are locals until the attention returns).  Its eager attention keeps the
  softmax in the activations' dtype (no fp32 cast).
* ``Llama4TextDecoderLayer``: the attention's output is a local (``attention_states``) until the layer returns; the
  feed-forward is ``Llama4TextMoe`` on the layers of ``moe_layers`` (``ModelConfig.layer_moe``: every
  ``interleave_moe_layer_step``-th), else ``Llama4TextMLP`` of ``intermediate_size_mlp``; a sparse layer's
  ``hidden_states, _ = hidden_states`` keeps the router logits (and drops eager's probabilities) until the return.
* ``Llama4TextMoe``: the router (``Llama4Router``: ``F.linear`` to E logits, ``topk``, ``full_like(-inf).scatter_``
  of the top values, ``sigmoid`` of the ``.float()`` scores cast back), every token repeated E times
  (``hidden_states.repeat(E, 1)``) times its score (the scores' transpose reshaped: a copy), all E experts in
  ``Llama4TextExperts`` (two ``torch.bmm``: gate_up (E, d, 2f), ``chunk``, ``up * silu(gate)``, down (E, f, d)),
  the shared expert (``Llama4TextMLP`` of ``intermediate_size``) and ``out.add_`` of the routed outputs summed over
  the experts (under autocast an fp32 sum: ``sum`` is an fp32 op).  No ``grouped_mm``: transformers' default experts
  implementation does not apply to this class.
* ``Llama4TextRMSNorm``: ``_norm(x.float()).type_as(x) * weight`` (the weight the product's second operand).
* the masks (``Llama4TextModel.forward``): one per layer type present, ``create_causal_mask`` for the NoPE (full)
  layers and ``create_chunked_causal_mask`` for the chunked ones (``masking_utils.py``: ``left_padding`` zeros (B,),
  ``and_masks(chunked_overlay, causal_mask_function)`` broadcast over (B, 1, S, S); sdpa skips it, relying on
  ``is_causal``, while S < ``attention_chunk_size``).  transformers builds them in the order of
  ``set(config.layer_types)``, a string set's (hash-seeded) order; replayed full first: only the mask-building
  temporaries, before any activation, move with the order.
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..aten_index import repeat_rows, scatter_src_, split_with_sizes, topk
from ..aten_pointwise import sigmoid
from ..engine import Affine
from ..tensors import Dim, Tensor, empty, no_grad, parameter
from . import llama
from .deepseek_v2 import complex_mul, rotary_embedding_v2, view_as_complex, view_as_real
from .llama import (
    B,
    GradientCheckpointingLayer,
    LlamaForCausalLM,
    arange_plus,
    eager_mask,
    find_packed_sequence_indices,
    int_scalar_op,
    repeat_kv,
    rsqrt_norm,
    sdpa_attention_forward,
    sdpa_mask,
    weightless_rms_norm,
)
from .moe import add_

FLOOR_SCALE, ATTN_SCALE = 8192, 0.1  # the class's floor_scale and attn_scale: bytes do not depend on them


class RMSNorm(llama.RMSNorm):
    """``Llama4TextRMSNorm``: ``self._norm(x.float()).type_as(x) * self.weight``."""

    def __call__(self, hidden_states: Tensor) -> Tensor:
        h = A.to(hidden_states, "fp32")
        normed = rsqrt_norm(h)
        del h
        return A.mul(A.to(normed, hidden_states.dtype), self.weight)


def apply_rotary_emb(xq: Tensor, xk: Tensor, freqs_cis: Tensor) -> tuple[Tensor, Tensor]:
    """modeling_llama4.py ``apply_rotary_emb`` on (B, S, heads, head_dim): the complex products of q and k, each
    ``view_as_real(...).flatten(3)`` (a view), cast to the input's dtype at the return, q's first."""
    xq_ = view_as_complex(A.reshape(A.to(xq, "fp32"), *xq.shape[:-1], -1, 2))
    xk_ = view_as_complex(A.reshape(A.to(xk, "fp32"), *xk.shape[:-1], -1, 2))
    xq_out = A.reshape(view_as_real(complex_mul(xq_, A.unsqueeze(freqs_cis, 2))), *xq.shape)
    xk_out = A.reshape(view_as_real(complex_mul(xk_, A.unsqueeze(freqs_cis, 2))), *xk.shape)
    return A.to(xq_out, xq.dtype), A.to(xk_out, xk.dtype)


def temperature_scales(batch: Dim, seq: int) -> tuple[Tensor, Tensor]:
    """The NoPE layers' ``positions = torch.arange(S) + 0`` and ``attn_scales = (torch.log1p(torch.floor(
    (positions.float() + 1.0) / floor_scale)) * attn_scale + 1.0).view(1, S, 1, 1).expand(B, S, 1, 1)``: both
    locals of the attention (the int64 positions, the (S,) fp32 factor)."""
    positions = arange_plus(seq)
    scaled = A.mul(
        A.unary(A.unary(A.div(A.add(A.to(positions, "fp32"), 1.0), FLOOR_SCALE), "floor"), "log1p"), ATTN_SCALE
    )
    attn_scales = A.add(scaled, 1.0)
    del scaled
    return positions, A.expand(A.view(attn_scales, 1, seq, 1, 1), batch, seq, 1, 1)


def eager_attention_forward(module: Attention, query, key, value, attention_mask) -> tuple[Tensor, Tensor]:
    """modeling_llama4.py ``eager_attention_forward``: Llama's without the fp32 softmax (dropout 0: its input)."""
    key_states = repeat_kv(key, module.groups)
    value_states = repeat_kv(value, module.groups)
    attn_weights = A.mul(A.matmul(query, A.transpose(key_states, 2, 3)), module.scaling)
    if attention_mask is not None:
        attn_weights = A.add(attn_weights, attention_mask)
    attn_weights = A.softmax(attn_weights, -1)
    attn_output = A.matmul(attn_weights, value_states)
    return A.contiguous(A.transpose(attn_output, 1, 2)), attn_weights


class Attention(llama.Attention):
    """``Llama4TextAttention``: Llama's projections (``attention_bias`` on all four), complex RoPE on the RoPE layers,
    the L2 q/k norm there, the temperature tuning on the NoPE layers."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str, norm=None):
        super().__init__(cfg, dtype, attn, name)
        self.l2_qk_norm, self.temperature_tuning = cfg.l2_qk_norm, cfg.attn_temperature_tuning

    def __call__(self, hidden_states: Tensor, position_embeddings, attention_mask) -> tuple[Tensor, Tensor | None]:
        input_shape = hidden_states.shape[:-1]
        query_states = A.view(self.q_proj(hidden_states), *input_shape, -1, self.head_dim)
        key_states = A.view(self.k_proj(hidden_states), *input_shape, -1, self.head_dim)
        value_states = A.transpose(A.view(self.v_proj(hidden_states), *input_shape, -1, self.head_dim), 1, 2)
        if self.use_rope:
            query_states, key_states = apply_rotary_emb(query_states, key_states, position_embeddings)
            if self.l2_qk_norm:  # hasattr(self, "qk_norm"): built only with use_qk_norm on a RoPE layer
                query_states = weightless_rms_norm(query_states)
                key_states = weightless_rms_norm(key_states)
        positions = attn_scales = None
        if self.temperature_tuning and not self.use_rope:
            positions, attn_scales = temperature_scales(input_shape[0], input_shape[1])
            query_states = A.to(A.mul(query_states, attn_scales), query_states.dtype)
        query_states = A.transpose(query_states, 1, 2)
        key_states = A.transpose(key_states, 1, 2)
        interface = eager_attention_forward if self.attn == "naive" else sdpa_attention_forward
        attn_output, attn_weights = interface(self, query_states, key_states, value_states, attention_mask)
        attn_output = A.contiguous(A.reshape(attn_output, *input_shape, -1))
        attn_output = self.o_proj(attn_output)
        del positions, attn_scales
        return attn_output, attn_weights


class Router:
    """``Llama4Router``: ``nn.Linear(d, E)`` without a bias; sigmoid of the top-k logits, the rest σ(−∞) = 0."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.weight = parameter((cfg.num_experts, cfg.d_model), dtype, name + ".weight")
        self.top_k = cfg.experts_per_token

    def __call__(self, hidden_states: Tensor) -> tuple[Tensor, Tensor]:
        router_logits = A.linear(hidden_states, self.weight)
        router_top_value, router_indices = topk(router_logits, self.top_k)
        with no_grad():
            full = empty(router_logits.shape, router_logits.dtype, "full_like")
        router_scores = scatter_src_(full, router_indices, router_top_value)
        del full
        router_scores = A.to(sigmoid(A.to(router_scores, "fp32")), router_scores.dtype)
        return router_scores, router_logits


class Experts:
    """``Llama4TextExperts``: gate_up_proj (E, d, 2f) and down_proj (E, f, d), every expert on all its rows."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        e, d, f = cfg.num_experts, cfg.d_model, cfg.expert_width
        self.gate_up_proj = parameter((e, d, 2 * f), dtype, name + ".gate_up_proj")
        self.down_proj = parameter((e, f, d), dtype, name + ".down_proj")
        self.num_experts, self.hidden_size, self.expert_dim = e, d, f

    def params(self) -> list[Tensor]:
        return [self.gate_up_proj, self.down_proj]

    def __call__(self, hidden_states: Tensor, tokens: Dim) -> Tensor:
        hidden_states = A.view(hidden_states, self.num_experts, tokens, self.hidden_size)
        gate_up = A.bmm(hidden_states, self.gate_up_proj)
        gate, up = split_with_sizes(gate_up, [self.expert_dim] * 2, -1)
        next_states = A.bmm(A.mul(up, A.silu(gate)), self.down_proj)
        return A.view(next_states, -1, self.hidden_size)


class TextMoe:
    """``Llama4TextMoe``: experts, router and shared expert, registered in that order."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.experts = Experts(cfg, dtype, name + ".experts")
        self.router = Router(cfg, dtype, name + ".router")
        self.shared_expert = llama.MLP(cfg, dtype, name + ".shared_expert", cfg.expert_width)
        self.num_experts, self.hidden_dim = cfg.num_experts, cfg.d_model

    def params(self) -> list[Tensor]:
        return self.experts.params() + [self.router.weight] + self.shared_expert.params()

    def __call__(self, hidden_states: Tensor) -> tuple[Tensor, Tensor]:
        hidden_states = A.reshape(hidden_states, -1, self.hidden_dim)
        router_scores, router_logits = self.router(hidden_states)
        routed_in = repeat_rows(hidden_states, self.num_experts)
        routed_in = A.mul(routed_in, A.reshape(A.transpose(router_scores, 0, 1), -1, 1))
        routed_out = self.experts(routed_in, hidden_states.shape[0])
        out = self.shared_expert(hidden_states)
        routed = A.reshape(routed_out, self.num_experts, -1, self.hidden_dim)
        out = add_(out, A.sum_(routed, 0, dtype=A.opt_dtype(None)))  # autocast: sum is an fp32 op
        return out, router_logits


class DecoderLayer(GradientCheckpointingLayer):
    """``Llama4TextDecoderLayer``: attention, then the sparse or the dense feed-forward, each behind its norm."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str, moe: bool):
        self.self_attn = Attention(cfg, dtype, attn, name + ".self_attn")
        self.is_moe_layer = moe
        self.feed_forward = (
            TextMoe(cfg, dtype, name + ".feed_forward") if moe else llama.MLP(cfg, dtype, name + ".feed_forward")
        )
        self.input_layernorm = RMSNorm(cfg.d_model, dtype, name + ".input_layernorm")
        self.post_attention_layernorm = RMSNorm(cfg.d_model, dtype, name + ".post_attention_layernorm")

    def params(self) -> list[Tensor]:
        norms = [self.input_layernorm.weight, self.post_attention_layernorm.weight]
        return self.self_attn.params() + self.feed_forward.params() + norms

    def forward(self, hidden_states: Tensor, attention_mask=None, position_embeddings=None, position_ids=None):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        attention_states, _ = self.self_attn(hidden_states, position_embeddings, attention_mask)
        hidden_states = A.add(residual, attention_states)
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.feed_forward(hidden_states)
        if self.is_moe_layer:
            hidden_states, _ = hidden_states
        return A.add(residual, A.view(hidden_states, *residual.shape))


def chunked_mask(batch: Dim, seq: int, chunk: int, dtype: str, attention: str) -> Tensor | None:
    """``create_chunked_causal_mask`` without padding: ``left_padding = torch.zeros(B, dtype=int)`` (a local until
    the return), then the mask interface: sdpa's None while S < chunk (``_ignore_causal_mask_sdpa``), else the
    (B, 1, S, S) bool ``and_masks(chunked_overlay(chunk, left_padding), causal_mask_function)``:
    ``(kv_idx - left_padding[batch_idx]) // chunk == (q_idx - left_padding[batch_idx]) // chunk``, then ``kv_idx
    <= q_idx``; eager turns it into the additive mask (``torch.where``)."""
    left_padding = empty((batch,), "int64", "zeros")
    if attention != "naive" and seq < chunk:
        return None
    batch_arange = empty((batch,), "int64", "arange")
    head_arange = empty((1,), "int64", "arange")
    q_arange = arange_plus(seq)
    kv_arange = arange_plus(seq)
    result = empty((), "bool", "new_ones")
    padding = empty((batch, 1, 1, 1), "int64", "index")  # left_padding[batch_idx]
    shifted = empty((batch, 1, 1, seq), "int64", "sub")
    del padding
    kv_chunk = int_scalar_op(shifted.shape, "floor_divide")
    del shifted
    padding = empty((batch, 1, 1, 1), "int64", "index")
    shifted = empty((batch, 1, seq, 1), "int64", "sub")
    del padding
    q_chunk = int_scalar_op(shifted.shape, "floor_divide")
    del shifted
    same = empty((batch, 1, seq, seq), "bool", "eq")
    del kv_chunk, q_chunk
    result = empty(same.shape, "bool", "bitwise_and")
    del same
    causal = empty((1, 1, seq, seq), "bool", "le")
    mask = empty(result.shape, "bool", "bitwise_and")
    del result, causal, batch_arange, head_arange, q_arange, kv_arange
    mask = A.expand(mask, batch, -1, seq, seq)
    if attention == "naive":  # eager_mask: torch.where(mask, tensor(0.0, dtype), finfo(dtype).min)
        zeros = empty((), dtype, "zeros")
        low = empty((), dtype, "scalar_tensor")
        mask = empty(mask.shape, dtype, "where")
        del zeros, low
    del left_padding
    return mask


class Llama4ForCausalLM(LlamaForCausalLM):
    """``Llama4ForCausalLM`` with ``Llama4TextModel``, labels given, no ``output_router_logits``."""

    masks_see_positions = False  # each mask function looks for packed sequences itself (``masks``)

    def __init__(self, cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B):
        super().__init__(cfg, seq, setup, batch, norm=RMSNorm)

    def decoder_layer(self, name: str, norm) -> DecoderLayer:
        i = int(name.rsplit(".", 1)[1])
        return DecoderLayer(self.cfg, self.dtype, self.setup.attention, name, self.cfg.layer_moe(i))

    def model(self) -> Tensor:
        """``Llama4TextModel.forward``: the masks by layer type, the complex angles shared by the layers."""
        inputs_embeds = self.embed()
        position_ids = A.unsqueeze(arange_plus(self.seq), 0)
        masks = self.masks_by_type(position_ids)
        hidden_states = inputs_embeds
        freq_cis = rotary_embedding_v2(position_ids, self.inv_freq)
        kwargs = {
            c: dict(attention_mask=masks.get(c), position_embeddings=freq_cis, position_ids=position_ids)
            for c in (False, True)
        }
        hidden_states = self.run_layers(hidden_states, lambda i: kwargs[self.cfg.layer_chunked(i)])
        return self.norm(hidden_states)

    def masks_by_type(self, position_ids: Tensor) -> dict[bool, Tensor | None]:
        """The mask of each layer type present, by whether it is chunked; each mask function first looks for packed
        sequences (``_preprocess_mask_arguments``)."""
        out: dict[bool, Tensor | None] = {}
        for chunked in sorted({self.cfg.layer_chunked(i) for i in range(self.cfg.num_layers)}):
            with no_grad():
                find_packed_sequence_indices(A.expand(position_ids, self.batch, -1))
            if chunked:
                mask = chunked_mask(self.batch, self.seq, self.cfg.attention_chunk, self.dtype, self.setup.attention)
            elif self.setup.attention == "naive":
                mask = eager_mask(self.batch, self.seq, self.dtype, None)
            else:
                mask = sdpa_mask(self.batch, self.seq, None, allow_is_causal_skip=True)
            out[chunked] = mask
        return out


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B) -> Llama4ForCausalLM:
    """The program of ``ops.transformers.predict_step``."""
    return Llama4ForCausalLM(cfg, seq, setup, batch)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = []
    if setup.checkpoint == "selective":
        out.append("transformers has no selective activation checkpointing")
    if not cfg.all_experts_run or cfg.mlp != "swiglu" or cfg.qk_norm or cfg.sliding_window is not None:
        out.append("a llama4_text model read from something other than its config.json")
    return out
