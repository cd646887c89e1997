"""transformers 5.24's ``DeepseekV3ForCausalLM`` training step (deepseek_v3, and sarvam_mla, which transformers
builds as it), transliterated (``models/deepseek_v3/modeling_deepseek_v3.py``; line numbers of transformers 5.24).
GLM-4.7-Flash's ``Glm4MoeLiteForCausalLM`` (``models/glm4_moe_lite/modeling_glm4_moe_lite.py``) is the same
program: its attention, router, experts and block are DeepSeek-V3's line for line, its dense first layers given
by ``mlp_layer_types`` (read as ``dense_layers_first``), its RoPE over ``head_dim`` = ``qk_rope_head_dim``
(a ``partial_rotary_factor`` other than 1 is refused by the reader).  Youtu's ``YoutuForCausalLM``
(``models/youtu/modeling_youtu.py``: Llama's model and decoder layer, ``DeepseekV3Attention``, Qwen3's MLP) is
the program without experts: every layer dense.

The model is Llama's (``llama.LlamaForCausalLM``: embeddings, masks, RoPE over ``qk_rope_head_dim``, the loss)
with DeepSeek's decoder layer: latent attention (MLA) and, from layer ``first_k_dense_replace`` on, the MoE
block (dense ``DeepseekV3MLP`` before).

* ``DeepseekV3Attention.forward`` (:427-483): the query through ``q_proj`` or ``q_a_proj`` → ``q_a_layernorm``
  → ``q_b_proj``, viewed per head and transposed, split into its no-RoPE and RoPE parts (views);
  ``kv_a_proj_with_mqa``, split into the latent and the shared RoPE key (views), the latent RMSNormed;
  RoPE interleaved (``rope_interleave``: strided slices ``0::2``/``1::2``, the first half of cos and sin, two
  products and a difference/sum per half, one ``cat``) or Llama's ``rotate_half``; the query ``cat`` of its two
  parts; ``expand_kv`` (:407-424): ``kv_b_proj``, view, transpose, split into the no-RoPE key and the value,
  the RoPE key expanded over the heads (a view), then ``new_empty`` and two ``copy_`` into its slices: in
  autograd two ``CopySlices`` (``torch/csrc/autograd/functions/tensor.cpp``), see ``copy_slices``.
* attention: eager as Llama's; sdpa: the CPU's flash kernel when the value head equals the query/key head,
  else torch's math path (``sdp_utils_cpp.cpp`` ``check_head_dim_size_cpp`` wants one head size for q, k and v).
* ``DeepseekV3TopkRouter.forward`` (:133-158): an fp32 ``F.linear`` of ``hidden_states.type(float32)`` with an
  fp32 weight (``_keep_in_fp32_modules_strict``: the weight and ``e_score_correction_bias`` stay fp32 in a bf16
  model), sigmoid, the bias added, per group the sum of its top 2, the top ``topk_group`` groups, a mask made
  with ``zeros_like`` + ``scatter_`` and expanded to the experts (a copy), ``masked_fill`` (saves the mask), the
  top-k, ``gather`` of the sigmoid's scores, the optional normalisation by ``/=`` (``moe.div_``), the scaling.
  The router's logits are the block's ``_`` until it returns.
* the experts are ``moe.Experts`` (``grouped_mm``); the shared experts one ``DeepseekV3MLP`` of width
  ``moe_intermediate_size × n_shared_experts``, added to the experts' output (:215-222).
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from .. import cuda
from ..aten_index import gather, split_with_sizes, strided_slice, topk
from ..aten_pointwise import sigmoid
from ..aten_sdpa_math import sdpa_math
from ..engine import Affine
from ..tensors import Tensor, empty, parameter, record
from .llama import (
    DTYPES,
    GradientCheckpointingLayer,
    Linear,
    LlamaForCausalLM,
    RMSNorm,
    apply_rotary_pos_emb,
    eager_attention_forward,
)
from .llama import sdpa_attention_forward as llama_sdpa
from .moe import Experts, div_

B = Affine(1)


class MLP:
    """``DeepseekV3MLP`` (:104-117) of width ``f``."""

    def __init__(self, d: int, f: int, dtype: str, name: str):
        self.gate_proj = Linear(d, f, False, dtype, name + ".gate_proj")
        self.up_proj = Linear(d, f, False, dtype, name + ".up_proj")
        self.down_proj = Linear(f, d, False, dtype, name + ".down_proj")

    def params(self) -> list[Tensor]:
        return self.gate_proj.params() + self.up_proj.params() + self.down_proj.params()

    def __call__(self, x: Tensor) -> Tensor:
        return self.down_proj(A.mul(A.silu(self.gate_proj(x)), self.up_proj(x)))


def masked_fill(x: Tensor, mask: Tensor) -> Tensor:
    """``x.masked_fill(mask, value)`` with a Python number: a new tensor; saves the mask (backward
    ``grad.masked_fill(mask, 0)``: one tensor)."""
    out = empty(x.shape, x.dtype, "masked_fill", like=x)
    record(
        "MaskedFillBackward0", (x,), (out,), lambda ctx, g, m: (empty(g[0].shape, g[0].dtype, "masked_fill"),), (mask,)
    )
    return out


class TopkRouter:
    """``DeepseekV3TopkRouter`` (:120-158): the fp32 weight (E, d) and the fp32 buffer ``e_score_correction_bias``."""

    def __init__(self, cfg: ModelConfig, name: str):
        self.weight = parameter((cfg.num_experts, cfg.d_model), "fp32", name + ".weight")
        self.e_score_correction_bias = empty((cfg.num_experts,), "fp32", name + ".e_score_correction_bias")
        self.top_k, self.num_experts, self.hidden_dim = cfg.experts_per_token, cfg.num_experts, cfg.d_model
        self.num_group, self.topk_group = cfg.expert_groups, cfg.expert_groups_per_token
        self.norm_topk_prob = cfg.norm_topk_prob

    def __call__(self, hidden_states: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        e, g = self.num_experts, self.num_group
        hidden_states = A.view(hidden_states, -1, self.hidden_dim)  # :134
        router_logits = A.linear(A.to(hidden_states, "fp32"), self.weight)  # :135 (weight.type(fp32): itself)
        scores = sigmoid(router_logits)  # :136
        scores_for_choice = A.add(scores, self.e_score_correction_bias)  # :137
        group_scores = A.sum_(topk(A.view(scores_for_choice, -1, g, e // g), 2)[0], -1)  # :138-142
        group_idx = topk(group_scores, self.topk_group)[1]  # noqa: F841 (:143; a local until the return)
        group_mask = empty(group_scores.shape, "fp32", "zeros_like")  # :144; scatter_ in place, no grad
        t = group_mask.shape[0]
        score_mask = A.reshape(A.expand(A.unsqueeze(group_mask, -1), t, g, e // g), -1, e)  # :146-150
        as_bool = empty(score_mask.shape, "bool", "to")  # :151: ~score_mask.bool()
        inverted = empty(score_mask.shape, "bool", "bitwise_not")
        del as_bool
        scores_for_choice = masked_fill(scores_for_choice, inverted)
        del inverted
        topk_indices = topk(scores_for_choice, self.top_k)[1]  # :152
        topk_weights = gather(scores, 1, topk_indices)  # :153
        if self.norm_topk_prob:  # :154-156
            # autocast: sum is an fp32 op (AT_FORALL_FP32_SET_OPT_DTYPE), the weights bf16 (the linear's)
            denominator = A.add(A.sum_(topk_weights, -1, keepdim=True, dtype=A.opt_dtype(None)), 1e-20)
            topk_weights = div_(topk_weights, denominator)
        topk_weights = A.mul(topk_weights, 2.5)  # :157 (routed_scaling_factor: any number)
        return router_logits, topk_weights, topk_indices  # the locals die in their order of first use


class MoE:
    """``DeepseekV3MoE`` (:201-222): experts, gate, shared experts, registered in that order."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.experts = Experts(cfg, dtype, name + ".experts")
        self.gate = TopkRouter(cfg, name + ".gate")
        width = cfg.expert_width * cfg.shared_experts
        self.shared_experts = MLP(cfg.d_model, width, dtype, name + ".shared_experts")

    def params(self) -> list[Tensor]:
        return self.experts.params() + [self.gate.weight] + self.shared_experts.params()

    def __call__(self, hidden_states: Tensor) -> Tensor:
        residuals = hidden_states  # :216
        orig_shape = hidden_states.shape
        _, topk_weights, topk_indices = self.gate(hidden_states)  # :218
        hidden_states = A.view(hidden_states, -1, hidden_states.shape[-1])
        hidden_states = A.view(self.experts(hidden_states, topk_indices, topk_weights), *orig_shape)  # :220
        hidden_states = A.add(hidden_states, self.shared_experts(residuals))  # :221
        return hidden_states


