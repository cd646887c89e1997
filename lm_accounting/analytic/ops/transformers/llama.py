"""transformers 5.24's ``LlamaForCausalLM`` training step (and mistral, qwen2, qwen3, smollm3, seed_oss),
transliterated.

Each function follows one forward of ``transformers/models/llama/modeling_llama.py`` (line numbers of
transformers 5.24) on symbolic tensors (``ops.aten``), so torch's autograd engine (``ops.tensors``) frees
what the real model frees.  The run is the one ``measure.hf.build_hf_step`` measures, as transformers'
``Trainer`` trains: ``use_cache=False``, the loss computed by the model (``ForCausalLMLoss``), no
``attention_mask``, attention "naive" = ``attn_implementation="eager"`` and "sdpa" = ``"sdpa"``, full
checkpointing = ``activation_checkpointing_enable()`` (``use_reentrant=False``, every decoder layer).

Differences of the family: qwen2 has q/k/v biases (``qkv_bias``), qwen3 RMSNorms q and k per head
(``modeling_qwen3.py`` ``Qwen3Attention.forward``: ``self.q_norm(self.q_proj(x).view(hidden_shape))``),
mistral a sliding window (``sliding_window``; the mask then comes from ``create_sliding_window_causal_mask``),
smollm3 skips RoPE on its NoPE layers (``nope_layers``; modeling_smollm3.py ``SmolLM3Attention``: ``use_rope``),
seed_oss has its own o_proj bias (``output_bias``: ``attention_out_bias``) and residual dropouts (p = 0 only).

sdpa: the kernel torch picks on the CPU, ``_scaled_dot_product_flash_attention_for_cpu`` (K and V keep their
kv heads: transformers passes ``enable_gqa=True`` without a mask, ``integrations/sdpa_attention.py``
``use_gqa_in_sdpa``); on meta ``measure.hf.meta_as_cpu`` makes the measured run take it too.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from ....config import ModelConfig
from ....hf_config import SEED_OSS_DROPOUT
from ....setup import TrainingSetup
from .. import aten as A
from .. import cuda
from ..aten_rms_norm import rms_norm
from ..aten_sdpa_math import sdpa_math
from ..engine import Affine
from ..tensors import (
    Dim,
    Tensor,
    alike_runs,
    autocast_or_not,
    checkpoint,
    current,
    empty,
    no_grad,
    parameter,
    record,
    repeated,
    split_runs,
)

DTYPES = {"fp32": "fp32", "bf16": "bf16", "amp-bf16": "fp32"}
B = Affine(1)  # the micro-batch, a symbol


class Linear:
    """``nn.Linear``: its weight (out, in) and bias; ``F.linear``."""

    def __init__(self, d_in: int, d_out: int, bias: bool, dtype: str, name: str):
        self.weight = parameter((d_out, d_in), dtype, name + ".weight")
        self.bias = parameter((d_out,), dtype, name + ".bias") if bias else None

    def params(self) -> list[Tensor]:
        return [self.weight] + ([self.bias] if self.bias is not None else [])

    def __call__(self, x: Tensor) -> Tensor:
        return A.linear(x, self.weight, self.bias)


class RMSNorm:
    """``LlamaRMSNorm`` (modeling_llama.py:52-66)."""

    def __init__(self, size: int, dtype: str, name: str):
        self.weight = parameter((size,), dtype, name + ".weight")

    def __call__(self, hidden_states: Tensor) -> Tensor:
        input_dtype = hidden_states.dtype  # :60
        hidden_states = A.to(hidden_states, "fp32")  # :61
        variance = A.mean(A.pow_(hidden_states, 2), -1, keepdim=True)  # :62
        hidden_states = A.mul(hidden_states, A.rsqrt(A.add(variance, 1e-6)))  # :63
        return A.mul(self.weight, A.to(hidden_states, input_dtype))  # :64


def rsqrt_norm(x: Tensor, eps: float = 1e-6) -> Tensor:
    """``x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)``, each temporary dropped when used: the ``_norm`` of
    Gemma's, Llama 4's and Falcon-Mamba's norms (bytes do not depend on ``eps``)."""
    return A.mul(x, A.rsqrt(A.add(A.mean(A.pow_(x, 2), -1, keepdim=True), eps)))


