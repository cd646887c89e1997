"""transformers 5.24's ``DeepseekV2ForCausalLM`` training step, transliterated (``models/deepseek_v2/
modeling_deepseek_v2.py``; line numbers of transformers 5.24): DeepSeek-V3's program (``deepseek``: the latent
attention's projections and ``expand_kv``, the experts, the shared experts, dense first layers) with V2's own
pieces: its router (``DeepseekV2TopkRouter``: the fp32 linear, a softmax in fp32, then ``topk_method``
"greedy", the top-k of all experts, or "group_limited_greedy", each group's max, the best ``topk_group``
groups, ``masked_fill`` with 0 and the top-k; no normalisation, no bias buffer), its RoPE
(``DeepseekV2RotaryEmbedding``: ``torch.polar`` of the angles, complex64; ``apply_rotary_emb``: q and k as
complex pairs, ``view_as_complex``, a complex product, ``view_as_real``, ``type_as``) and the attention's local
names (which decide when the query's and the latent's storages die).
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..aten_index import max_values, split_with_sizes, topk
from ..engine import Affine
from ..tensors import Tensor, empty, no_grad, parameter, record
from . import deepseek
from .deepseek import (
    MLP,
    Attention,
    DecoderLayer,
    DeepseekV3ForCausalLM,
    MoE,
    masked_fill,
    sdpa_attention_forward,
)
from .llama import (
    RMSNorm,
    arange_plus,
    eager_attention_forward,
    eager_mask,
    find_packed_sequence_indices,
    sdpa_mask,
)
from .moe import Experts

B = Affine(1)


class TopkRouterV2:
    """``DeepseekV2TopkRouter`` (:86-117): the fp32 weight (E, d) (``_keep_in_fp32_modules_strict``), a softmax
    in fp32, then ``topk_method``'s top-k."""

    def __init__(self, cfg: ModelConfig, name: str):
        self.weight = parameter((cfg.num_experts, cfg.d_model), "fp32", name + ".weight")
        self.top_k, self.num_experts, self.hidden_dim = cfg.experts_per_token, cfg.num_experts, cfg.d_model
        self.num_group, self.topk_group = cfg.expert_groups, cfg.expert_groups_per_token
        self.topk_method = cfg.topk_method or "greedy"

    def __call__(self, hidden_states: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        e, g = self.num_experts, self.num_group
        hidden_states = A.view(hidden_states, -1, self.hidden_dim)  # :99
        router_logits = A.linear(A.to(hidden_states, "fp32"), self.weight)  # :100
        scores = A.softmax(router_logits, -1, "fp32")  # :101
        if self.topk_method == "greedy":  # :102-103
            topk_weights, topk_indices = topk(scores, self.top_k)
        elif self.topk_method == "group_limited_greedy":  # :104-115
            group_scores = max_values(A.view(scores, -1, g, e // g))
            group_idx = topk(group_scores, self.topk_group)[1]  # noqa: F841 (a local until the return)
            group_mask = empty(group_scores.shape, "fp32", "zeros_like")  # scatter_ in place, no grad
            t = group_mask.shape[0]
            score_mask = A.reshape(A.expand(A.unsqueeze(group_mask, -1), t, g, e // g), -1, e)
            as_bool = empty(score_mask.shape, "bool", "to")  # ~score_mask.bool()
            inverted = empty(score_mask.shape, "bool", "bitwise_not")
            del as_bool
            scores = masked_fill(scores, inverted)
            del inverted
            topk_weights, topk_indices = topk(scores, self.top_k)
        topk_weights = A.mul(topk_weights, 1.0)  # :116 (routed_scaling_factor: any number)
        return router_logits, topk_weights, topk_indices  # the locals die in their order of first use


def view_as_complex(t: Tensor) -> Tensor:
    """``torch.view_as_complex`` of (..., n, 2) fp32: a complex64 view (..., n); backward ``view_as_real(grad
    .contiguous())``: a view."""
    out = Tensor(t.shape[:-1], "complex64", t.storage)
    out.base = t.base if t.base is not None else t
    record("ViewAsComplexBackward0", (t,), (out,), lambda ctx, g: (view_as_real(A.contiguous(g[0])),))
    return out


def view_as_real(t: Tensor) -> Tensor:
    """``torch.view_as_real`` of complex64 (..., n): an fp32 view (..., n, 2); backward ``view_as_complex(grad
    .contiguous())``."""
    out = Tensor((*t.shape, 2), "fp32", t.storage)
    out.base = t.base if t.base is not None else t
    record("ViewAsRealBackward0", (t,), (out,), lambda ctx, g: (view_as_complex(A.contiguous(g[0])),))
    return out


def complex_mul(x: Tensor, freqs: Tensor) -> Tensor:
    """``x * freqs_cis`` of complex64 tensors, ``freqs_cis`` needing no gradient: MulBackward0 saves it; backward
    ``grad * freqs_cis.conj()`` (the conjugate view materialised first: a copy of ``freqs_cis``)."""
    out = empty(A.broadcast(x.shape, freqs.shape), "complex64", "mul")

    def back(ctx, g, f):
        conj = empty(f.shape, f.dtype, "resolve_conj")
        grad = empty(g[0].shape, "complex64", "mul")
        del conj
        return (grad,)

    record("MulBackward0", (x,), (out,), back, (freqs,))
    return out


def apply_rotary_emb(xq: Tensor, xk: Tensor, freqs_cis: Tensor) -> tuple[Tensor, Tensor]:
    """modeling_deepseek_v2.py ``apply_rotary_emb``: each of q and k ``.float()``, split into pairs (a view),
    ``view_as_complex``, times the angles, ``view_as_real``, flattened (a view), ``type_as`` the input."""
    xq_ = view_as_complex(A.reshape(A.to(xq, "fp32"), *xq.shape[:-1], -1, 2))
    xk_ = view_as_complex(A.reshape(A.to(xk, "fp32"), *xk.shape[:-1], -1, 2))
    freqs_cis = A.unsqueeze(freqs_cis, 1)
    xq_out = A.to(A.reshape(view_as_real(complex_mul(xq_, freqs_cis)), *xq.shape), xq.dtype)
    xk_out = A.to(A.reshape(view_as_real(complex_mul(xk_, freqs_cis)), *xk.shape), xk.dtype)
    return xq_out, xk_out


class AttentionV2(Attention):
    """``DeepseekV2Attention`` (:290-419): DeepSeek-V3's projections and ``expand_kv``, complex RoPE."""

    def __call__(self, hidden_states: Tensor, position_embeddings, attention_mask) -> tuple[Tensor, Tensor | None]:
        batch_size, seq_length = hidden_states.shape[:-1]  # :376
        if self.q_lora_rank is None:
            q = self.q_proj(hidden_states)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))
        q = A.transpose(A.view(q, batch_size, seq_length, -1, self.qk_head_dim), 1, 2)  # :383
        q_nope, q_pe = split_with_sizes(q, [self.nope, self.rope], -1)
        compressed_kv = self.kv_a_proj_with_mqa(hidden_states)  # :386
        kv_nope, k_pe = split_with_sizes(compressed_kv, [self.kv_lora_rank, self.rope], -1)
        k_nope = A.view(self.kv_a_layernorm(kv_nope), batch_size, 1, seq_length, self.kv_lora_rank)
        k_pe = A.view(k_pe, batch_size, 1, seq_length, self.rope)
        q_pe, k_pe = apply_rotary_emb(q_pe, k_pe, position_embeddings)  # :393
        query_states = A.cat((q_nope, q_pe), -1)  # :399
        key_states, value_states = self.expand_kv(k_nope, k_pe)  # :401
        if self.attn == "naive":
            attn_output, attn_weights = eager_attention_forward(
                self, query_states, key_states, value_states, attention_mask
            )
        else:
            attn_output, attn_weights = sdpa_attention_forward(
                self, query_states, key_states, value_states, attention_mask
            )
        attn_output = A.contiguous(A.reshape(attn_output, batch_size, seq_length, -1))  # :417
        return self.o_proj(attn_output), attn_weights  # the locals die in their order of first use


class MoEV2(MoE):
    """``DeepseekV2Moe`` (:120-137): V3's block with V2's router."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.experts = Experts(cfg, dtype, name + ".experts")
        self.gate = TopkRouterV2(cfg, name + ".gate")
        width = cfg.expert_width * cfg.shared_experts
        self.shared_experts = MLP(cfg.d_model, width, dtype, name + ".shared_experts")


class DecoderLayerV2(DecoderLayer):
    """``DeepseekV2DecoderLayer`` (:422-464)."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str, sparse: bool):
        self.self_attn = AttentionV2(cfg, dtype, attn, name + ".self_attn")
        self.mlp = MoEV2(cfg, dtype, name + ".mlp") if sparse else MLP(cfg.d_model, cfg.d_ff, dtype, name + ".mlp")
        self.input_layernorm = RMSNorm(cfg.d_model, dtype, name + ".input_layernorm")
        self.post_attention_layernorm = RMSNorm(cfg.d_model, dtype, name + ".post_attention_layernorm")


def rotary_embedding_v2(position_ids: Tensor, inv_freq: Tensor) -> Tensor:
    """``DeepseekV2RotaryEmbedding.forward`` (:214-219): ``position_ids[..., None].float() * inv_freq``, then
    ``torch.polar(torch.ones_like(freqs), freqs)`` (complex64), times ``attention_scaling``."""
    freqs = A.mul(A.to(A.unsqueeze(position_ids, -1), "fp32"), inv_freq)
    ones = empty(freqs.shape, "fp32", "ones_like")
    freqs_cis = empty(freqs.shape, "complex64", "polar")
    del ones
    freqs_cis = A.mul(freqs_cis, 1.0)
    return freqs_cis


class DeepseekV2ForCausalLM(DeepseekV3ForCausalLM):
    """``DeepseekV2ForCausalLM`` (:572-645): V3's model with V2's layers and complex RoPE."""

    layer_class = DecoderLayerV2

    def model(self) -> Tensor:
        """``DeepseekV2Model.forward`` (:515-569): Llama's, with the complex angles as position embeddings."""
        inputs_embeds = A.embedding(self.embed_tokens, self.input_ids)
        position_ids = A.unsqueeze(arange_plus(self.seq), 0)
        with no_grad():
            find_packed_sequence_indices(A.expand(position_ids, self.batch, -1))
        if self.setup.attention == "naive":
            causal = eager_mask(self.batch, self.seq, self.dtype, None)
        else:
            causal = sdpa_mask(self.batch, self.seq, None, allow_is_causal_skip=True)
        hidden_states = inputs_embeds
        position_embeddings = rotary_embedding_v2(position_ids, self.inv_freq)
        kwargs = dict(attention_mask=causal, position_embeddings=position_embeddings, position_ids=position_ids)
        hidden_states = self.run_layers(hidden_states, lambda i: kwargs)
        return self.norm(hidden_states)


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B) -> DeepseekV2ForCausalLM:
    """The program of ``ops.transformers.predict_step``."""
    return DeepseekV2ForCausalLM(cfg, seq, setup, batch)


fp32_kept_parameters = deepseek.fp32_kept_parameters


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup`` (DeepSeek-V3's program's list)."""
    return deepseek.unsupported(cfg, setup)