def apply_rotary_pos_emb_interleave(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1
) -> tuple[Tensor, Tensor]:
    """:310-346 (``unsqueeze_dim`` 2: GLM-5's indexer on (B, S, heads, d) tensors)."""
    half = cos.shape[-1] // 2
    cos = A.unsqueeze(A.slice_(cos, -1, 0, half), unsqueeze_dim)
    sin = A.unsqueeze(A.slice_(sin, -1, 0, half), unsqueeze_dim)
    q1, q2 = strided_slice(q, 0, 2), strided_slice(q, 1, 2)
    k1, k2 = strided_slice(k, 0, 2), strided_slice(k, 1, 2)
    q_embed = A.cat([A.sub(A.mul(q1, cos), A.mul(q2, sin)), A.add(A.mul(q2, cos), A.mul(q1, sin))], -1)
    k_embed = A.cat([A.sub(A.mul(k1, cos), A.mul(k2, sin)), A.add(A.mul(k2, cos), A.mul(k1, sin))], -1)
    return q_embed, k_embed


def copy_slices(base: Tensor, src: Tensor, offset: int) -> None:
    """``base[..., offset:offset + n].copy_(src)`` (in place): autograd's ``CopySlices`` around
    ``CopyBackwards`` becomes ``base``'s node.  Backward (``CopySlices::apply_impl``): a tensor of ``base``'s
    shape (``new_empty_strided`` + ``copy_``), the slice of it cloned (contiguous) for ``CopyBackwards``, which
    makes ``zeros_like`` of it when the old ``base`` history wants a gradient (the slice is then zeroed in
    place) and hands the clone on as ``src``'s gradient (``grad.to(src's dtype)``: a copy where they differ);
    the tensor of ``base``'s shape is ``base``'s old history's gradient, or freed."""
    shape, dtype = base.shape, base.dtype
    src_dtype, width = src.dtype, src.shape[-1]  # not ``src``: the node keeps no tensor

    def back(ctx, g):
        result = empty(shape, dtype, "new_empty_strided")
        clone = empty(g[0].shape[:-1] + (width,), dtype, "clone")
        zeros = empty(clone.shape, dtype, "zeros_like") if ctx.need[0] else None
        grad_src = A.to(clone, src_dtype) if ctx.need[1] else None
        del clone, zeros
        return (result if ctx.need[0] else None), grad_src

    record("CopySlices", (base, src), (base,), back)