def weightless_rms_norm(x: Tensor) -> Tensor:
    """``self._norm(x.float()).type_as(x)`` with ``_norm`` = ``rsqrt_norm``: ``Llama4TextL2Norm.forward``
    (modeling_llama4.py:111-115) and ``FalconMambaWeightlessRMSNorm.forward`` (modeling_falcon_mamba.py:54-58, its
    buffer weight unused).  The upcast is ``_norm``'s argument only: it dies when ``_norm`` returns, before
    ``type_as``."""
    upcast = A.to(x, "fp32")
    out = rsqrt_norm(upcast)
    del upcast
    return A.to(out, x.dtype)


class TorchRMSNorm(RMSNorm):
    """``torch.nn.RMSNorm(size, eps)`` in place of ``LlamaRMSNorm`` (torchtitan's norm): ``F.rms_norm``."""

    def __call__(self, hidden_states: Tensor) -> Tensor:
        return rms_norm(hidden_states, self.weight, 1e-6)


def rotary_embedding(x: Tensor, position_ids: Tensor, inv_freq: Tensor) -> tuple[Tensor, Tensor]:
    """``LlamaRotaryEmbedding.forward`` (modeling_llama.py:105-112); no tensor of it requires grad."""
    freqs = A.mul(A.to(A.unsqueeze(position_ids, -1), "fp32"), inv_freq)  # :106
    emb = A.cat((freqs, freqs), -1)  # :107
    cos = A.mul(A.unary(emb, "cos"), 1.0)  # :108 (* attention_scaling)
    sin = A.mul(A.unary(emb, "sin"), 1.0)  # :109
    return A.to(cos, x.dtype), A.to(sin, x.dtype)  # :111


def rotate_half(x: Tensor) -> Tensor:
    """modeling_llama.py:115-119."""
    half = x.shape[-1] // 2
    x1 = A.slice_(x, -1, 0, half)
    x2 = A.slice_(x, -1, half, x.shape[-1])
    return A.cat((A.neg(x2), x1), -1)


def apply_rotary_pos_emb(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """modeling_llama.py:122-147."""
    cos = A.unsqueeze(cos, 1)
    sin = A.unsqueeze(sin, 1)
    q_embed = A.add(A.mul(q, cos), A.mul(rotate_half(q), sin))
    k_embed = A.add(A.mul(k, cos), A.mul(rotate_half(k), sin))
    return q_embed, k_embed


def repeat_kv(hidden_states: Tensor, n_rep: int) -> Tensor:
    """modeling_llama.py:165-174: an expand and a reshape (a copy)."""
    batch, kv, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = A.expand(A.unsqueeze(hidden_states, 2), batch, kv, n_rep, slen, head_dim)
    return A.reshape(hidden_states, batch, kv * n_rep, slen, head_dim)


def eager_attention_forward(module: Attention, query, key, value, attention_mask) -> tuple[Tensor, Tensor]:
    """modeling_llama.py:177-199 (dropout 0: ``F.dropout`` returns its input): (output, the probabilities)."""
    key_states = repeat_kv(key, module.groups)
    value_states = repeat_kv(value, module.groups)
    attn_weights = A.mul(A.matmul(query, A.transpose(key_states, 2, 3)), module.scaling)
    if attention_mask is not None:
        attn_weights = A.add(attn_weights, attention_mask)
    attn_weights = A.to(A.softmax(attn_weights, -1, "fp32"), query.dtype)
    attn_output = A.matmul(attn_weights, value_states)
    return A.contiguous(A.transpose(attn_output, 1, 2)), attn_weights


def sdpa_attention_forward(module: Attention, query, key, value, attention_mask) -> tuple[Tensor, None]:
    """``integrations/sdpa_attention.py`` ``sdpa_attention_forward`` with the CPU's flash kernel."""
    if attention_mask is not None:  # no enable_gqa with a mask: K and V repeated (use_gqa_in_sdpa)
        key = repeat_kv(key, module.groups)
        value = repeat_kv(value, module.groups)
    query, key, value = A.lower(query, key, value)  # autocast: scaled_dot_product_attention is lower precision
    if cuda.on_cuda() and attention_mask is not None:  # a sliding window's mask: cuDNN with a bias
        attn_output = cuda.masked_attention(query, key, value, attention_mask)
    elif cuda.on_cuda() and query.dtype == "fp32" and key.shape[1] != query.shape[1]:  # no fused kernel: math
        attn_output = sdpa_math(query, key, value, causal=True, device="cuda")
    elif cuda.on_cuda():  # no mask: is_causal, enable_gqa; no backend pinned
        attn_output = cuda.scaled_dot_product_attention(query, key, value, pinned=False)(query, key, value)[0]
    else:
        attn_output = flash_attention_cpu(query, key, value, attention_mask)
    attn_output = A.reshape(attn_output, attn_output.shape[0], -1, query.shape[2], value.shape[-1])
    return A.contiguous(A.transpose(attn_output, 1, 2)), None


def flash_attention_cpu(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """``_scaled_dot_product_flash_attention_for_cpu`` (aten/src/ATen/native/transformers/attention.cpp):
    a bool mask first becomes an additive one of q's dtype (``convert_boolean_attn_mask``: two 0-d scalars and
    ``where``, (B, 1, S, S)); the output (B, h, S, d) laid out as (B, S, h, d) and the fp32 logsumexp
    (B, h, S); saves q, k, v, the mask, the output and the logsumexp; backward: dq, dk, dv (k and v with
    their kv heads)."""
    if mask is not None:
        zero, low = empty((), q.dtype, "scalar_tensor"), empty((), q.dtype, "scalar_tensor")
        mask = empty(mask.shape, q.dtype, "where")
        del zero, low
    b, h, s, d = q.shape
    out = empty((b, h, s, d), q.dtype, "flash", like=q)  # meta: empty_like(query) (_meta_registrations.py)
    lse = empty((b, h, s), "fp32", "flash_lse")
    A.flash_scratch_forward(s, d, q.dtype)

    def back(ctx, g, sq, sk, sv, sm, so, sl):
        dq = empty(sq.shape, sq.dtype, "flash_backward")  # empty_permuted(..., (0, 2, 1, 3)), whatever q's layout
        dq.perm = (0, 2, 1, 3)
        dk = empty(sk.shape, sk.dtype, "flash_backward")
        dk.perm = (0, 2, 1, 3)
        dv = empty(sv.shape, sv.dtype, "flash_backward")
        dv.perm = (0, 2, 1, 3)
        A.flash_scratch_backward(s, sq.dtype)
        return dq, dk, dv

    record("ScaledDotProductFlashAttentionForCpuBackward0", (q, k, v), (out,), back, (q, k, v, mask, out, lse))
    return out


class Attention:
    """``LlamaAttention`` (modeling_llama.py:202-265) and qwen3's per-head q/k norms."""

    norm_at = "view"
    """Where the per-head q/k norms run: on each projection's (B, S, h, d) view ("view", Qwen3), on those views once
    q, k and v are projected ("projected", GLM-4-MoE), on the transposed (B, h, S, d) states once q, k and v are
    made ("heads", EXAONE 4), or after RoPE ("rope", HunYuan-Dense)."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str, norm: type[RMSNorm] = RMSNorm):
        d, h, kv, hd = cfg.d_model, cfg.num_heads, cfg.num_kv_heads or cfg.num_heads, cfg.d_head
        self.head_dim, self.groups, self.scaling, self.attn = hd, h // kv, hd**-0.5, attn
        self.q_proj = Linear(d, h * hd, cfg.qkv_bias, dtype, name + ".q_proj")
        self.k_proj = Linear(d, kv * hd, cfg.qkv_bias, dtype, name + ".k_proj")
        self.v_proj = Linear(d, kv * hd, cfg.qkv_bias, dtype, name + ".v_proj")
        self.o_proj = Linear(h * hd, d, cfg.output_bias, dtype, name + ".o_proj")
        self.q_norm = norm(hd, dtype, name + ".q_norm") if cfg.qk_norm else None
        self.k_norm = norm(hd, dtype, name + ".k_norm") if cfg.qk_norm else None
        # HunYuan-Dense: query_layernorm / key_layernorm after RoPE (modeling_hunyuan_v1_dense.py:199-201)
        if cfg.hf_model_type == "hunyuan_v1_dense":
            self.norm_at = "rope"
        # SmolLM3: ``if self.use_rope:`` (modeling_smollm3.py ``SmolLM3Attention.forward``), set per layer by the model
        self.use_rope = True

    def params(self) -> list[Tensor]:
        out = self.q_proj.params() + self.k_proj.params() + self.v_proj.params() + self.o_proj.params()
        return out + ([self.q_norm.weight, self.k_norm.weight] if self.q_norm else [])

    def __call__(self, hidden_states: Tensor, position_embeddings, attention_mask) -> Tensor:
        input_shape = hidden_states.shape[:-1]  # :230
        hidden_shape = (*input_shape, -1, self.head_dim)
        normed = self.q_norm is not None
        q = A.view(self.q_proj(hidden_states), *hidden_shape)  # :233-235
        if normed and self.norm_at == "view":
            q = self.q_norm(q)
        k = A.view(self.k_proj(hidden_states), *hidden_shape)
        if normed and self.norm_at == "view":
            k = self.k_norm(k)
        v = A.view(self.v_proj(hidden_states), *hidden_shape)
        if normed and self.norm_at == "projected":
            q = self.q_norm(q)  # one after the other: q's input dies before k's norm runs
            k = self.k_norm(k)
        query_states, key_states, value_states = A.transpose(q, 1, 2), A.transpose(k, 1, 2), A.transpose(v, 1, 2)
        del q, k, v
        if normed and self.norm_at == "heads":
            query_states = self.q_norm(query_states)
            key_states = self.k_norm(key_states)
        if self.use_rope:
            cos, sin = position_embeddings  # :237
            query_states, key_states = self.rotate(query_states, key_states, cos, sin)  # :238
            del cos, sin
        if normed and self.norm_at == "rope":
            query_states = self.q_norm(query_states)
            key_states = self.k_norm(key_states)
        attn_output, attn_weights = self.attend(query_states, key_states, value_states, attention_mask)  # :247
        attn_output = A.contiguous(A.reshape(attn_output, *input_shape, -1))  # :258
        return self.o_proj(attn_output), attn_weights  # :259-260

    def attend(self, query: Tensor, key: Tensor, value: Tensor, attention_mask) -> tuple[Tensor, Tensor | None]:
        """The attention interface: eager or sdpa (a model's own: gpt-oss's sinks)."""
        interface = eager_attention_forward if self.attn == "naive" else sdpa_attention_forward
        return interface(self, query, key, value, attention_mask)

    def rotate(self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """``apply_rotary_pos_emb`` (a model's own: Helium's and ERNIE 4.5's interleaved pairs)."""
        return apply_rotary_pos_emb(q, k, cos, sin)


class MLP:
    """``LlamaMLP`` (modeling_llama.py:150-162); ``width``: a model's own intermediate size (a shared expert's)."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str, width: int | None = None):
        d, f = cfg.d_model, cfg.d_ff if width is None else width
        self.gate_proj = Linear(d, f, cfg.mlp_bias, dtype, name + ".gate_proj")
        self.up_proj = Linear(d, f, cfg.mlp_bias, dtype, name + ".up_proj")
        self.down_proj = Linear(f, d, cfg.mlp_bias, dtype, name + ".down_proj")

    def params(self) -> list[Tensor]:
        return self.gate_proj.params() + self.up_proj.params() + self.down_proj.params()

    def __call__(self, x: Tensor) -> Tensor:
        return self.down_proj(A.mul(A.silu(self.gate_proj(x)), self.up_proj(x)))  # :161


class GradientCheckpointingLayer:
    """transformers' ``GradientCheckpointingLayer`` (``modeling_layers.py``): with checkpointing enabled, a call
    runs ``checkpoint(partial(forward, self, **kwargs), hidden_states)``; every model's decoder layer is one."""

    gradient_checkpointing = False
    cast_inputs = None
    """FSDP2's bf16 policy casting the layer's floating inputs (``ops.fsdp.cast_floating``): a module hook, which
    transformers keeps outside the checkpoint (modeling_layers.py:85, it checkpoints ``forward``)."""

    def __call__(self, hidden_states: Tensor, **kwargs) -> Tensor:
        if self.cast_inputs is not None:
            hidden_states, kwargs = self.cast_inputs(hidden_states), {k: self.cast_inputs(v) for k, v in kwargs.items()}
        if self.gradient_checkpointing:
            return checkpoint(partial(self.forward, **kwargs), hidden_states)
        return self.forward(hidden_states, **kwargs)


class DecoderLayer(GradientCheckpointingLayer):
    """``LlamaDecoderLayer`` (modeling_llama.py:268-309); ``attention_class`` and ``mlp_class`` are a model's own
    (Phi-3's fused projections)."""

    attention_class = Attention
    mlp_class = MLP

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str, norm: type[RMSNorm] = RMSNorm):
        self.self_attn = self.attention_class(cfg, dtype, attn, name + ".self_attn", norm)
        self.mlp = self.mlp_class(cfg, dtype, name + ".mlp")
        self.input_layernorm = norm(cfg.d_model, dtype, name + ".input_layernorm")
        self.post_attention_layernorm = norm(cfg.d_model, dtype, name + ".post_attention_layernorm")

    def params(self) -> list[Tensor]:
        norms = [self.input_layernorm.weight, self.post_attention_layernorm.weight]
        return self.self_attn.params() + self.mlp.params() + norms

    def forward(
        self, hidden_states: Tensor, attention_mask=None, position_embeddings=None, position_ids=None
    ) -> Tensor:
        residual = hidden_states  # :289
        hidden_states = self.input_layernorm(hidden_states)
        # :292-300; ``_`` keeps eager's probabilities until the layer returns (a checkpointed layer saves none)
        hidden_states, _ = self.self_attn(hidden_states, position_embeddings, attention_mask)
        hidden_states = A.add(residual, hidden_states)  # :301
        residual = hidden_states  # :304
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        return A.add(residual, hidden_states)  # :307


def find_packed_sequence_indices(position_ids: Tensor) -> None:
    """``masking_utils.find_packed_sequence_indices`` (as measured on meta: ``measure.hf._unpacked_rows``):
    ``first = position_ids[:, :1] - 1``; ``position_diff = torch.diff(position_ids, prepend=first, dim=-1)``
    (a local: it lives until the return); ``(position_diff != 1).cumsum(-1)``; ``(packed[:, -1] == 0).all()``.
    Each Python number is wrapped on a plain CPU run."""
    b, s = position_ids.shape
    first = int_scalar_op((b, 1), "sub")
    joined = empty((b, s + 1), "int64", "cat")  # diff: cat(prepend, x), then a[1:] - a[:-1]
    position_diff = empty((b, s), "int64", "sub")
    del joined
    ne = int_scalar_op((b, s), "ne", "bool")
    as_long = empty((b, s), "int64", "cumsum_cast") if current().wraps else None  # the CPU kernel's int64 copy
    packed = empty((b, s), "int64", "cumsum")
    del as_long, ne
    last = int_scalar_op((b,), "eq", "bool")
    done = empty((), "bool", "all")
    del last, done, first, position_diff, packed


def int_scalar_op(shape: tuple, name: str, dtype: str = "int64") -> Tensor:
    """An op of an int64 tensor and a Python int (``position_ids + offset``, the router's ``perm // k``): the number
    wrapped (plain CPU run), the output, the wrapper freed."""
    wrapped = A.wrap_scalar("int64")
    out = empty(shape, dtype, name)
    del wrapped
    return out


def sdpa_mask(batch: Dim, seq: int, window: int | None, allow_is_causal_skip: bool) -> Tensor | None:
    """``masking_utils.sdpa_mask`` (no padding): None where sdpa's ``is_causal`` serves (no window reaching
    the sequence, ``_ignore_causal_mask_sdpa``), else the (1, 1, S, S) bool mask expanded to (B, 1, S, S).
    The mask function is ``causal_mask_function`` (``kv_idx <= q_idx``) or, with a window,
    ``and_masks(sliding_window_overlay(w), causal_mask_function)``: ``new_ones((), bool)``, then ``result &
    (kv_idx > q_idx - w)`` and ``result & (kv_idx <= q_idx)``."""
    if allow_is_causal_skip and (window is None or seq < window):
        return None
    batch_arange = empty((batch,), "int64", "arange")
    head_arange = empty((1,), "int64", "arange")
    q_arange = arange_plus(seq)
    kv_arange = arange_plus(seq)
    if window is None:
        mask = empty((1, 1, seq, seq), "bool", "le")
    else:
        result = empty((), "bool", "new_ones")
        shifted = empty((1, 1, seq, 1), "int64", "sub")  # q_idx - sliding_window
        inside = empty((1, 1, seq, seq), "bool", "gt")
        del shifted
        result = _and(result, inside)
        del inside
        causal = empty((1, 1, seq, seq), "bool", "le")
        mask = _and(result, causal)
        del result, causal
    del batch_arange, head_arange, q_arange, kv_arange
    return A.expand(mask, batch, -1, seq, seq)


def _and(a: Tensor, b: Tensor) -> Tensor:
    return empty(A.broadcast(a.shape, b.shape), "bool", "bitwise_and")


def eager_mask(batch: Dim, seq: int, dtype: str, window: int | None) -> Tensor:
    """``masking_utils.eager_mask``: ``sdpa_mask`` without the skip, then ``torch.where(mask, zeros((),
    dtype), min_dtype)``: the (B, 1, S, S) additive mask."""
    mask = sdpa_mask(batch, seq, window, allow_is_causal_skip=False)
    zeros = empty((), dtype, "zeros")
    low = empty((), dtype, "scalar_tensor")
    out = empty(mask.shape, dtype, "where")
    del zeros, low, mask
    return out


def windowed_masks(
    batch: Dim, seq: int, dtype: str, attention: str, window: int | None, windowed: bool = True
) -> dict[bool, Tensor | None]:
    """The full-attention mask and the sliding-window one, by "windowed", as the models with both layer types build
    them every forward (``create_causal_mask``, then ``create_sliding_window_causal_mask``: Gemma 2/3, OLMo-3);
    the full one only where not ``windowed``."""
    make = (
        (lambda w: eager_mask(batch, seq, dtype, w))
        if attention == "naive"
        else (lambda w: sdpa_mask(batch, seq, w, True))
    )
    full = make(None)
    return {False: full, True: make(window)} if windowed else {False: full}


def arange_plus(n: int) -> Tensor:
    """``torch.arange(n) + offset``: the arange dies once added to."""
    a = empty((n,), "int64", "arange")
    out = int_scalar_op((n,), "add")
    del a
    return out


class LlamaForCausalLM:
    """``LlamaForCausalLM`` with ``LlamaModel`` (modeling_llama.py:333-480), labels given: one training step's
    forward and loss (``loss()``), its parameters in ``model.parameters()`` order, its buffers and inputs."""

    def __init__(
        self, cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B, norm: type[RMSNorm] = RMSNorm
    ):
        dtype = DTYPES[setup.precision]
        self.cfg, self.seq, self.batch, self.setup, self.dtype = cfg, seq, batch, setup, dtype
        self.embed_tokens = parameter((cfg.vocab_size, cfg.d_model), dtype, "embed_tokens.weight")
        self.layers = [self.decoder_layer(f"layers.{i}", norm) for i in range(cfg.num_layers)]
        for i, layer in enumerate(self.layers):
            layer.gradient_checkpointing = setup.checkpoint == "full"
            if i in cfg.nope_layers:  # SmolLM3's NoPE layers, EXAONE 4's global ones (``ModelConfig.nope_layers``)
                layer.self_attn.use_rope = False
        self.norm = norm(cfg.d_model, dtype, "norm")
        half = self.rotary_pairs()
        self.inv_freq = empty((half,), "fp32", "inv_freq")  # buffers: inv_freq, original_inv_freq
        self.original_inv_freq = empty((half,), "fp32", "original_inv_freq")
        self.lm_head = None if cfg.tie_embeddings else parameter((cfg.vocab_size, cfg.d_model), dtype, "lm_head.weight")
        self.input_ids = empty((batch, seq), "int64", "input_ids")
        self.labels = empty((batch, seq), "int64", "labels")

    lm_head_bias: Tensor | None = None
    """The LM head's bias (a model's own: ERNIE 4.5-MoE's ``use_bias``)."""
    masks_see_positions = True
    """Whether the mask functions get ``position_ids`` and so look for packed sequences (gpt-oss passes none)."""

    def rotary_pairs(self) -> int:
        """The rotary table's frequencies (``inv_freq``): one per pair of a head (a model's own: GLM's rotated part)."""
        return self.cfg.d_head // 2

    def decoder_layer(self, name: str, norm: type[RMSNorm]) -> GradientCheckpointingLayer:
        """The model's decoder layer (a subclass's own: OLMo-2's, Phi-3's)."""
        return DecoderLayer(self.cfg, self.dtype, self.setup.attention, name, norm)

    def parameters(self) -> list[Tensor]:
        out = [self.embed_tokens]
        for layer in self.layers:
            out += layer.params()
        out.append(self.norm.weight)
        return out + [t for t in (self.lm_head, self.lm_head_bias) if t is not None]

    def model(self) -> Tensor:
        """``LlamaModel.forward`` (modeling_llama.py:370-420)."""
        inputs_embeds = self.embed()  # :384
        position_ids = A.unsqueeze(arange_plus(self.seq), 0)  # :391-393
        if self.masks_see_positions:
            with no_grad():
                find_packed_sequence_indices(A.expand(position_ids, self.batch, -1))
        masks = self.masks()  # :395-401
        inputs_embeds = self.scale_embeddings(inputs_embeds)
        hidden_states = inputs_embeds  # :403; ``inputs_embeds`` keeps the lookup until the forward returns
        position_embeddings = self.rotary(hidden_states, position_ids)  # :404
        kwargs = [
            dict(attention_mask=masks[w], position_embeddings=position_embeddings, position_ids=position_ids)
            for w in (False, True)
        ]
        hidden_states = self.run_layers(hidden_states, lambda i: kwargs[self.cfg.layer_windowed(i)])  # :406-414
        return self.norm(hidden_states)  # :416

    def rotary(self, hidden_states: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        """``self.rotary_emb(hidden_states, position_ids)`` (a model's own: ERNIE 4.5's stays fp32)."""
        return rotary_embedding(hidden_states, position_ids, self.inv_freq)

    def masks(self) -> dict[bool, Tensor | None]:
        """The attention masks, by whether a layer is windowed (``create_causal_mask``, or Mistral's
        ``create_sliding_window_causal_mask`` for all)."""
        window = self.cfg.sliding_window  # mistral: create_sliding_window_causal_mask
        if self.cfg.hf_model_type == "ministral":  # both masks, each layer its type's (modeling_ministral.py:386-397)
            return windowed_masks(self.batch, self.seq, self.dtype, self.setup.attention, window)
        if self.setup.attention == "naive":  # :395-401
            return dict.fromkeys((False, True), eager_mask(self.batch, self.seq, self.dtype, window))
        return dict.fromkeys((False, True), sdpa_mask(self.batch, self.seq, window, allow_is_causal_skip=True))

    def embed(self) -> Tensor:
        """``self.embed_tokens(input_ids)`` (a subclass scales it: Granite)."""
        return self.lookup()

    def lookup(self) -> Tensor:
        """The ``embed_tokens`` module's output (tensor parallel's own: ``ops.tp``)."""
        return A.embedding(self.embed_tokens, self.input_ids)

    def scale_embeddings(self, inputs_embeds: Tensor) -> Tensor:
        """The embeddings once the masks are made (a subclass scales them there: Granite-MoE's multiplier)."""
        return inputs_embeds

    def run_layers(self, hidden_states: Tensor, kwargs: Callable[[int], dict]) -> Tensor:
        """The decoder layers in order, layer i called with ``kwargs(i)``; each run of alike middle layers (the same
        kind: a mixture of experts or not, a window or not) replayed once for all (``alike_runs``, ``repeated``),
        cut where FSDP2's units before or after a layer differ (``split_runs``: Llama 4's or Qwen's dense layers
        between sparse ones, every 3rd or more)."""
        for first, times in split_runs(alike_runs(self.cfg)):
            with repeated(times):
                hidden_states = self.layers[first](hidden_states, **kwargs(first))
        return hidden_states

    def forward(self) -> tuple[Tensor, Tensor]:
        """``LlamaForCausalLM.forward`` (:448-470) with labels: (logits, loss), the ``CausalLMOutputWithPast``
        the step keeps; ``hidden_states`` dies when it returns (an fp32 tensor under autocast, where the LM
        head saves its bf16 copy instead)."""
        hidden_states = self.model()
        logits = self.head(self.lm_head_logits(hidden_states))
        loss = for_causal_lm_loss(logits, self.labels, self.cfg.vocab_size)
        return logits, loss

    def lm_head_logits(self, hidden_states: Tensor) -> Tensor:
        """The ``lm_head`` module's output (tensor parallel's own: ``ops.tp``)."""
        weight = self.lm_head if self.lm_head is not None else self.embed_tokens
        return A.linear(hidden_states, weight, self.lm_head_bias)

    def head(self, logits: Tensor) -> Tensor:
        """The LM head's output as the loss takes it (a subclass scales it: Granite)."""
        return logits

    def loss(self) -> Tensor:
        """``measure.hf.HFTrainingStep.forward``: the model's output, then its loss.  amp-bf16 runs the model
        under autocast (accelerate's ``convert_outputs_to_fp32(autocast(forward))``), the region's weight
        cache dropped at its exit, then the bf16 logits copied to fp32 (the old ones die) before the
        output is dropped."""
        amp = self.setup.autocast
        with autocast_or_not("bf16" if amp else None):
            logits, loss = self.forward()
        if amp:
            logits = A.to(logits, "fp32")
        del logits
        return loss


def head_and_loss(hidden_states: Tensor, head: Tensor, labels: Tensor, vocab_size: int) -> tuple[Tensor, Tensor]:
    """``*ForCausalLM.forward``'s end: the head on an alias of the normed states (``slice_logits_to_keep(.., 0)``)
    and ``ForCausalLMLoss``: (logits, loss)."""
    hidden_states = A.view(hidden_states, *hidden_states.shape)
    logits = A.linear(hidden_states, head)
    return logits, for_causal_lm_loss(logits, labels, vocab_size)


def for_causal_lm_loss(logits: Tensor, labels: Tensor, vocab_size: int) -> Tensor:
    """``ForCausalLMLoss`` (``loss/loss_utils.py``): ``logits.float()`` (a copy under autocast); the labels
    padded by one and shifted (``contiguous``: a copy); ``fixed_cross_entropy`` (reduction mean).  Its
    locals die at return in this order: the float logits, then the padded labels."""
    logits = A.to(logits, "fp32")
    b, s = labels.shape
    labels = empty((b, s + 1), "int64", "constant_pad_nd")
    # labels[..., 1:].contiguous(): a copy, except for one row, where the slice is already contiguous
    shift_labels = labels.alias((b, s)) if isinstance(b, int) and b == 1 else empty((b, s), "int64", "clone")
    logits = A.view(logits, -1, vocab_size)
    return A.cross_entropy(logits, shift_labels)


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B) -> LlamaForCausalLM:
    """The program of ``ops.transformers.predict_step``."""
    return LlamaForCausalLM(cfg, seq, setup, batch)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = []
    if setup.checkpoint == "selective":
        out.append("transformers has no selective activation checkpointing")
    if cfg.moe or cfg.kv_lora_rank is not None:
        out.append("mixture of experts or MLA in the llama family")
    if cfg.norm != "rmsnorm" or cfg.norm_placement != "pre" or cfg.mlp != "swiglu" or cfg.positions != "rope":
        out.append("a llama-family model with another norm, MLP or positions")
    if cfg.qk_norm and cfg.qk_norm_scope != "head":
        out.append("qk-norm over the whole projection")
    unset = [k for k in SEED_OSS_DROPOUT if k not in dict(cfg.dropout)] if cfg.hf_model_type == "seed_oss" else []
    if unset:  # p > 0 given is refused by ``hf_config.unmodelled_dropout``
        out.append(f"Seed-OSS's {' and '.join(unset)} at its class's 0.1 (the config.json does not set 0)")
    return out


def fp32_logits_loss(program) -> Tensor:
    """``LlamaForCausalLM.loss`` for a program whose ``forward`` returns fp32 logits already (``.float()`` in the
    head: Mamba's, Mamba2's, Nemotron-H's): amp-bf16 runs the forward under autocast; the logits die first."""
    with autocast_or_not("bf16" if program.setup.autocast else None):
        logits, loss = program.forward()
    del logits
    return loss