class Attention:
    """``DeepseekV3Attention`` (:349-483)."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str):
        d, h = cfg.d_model, cfg.num_heads
        self.num_heads, self.attn, self.groups = h, attn, 1
        self.q_lora_rank, self.kv_lora_rank = cfg.q_lora_rank, cfg.kv_lora_rank
        self.nope, self.rope, self.v_head_dim = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.qk_head_dim = self.nope + self.rope
        self.interleave = cfg.rope_interleave
        self.scaling = self.qk_head_dim**-0.5
        if self.q_lora_rank is None:
            self.q_proj = Linear(d, h * self.qk_head_dim, False, dtype, name + ".q_proj")
        else:
            self.q_a_proj = Linear(d, self.q_lora_rank, False, dtype, name + ".q_a_proj")
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, dtype, name + ".q_a_layernorm")
            self.q_b_proj = Linear(self.q_lora_rank, h * self.qk_head_dim, False, dtype, name + ".q_b_proj")
        self.kv_a_proj_with_mqa = Linear(d, self.kv_lora_rank + self.rope, False, dtype, name + ".kv_a_proj_with_mqa")
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, dtype, name + ".kv_a_layernorm")
        self.kv_b_proj = Linear(self.kv_lora_rank, h * (self.nope + self.v_head_dim), False, dtype, name + ".kv_b_proj")
        self.o_proj = Linear(h * self.v_head_dim, d, False, dtype, name + ".o_proj")

    def params(self) -> list[Tensor]:
        if self.q_lora_rank is None:
            out = self.q_proj.params()
        else:
            out = self.q_a_proj.params() + [self.q_a_layernorm.weight] + self.q_b_proj.params()
        out += self.kv_a_proj_with_mqa.params() + [self.kv_a_layernorm.weight] + self.kv_b_proj.params()
        return out + self.o_proj.params()

    def expand_kv(self, kv_nope: Tensor, k_rot: Tensor) -> tuple[Tensor, Tensor]:
        """:407-424."""
        batch_size, _, seq_length, _ = kv_nope.shape
        key_shape = (batch_size, seq_length, -1, self.nope + self.v_head_dim)
        kv_nope = A.transpose(A.view(self.kv_b_proj(kv_nope), *key_shape), 1, 2)
        k_nope, value_states = split_with_sizes(kv_nope, [self.nope, self.v_head_dim], -1)
        k_rot = A.expand(k_rot, -1, k_nope.shape[1], -1, -1)
        key_states = empty((*k_nope.shape[:-1], self.qk_head_dim), kv_nope.dtype, "new_empty")
        copy_slices(key_states, k_nope, 0)
        copy_slices(key_states, k_rot, self.nope)
        return key_states, value_states

    def __call__(self, hidden_states: Tensor, position_embeddings, attention_mask) -> tuple[Tensor, Tensor | None]:
        batch_size, seq_length = hidden_states.shape[:-1]  # :435
        if self.q_lora_rank is None:
            q_states = self.q_proj(hidden_states)
        else:
            q_states = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))
        q_states = A.transpose(A.view(q_states, batch_size, seq_length, -1, self.qk_head_dim), 1, 2)  # :442
        q_pass, q_rot = split_with_sizes(q_states, [self.nope, self.rope], -1)
        compressed_kv = self.kv_a_proj_with_mqa(hidden_states)  # :445
        kv_nope, k_rot = split_with_sizes(compressed_kv, [self.kv_lora_rank, self.rope], -1)
        kv_nope = self.kv_a_layernorm(kv_nope)
        kv_nope = A.view(kv_nope, batch_size, 1, seq_length, self.kv_lora_rank)
        k_rot = A.view(k_rot, batch_size, 1, seq_length, self.rope)
        cos, sin = position_embeddings  # :452
        if self.interleave:
            q_rot, k_rot = apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin)
        else:
            q_rot, k_rot = apply_rotary_pos_emb(q_rot, k_rot, cos, sin)
        query_states = A.cat((q_pass, q_rot), -1)  # :462
        key_states, value_states = self.expand_kv(kv_nope, k_rot)  # :464
        if self.attn == "naive":
            attn_output, attn_weights = eager_attention_forward(
                self, query_states, key_states, value_states, attention_mask
            )
        else:
            attn_output, attn_weights = sdpa_attention_forward(
                self, query_states, key_states, value_states, attention_mask
            )
        attn_output = A.contiguous(A.reshape(attn_output, batch_size, seq_length, -1))  # :481
        return self.o_proj(attn_output), attn_weights  # the locals die in their order of first use


def sdpa_attention_forward(module: Attention, query, key, value, attention_mask) -> tuple[Tensor, None]:
    """``integrations/sdpa_attention.py``, is_causal, no mask: on the cpu the flash kernel
    (``llama.sdpa_attention_forward``) when q, k and v have one head size, else the math path (``aten_sdpa_math``);
    on cuda the kernels ``llama.sdpa_attention_forward`` takes there, cuDNN attention (16-bit) or the
    memory-efficient kernel (fp32), which take a value head unlike the query/key head (measured on an H200:
    reports/cuda-h200/traces/trace_deepseek_sdpa.txt, ``_cudnn_attention_forward`` with a (B, S, h, d_v) output)."""
    if query.shape[-1] == value.shape[-1] or cuda.on_cuda():
        return llama_sdpa(module, query, key, value, attention_mask)
    attn_output = sdpa_math(query, key, value, causal=True, device="cpu")
    return A.contiguous(A.transpose(attn_output, 1, 2)), None


class DecoderLayer(GradientCheckpointingLayer):
    """``DeepseekV3DecoderLayer`` (:486-531)."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str, sparse: bool):
        self.self_attn = Attention(cfg, dtype, attn, name + ".self_attn")
        self.mlp = MoE(cfg, dtype, name + ".mlp") if sparse else MLP(cfg.d_model, cfg.d_ff, dtype, name + ".mlp")
        self.input_layernorm = RMSNorm(cfg.d_model, dtype, name + ".input_layernorm")
        self.post_attention_layernorm = RMSNorm(cfg.d_model, dtype, name + ".post_attention_layernorm")

    def params(self) -> list[Tensor]:
        norms = [self.input_layernorm.weight, self.post_attention_layernorm.weight]
        return self.self_attn.params() + self.mlp.params() + norms

    def forward(self, hidden_states: Tensor, attention_mask=None, position_embeddings=None, position_ids=None):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states, position_embeddings, attention_mask)
        hidden_states = A.add(residual, hidden_states)
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        return A.add(residual, hidden_states)


class DeepseekV3ForCausalLM(LlamaForCausalLM):
    """``DeepseekV3ForCausalLM`` with ``DeepseekV3Model`` (:563-705): Llama's forward and loss; RoPE over
    ``qk_rope_head_dim`` (the config's ``head_dim``); dense layers before ``first_k_dense_replace``."""

    def __init__(self, cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B):
        dtype = DTYPES[setup.precision]
        self.cfg, self.seq, self.batch, self.setup, self.dtype = cfg, seq, batch, setup, dtype
        self.embed_tokens = parameter((cfg.vocab_size, cfg.d_model), dtype, "embed_tokens.weight")
        self.layers = [
            self.layer_class(cfg, dtype, setup.attention, f"layers.{i}", cfg.moe and i >= cfg.dense_layers_first)
            for i in range(cfg.num_layers)
        ]
        for layer in self.layers:
            layer.gradient_checkpointing = setup.checkpoint == "full"
        self.norm = RMSNorm(cfg.d_model, dtype, "norm")
        half = cfg.qk_rope_head_dim // 2
        self.inv_freq = empty((half,), "fp32", "inv_freq")
        self.original_inv_freq = empty((half,), "fp32", "original_inv_freq")
        self.lm_head = None if cfg.tie_embeddings else parameter((cfg.vocab_size, cfg.d_model), dtype, "lm_head.weight")
        self.input_ids = empty((batch, seq), "int64", "input_ids")
        self.labels = empty((batch, seq), "int64", "labels")

    layer_class = DecoderLayer


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B) -> DeepseekV3ForCausalLM:
    """The program of ``ops.transformers.predict_step``."""
    return DeepseekV3ForCausalLM(cfg, seq, setup, batch)


def fp32_kept_parameters(cfg: ModelConfig) -> int:
    """The router weights (E, d) of the sparse layers: fp32 in a 16-bit model (``_keep_in_fp32_modules_strict``,
    V2's and V3's ``gate.weight``; V3's ``e_score_correction_bias`` is a buffer)."""
    return cfg.num_experts * cfg.d_model * (cfg.num_layers - cfg.dense_layers_first) if cfg.moe else 0


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = []
    if setup.checkpoint == "selective":
        out.append("transformers has no selective activation checkpointing")
    groups, kept = cfg.expert_groups, cfg.expert_groups_per_token
    least = 2 if cfg.hf_model_type != "deepseek_v2" else 1  # V3 sums each group's top 2, V2 takes its max
    grouped = cfg.moe and (cfg.hf_model_type != "deepseek_v2" or cfg.topk_method == "group_limited_greedy")
    if grouped and (cfg.num_experts % groups or cfg.num_experts // groups < least or kept > groups):
        out.append(
            f"a router transformers cannot run: {cfg.num_experts} experts in n_group = {groups} groups of at least "
            f"{least}, topk_group = {kept} of them"
        )
    return out
