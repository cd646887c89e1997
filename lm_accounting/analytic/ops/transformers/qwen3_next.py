"""transformers 5.24's ``Qwen3NextForCausalLM`` training step, transliterated
(``models/qwen3_next/modeling_qwen3_next.py``, line numbers of transformers 5.24).

The model and its loss are Llama's (``llama.py``: ``create_causal_mask``; ``create_recurrent_attention_mask`` is
None without an ``attention_mask``, masking_utils.py:1516), the norms Gemma's (1 + w) RMSNorm (``Qwen3NextRMSNorm``
:126-140 is ``gemma.RMSNorm``), the dense MLP Llama's, the sparse block Qwen2-MoE's (``qwen2_moe.SparseMoeBlock``:
router, grouped_mm experts, a sigmoid-gated shared expert, :849-868).  What Qwen3-Next adds:

* ``Qwen3NextAttention`` (:229-304): ``q_proj`` twice as wide, viewed (B, S, h, 2·d) and chunked into the query and
  the gate (``gate.reshape``: a copy), per-head q/k norms, RoPE on the first ``rope_dim`` of each head (GLM's
  ``apply_rotary_pos_emb``, :154-189: the rotated share concatenated back), then ``o_proj(attn_output *
  sigmoid(gate))``;
* ``Qwen3NextGatedDeltaNet`` (:583-769) on the layers ``layer_types`` names ``linear_attention``, run as transformers
  runs it in training without the fla and causal_conv1d kernels: ``in_proj_qkvz`` and ``in_proj_ba``, the
  reordering (``fix_query_key_value_ordering``: splits and reshapes), ``causal_conv1d_fn`` (:340-359, a depthwise
  ``F.conv1d`` sliced to S, SiLU), ``beta = sigmoid(b)``, ``g = -exp(A_log) * softplus(a + dt_bias)``,
  ``torch_chunk_gated_delta_rule`` (:371-509, chunks of 64 positions, ``chunk_gated_delta_rule``) and the gated
  RMSNorm (``Qwen3NextRMSNormGated`` :59-75) before ``out_proj``.
The new aten ops are ``ops.aten_recurrent``'s, beside the Mamba2 scan's ``ops.aten_scan`` (pad, cumsum, masked fill,
softplus, the depthwise conv1d).
"""

from __future__ import annotations

from collections.abc import Callable

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from .. import aten_recurrent as R
from .. import aten_scan as S
from ..aten_index import split_with_sizes
from ..aten_pointwise import exp, sigmoid
from ..aten_split import chunk
from ..engine import Affine
from ..tensors import Tensor, current, empty, parameter, record, repeated
from . import llama, moe, qwen2_moe
from .gemma import RMSNorm
from .glm import rotary_parts
from .llama import MLP, B, Linear

CHUNK = 64
"""``torch_chunk_gated_delta_rule``'s ``chunk_size`` (the default, :377)."""


class Attention(llama.Attention):
    """``Qwen3NextAttention``: gated attention with per-head q/k norms and partial RoPE."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str, norm=RMSNorm):
        d, h, kv, hd = cfg.d_model, cfg.num_heads, cfg.num_kv_heads or cfg.num_heads, cfg.d_head
        self.head_dim, self.groups, self.scaling, self.attn = hd, h // kv, hd**-0.5, attn
        self.q_proj = Linear(d, h * hd * 2, False, dtype, name + ".q_proj")
        self.k_proj = Linear(d, kv * hd, False, dtype, name + ".k_proj")
        self.v_proj = Linear(d, kv * hd, False, dtype, name + ".v_proj")
        self.o_proj = Linear(h * hd, d, False, dtype, name + ".o_proj")
        self.q_norm = norm(hd, dtype, name + ".q_norm")
        self.k_norm = norm(hd, dtype, name + ".k_norm")
        self.use_rope = True

    def __call__(self, hidden_states: Tensor, position_embeddings, attention_mask) -> tuple[Tensor, Tensor | None]:
        input_shape = hidden_states.shape[:-1]  # :267
        hidden_shape = (*input_shape, -1, self.head_dim)
        query_states, gate = chunk(A.view(self.q_proj(hidden_states), *input_shape, -1, self.head_dim * 2), 2, -1)
        gate = copied(gate, *input_shape, -1)  # :273 (a strided half: a copy)
        query_states = A.transpose(self.q_norm(A.view(query_states, *hidden_shape)), 1, 2)  # :275
        key_states = A.transpose(self.k_norm(A.view(self.k_proj(hidden_states), *hidden_shape)), 1, 2)
        value_states = A.transpose(A.view(self.v_proj(hidden_states), *hidden_shape), 1, 2)
        cos, sin = position_embeddings  # :279
        query_states, key_states = self.rotate(query_states, key_states, cos, sin)
        del cos, sin
        attn_output, attn_weights = self.attend(query_states, key_states, value_states, attention_mask)  # :289
        attn_output = A.contiguous(A.reshape(attn_output, *input_shape, -1))  # :300
        attn_output = A.mul(attn_output, sigmoid(gate))  # :301
        return self.o_proj(attn_output), attn_weights

    def rotate(self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """``apply_rotary_pos_emb`` (:154-189): the rotated share of q concatenated back before k's."""
        q_rot, q_pass = rotary_parts(q, cos.shape[-1])
        k_rot, k_pass = rotary_parts(k, cos.shape[-1])
        q_embed, k_embed = llama.apply_rotary_pos_emb(q_rot, k_rot, cos, sin)
        del q_rot, k_rot
        q_embed = A.cat((q_embed, q_pass), -1)
        k_embed = A.cat((k_embed, k_pass), -1)
        return q_embed, k_embed


def to_contiguous(t: Tensor, dtype: str, channels_last: bool = False) -> Tensor:
    """``t.to(dtype, memory_format=torch.contiguous_format)``: ``t`` itself when the dtype agrees and
    ``suggest_memory_format`` is not channels-last (``to_will_alias``), else ``_to_copy`` into a contiguous tensor.
    ``channels_last``: the caller's knowledge of ``t``'s strides (the rule of ``is_channels_last_strides_2d``)."""
    if t.dtype == dtype and not channels_last:
        return t
    out = empty(t.shape, dtype, "_to_copy")
    src = t.dtype
    record("ToCopyBackward0", (t,), (out,), lambda ctx, g: (A.to(g[0], src),))
    return out


def l2norm(x: Tensor) -> Tensor:
    """:364-367: ``x * rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)``."""
    inv_norm = A.rsqrt(A.add(A.sum_(A.mul(x, x), -1, keepdim=True), 1e-6))
    return A.mul(x, inv_norm)


def repeat_heads(t: Tensor, n: int) -> Tensor:
    """``t.repeat_interleave(n, dim=2)`` of (B, S, h, d): an expand of an unsqueezed view, a contiguous clone."""
    b, s, h, d = t.shape
    return A.view(A.clone(A.expand(A.unsqueeze(t, 3), b, s, h, n, d), contiguous=True), b, s, h * n, d)


def chunk_gated_delta_rule(query, key, value, g, beta, seq: int) -> Tensor:
    """``torch_chunk_gated_delta_rule`` (:371-509) with ``use_qk_l2norm_in_kernel``, no initial state, no final
    state kept: (B, S, H_v, d_v) in the query's dtype.  Its locals live until it returns, as in Python."""
    initial_dtype = query.dtype  # :400
    num_k_heads, num_v_heads = key.shape[2], value.shape[2]
    if num_k_heads != num_v_heads:  # :408-410
        query = repeat_heads(query, num_v_heads // num_k_heads)
        key = repeat_heads(key, num_v_heads // num_k_heads)
    query, key, value, beta, decay = [to_contiguous(A.transpose(x, 1, 2), "fp32") for x in (query, key, value, beta, g)]
    query = l2norm(query)  # :418-420
    key = l2norm(key)
    query = A.mul(query, query.shape[-1] ** -0.5)  # :422-423
    pad_size = (CHUNK - seq % CHUNK) % CHUNK  # :426-428
    query, key, value = (S.constant_pad_nd(x, 2, 0, pad_size) for x in (query, key, value))
    beta, decay = (S.constant_pad_nd(x, 2, 0, pad_size) for x in (beta, decay))
    v_beta = A.mul(value, A.unsqueeze(beta, -1))  # :435-436
    k_beta = A.mul(key, A.unsqueeze(beta, -1))
    b, h = query.shape[0], query.shape[1]
    query, key, k_beta, v_beta = [A.reshape(x, b, h, -1, CHUNK, x.shape[-1]) for x in (query, key, k_beta, v_beta)]
    decay = A.reshape(decay, b, h, -1, CHUNK)  # :442
    num_chunks = decay.shape[2]
    strictly_upper_mask = R.upper_mask(CHUNK)  # :445
    cum_decay = S.cumsum(decay, 3)  # :449
    pairwise_decay = A.sub(A.unsqueeze(cum_decay, 4), A.unsqueeze(cum_decay, 3))  # :454-456
    pairwise_decay = S.masked_fill(pairwise_decay, strictly_upper_mask, 0.0)
    pairwise_decay = exp(pairwise_decay)
    ut_system = A.mul(A.matmul(k_beta, A.transpose(key, -1, -2)), pairwise_decay)  # :459-461
    intra_chunk_attn = A.mul(A.matmul(query, A.transpose(key, -1, -2)), pairwise_decay)
    decayed_k_beta = A.mul(k_beta, A.unsqueeze(exp(cum_decay), -1))
    new_values = R.solve_triangular(ut_system, v_beta)  # :470-471
    k_cumdecay = R.solve_triangular(ut_system, decayed_k_beta)
    # the loop's locals, rebound by each iteration and alive until the function returns: the recurrent state (:482,
    # zeros), ``v_new`` (saved by its products anyway) and ``inter_chunk_attn`` (a chunk's bytes, freed when rebound)
    state = [empty((b, h, key.shape[-1], new_values.shape[-1]), "fp32", "zeros"), None, None]
    core_attn_out = empty(new_values.shape, new_values.dtype, "zeros_like", like=new_values)  # :485
    query = A.mul(query, A.unsqueeze(exp(cum_decay), -1))  # :488-490
    key = A.mul(key, A.unsqueeze(exp(A.sub(A.slice_(cum_decay, 3, CHUNK - 1, CHUNK), cum_decay)), -1))
    chunk_decay = A.unsqueeze(A.unsqueeze(exp(A.select(cum_decay, 3, -1)), 3), 4)

    def chunk_step(i: int) -> None:  # :493-500
        last = state[0]
        state[1] = A.sub(A.select(new_values, 2, i), A.matmul(A.select(k_cumdecay, 2, i), last))
        state[2] = A.matmul(A.select(query, 2, i), last)
        R.copy_into_select(core_attn_out, A.add(state[2], A.matmul(A.select(intra_chunk_attn, 2, i), state[1])))
        decayed = A.mul(last, A.select(chunk_decay, 2, i))
        state[0] = A.add(decayed, A.matmul(A.transpose(A.select(key, 2, i), -1, -2), state[1]))
        del last, decayed

    if num_chunks < 6 or current().segment is not None:
        for i in range(num_chunks):
            chunk_step(i)
    else:  # the middle chunks alike, replayed once (``repeated``), two alone at each end: the first reads a zero
        # state, so the second's products are the last to hold views of ``query`` and ``key`` (their bytes die
        # there); the last's new state is dropped, so the one before it fills the gradient buffers of ``key`` and
        # ``chunk_decay`` that the middle ones add to
        chunk_step(0)
        chunk_step(1)
        with repeated(num_chunks - 4):
            chunk_step(2)
        chunk_step(num_chunks - 2)
        chunk_step(num_chunks - 1)
    state[0] = None  # :503
    core_attn_out = A.reshape(core_attn_out, b, h, -1, core_attn_out.shape[-1])  # :505-508
    if pad_size:  # ``[:, :, :sequence_length]`` of the whole dim is the tensor itself (``applySlicing``)
        core_attn_out = A.slice_(core_attn_out, 2, 0, seq)
    # one chunk: the view keeps the solve's column-major layout, (B, S, H, d) strided as channels-last (a copy even
    # in fp32); more: the reshape copied (dense), the transpose is no channels-last layout
    core_attn_out = to_contiguous(A.transpose(core_attn_out, 1, 2), initial_dtype, num_chunks == 1)
    return core_attn_out


def decay(a_log: Tensor, a: Tensor, dt_bias: Tensor) -> Tensor:
    """:727: ``-A_log.float().exp() * F.softplus(a.float() + dt_bias)``."""
    return A.mul(A.neg(exp(A.to(a_log, "fp32"))), S.softplus(A.add(A.to(a, "fp32"), dt_bias)))


def copied(part: Tensor, *shape) -> Tensor:
    """``part.reshape(*shape)`` (no -1) of a part of a split across the last dim of a dense tensor: a view where the
    new shape keeps the part's rows whole (its width the product of trailing new dims, or 1), else
    ``_unsafe_view(clone)``."""
    width, trailing = part.shape[-1], 1
    for d in reversed(shape):
        if trailing == width:
            break
        trailing = d * trailing
    if width == 1 or trailing == width:
        return A.view(part, *shape)
    return A.unsafe_view(A.clone(part, contiguous=True), *shape)


class RMSNormGated:
    """``Qwen3NextRMSNormGated`` (:59-75): Llama's RMSNorm, then ``* silu(gate.float())``, cast back."""

    def __init__(self, size: int, dtype: str, name: str):
        self.weight = parameter((size,), dtype, name + ".weight")

    def __call__(self, hidden_states: Tensor, gate: Tensor) -> Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = A.to(hidden_states, "fp32")
        variance = A.mean(A.pow_(hidden_states, 2), -1, keepdim=True)
        hidden_states = A.mul(hidden_states, A.rsqrt(A.add(variance, 1e-6)))
        hidden_states = A.mul(self.weight, A.to(hidden_states, input_dtype))
        hidden_states = A.mul(hidden_states, A.silu(A.to(gate, "fp32")))
        return A.to(hidden_states, input_dtype)


class GatedDeltaNet:
    """``Qwen3NextGatedDeltaNet`` (:583-769) in training: no cache, no padding mask."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.num_v_heads, self.num_k_heads = cfg.linear_value_heads, cfg.linear_key_heads
        self.head_k_dim, self.head_v_dim = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.key_dim, self.value_dim = cfg.linear_key_dim, self.head_v_dim * self.num_v_heads
        self.conv_kernel_size = cfg.linear_conv_kernel
        self.conv_dim = self.key_dim * 2 + self.value_dim
        d = cfg.d_model
        # ``named_parameters`` order: the module's own (dt_bias, A_log), then its children's
        self.dt_bias = parameter((self.num_v_heads,), dtype, name + ".dt_bias")
        self.A_log = parameter((self.num_v_heads,), dtype, name + ".A_log")
        self.conv1d_weight = parameter((self.conv_dim, 1, self.conv_kernel_size), dtype, name + ".conv1d.weight")
        self.in_proj_qkvz = Linear(d, self.key_dim * 2 + self.value_dim * 2, False, dtype, name + ".in_proj_qkvz")
        self.in_proj_ba = Linear(d, self.num_v_heads * 2, False, dtype, name + ".in_proj_ba")
        self.norm = RMSNormGated(self.head_v_dim, dtype, name + ".norm")
        self.out_proj = Linear(self.value_dim, d, False, dtype, name + ".out_proj")

    def params(self) -> list[Tensor]:
        own = [self.dt_bias, self.A_log, self.conv1d_weight]
        return own + self.in_proj_qkvz.params() + self.in_proj_ba.params() + [self.norm.weight] + self.out_proj.params()

    def fix_query_key_value_ordering(self, mixed_qkvz: Tensor, mixed_ba: Tensor) -> tuple:
        """:629-656."""
        r = self.num_v_heads // self.num_k_heads
        lead = mixed_qkvz.shape[:-1]
        mixed_qkvz = A.view(mixed_qkvz, *lead, self.num_k_heads, 2 * self.head_k_dim + 2 * self.head_v_dim * r)
        mixed_ba = A.view(mixed_ba, *lead, self.num_k_heads, 2 * r)
        sizes = [self.head_k_dim, self.head_k_dim, r * self.head_v_dim, r * self.head_v_dim]
        query, key, value, z = split_with_sizes(mixed_qkvz, sizes, 3)
        b, a = split_with_sizes(mixed_ba, [r, r], 3)
        value = copied(value, *lead, self.num_v_heads, self.head_v_dim)
        z = copied(z, *lead, self.num_v_heads, self.head_v_dim)
        b = copied(b, *lead, self.num_v_heads)
        a = copied(a, *lead, self.num_v_heads)
        return query, key, value, z, b, a

    def __call__(self, hidden_states: Tensor) -> Tensor:
        """:660-769; its locals (the projections, b, a, beta, g) live until it returns, as in Python."""
        seq_len = hidden_states.shape[1]  # :670
        projected_states_qkvz = self.in_proj_qkvz(hidden_states)  # :678-680
        projected_states_ba = self.in_proj_ba(hidden_states)
        query, key, value, z, b, a = self.fix_query_key_value_ordering(projected_states_qkvz, projected_states_ba)
        # :681: the split parts are strided (a copy); value is already dense unless it is a part (one value head a key)
        r = self.num_v_heads // self.num_k_heads
        query, key = (copied(x, x.shape[0], x.shape[1], self.key_dim) for x in (query, key))
        value = A.reshape(value, *value.shape[:2], -1) if r > 1 else copied(value, *value.shape[:2], self.value_dim)
        mixed_qkv = A.cat((query, key, value), -1)  # :683-684
        mixed_qkv = A.transpose(mixed_qkv, 1, 2)
        mixed_qkv = self.causal_conv1d_fn(mixed_qkv)  # :699-705
        mixed_qkv = A.transpose(mixed_qkv, 1, 2)  # :711
        query, key, value = split_with_sizes(mixed_qkv, [self.key_dim, self.key_dim, self.value_dim], -1)
        query = A.reshape(query, query.shape[0], query.shape[1], -1, self.head_k_dim)  # :721-723
        key = A.reshape(key, key.shape[0], key.shape[1], -1, self.head_k_dim)
        value = A.reshape(value, value.shape[0], value.shape[1], -1, self.head_v_dim)
        beta = sigmoid(b)  # :725
        g = decay(self.A_log, a, self.dt_bias)  # :727
        core_attn_out = chunk_gated_delta_rule(query, key, value, g, beta, seq_len)  # :743-754
        z_shape_og = z.shape  # :760-766
        core_attn_out = A.reshape(core_attn_out, -1, core_attn_out.shape[-1])
        z = A.reshape(z, -1, z.shape[-1])
        core_attn_out = self.norm(core_attn_out, z)
        core_attn_out = A.reshape(core_attn_out, *z_shape_og)
        core_attn_out = A.reshape(core_attn_out, core_attn_out.shape[0], core_attn_out.shape[1], -1)
        output = self.out_proj(core_attn_out)  # :768
        return output

    def causal_conv1d_fn(self, hidden_states: Tensor) -> Tensor:
        """:340-359 (activation silu), on ``self.conv1d.weight.squeeze(1)``."""
        return S.causal_conv1d(hidden_states, A.squeeze(self.conv1d_weight, 1), None, activation=True)


class SparseMoeBlock(qwen2_moe.SparseMoeBlock):
    """``Qwen3NextSparseMoeBlock`` (:849-868): Qwen2-MoE's, the same forward and registration order."""


class DecoderLayer(llama.GradientCheckpointingLayer):
    """``Qwen3NextDecoderLayer`` (:871-937): the token mixer of the layer's type, then the dense or sparse MLP."""

    mixer_class = GatedDeltaNet
    """The linear layers' token mixer (a model's own: Qwen3.5's unfused projections)."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str, attention: bool, sparse: bool):
        self.attention = attention
        if attention:
            self.self_attn = Attention(cfg, dtype, attn, name + ".self_attn")
        else:
            self.linear_attn = self.mixer_class(cfg, dtype, name + ".linear_attn")
        self.mlp = SparseMoeBlock(cfg, dtype, name + ".mlp") if sparse else MLP(cfg, dtype, name + ".mlp")
        self.input_layernorm = RMSNorm(cfg.d_model, dtype, name + ".input_layernorm")
        self.post_attention_layernorm = RMSNorm(cfg.d_model, dtype, name + ".post_attention_layernorm")

    def params(self) -> list[Tensor]:
        mixer = self.self_attn.params() if self.attention else self.linear_attn.params()
        norms = [self.input_layernorm.weight, self.post_attention_layernorm.weight]
        return mixer + self.mlp.params() + norms

    def forward(
        self, hidden_states: Tensor, attention_mask=None, position_embeddings=None, position_ids=None
    ) -> Tensor:
        residual = hidden_states  # :903
        hidden_states = self.input_layernorm(hidden_states)
        if self.attention:
            hidden_states, _ = self.self_attn(hidden_states, position_embeddings, attention_mask)  # :917
        else:
            hidden_states = self.linear_attn(hidden_states)  # :909
        hidden_states = A.add(residual, hidden_states)  # :926
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        return A.add(residual, hidden_states)  # :935


class Qwen3NextForCausalLM(llama.LlamaForCausalLM):
    """``Qwen3NextForCausalLM`` with ``Qwen3NextModel`` (:975-1050) without ``output_router_logits``."""

    def __init__(self, cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B):
        super().__init__(cfg, seq, setup, batch, RMSNorm)

    def rotary_pairs(self) -> int:
        return self.cfg.rope_dim // 2

    layer_class = DecoderLayer

    def decoder_layer(self, name: str, norm) -> DecoderLayer:
        i = int(name.rsplit(".", 1)[1])
        cfg = self.cfg
        return self.layer_class(cfg, self.dtype, self.setup.attention, name, cfg.layer_attention(i), cfg.layer_moe(i))

    def masks(self) -> dict[bool, Tensor | None]:
        """``create_causal_mask`` only (the recurrent one is None)."""
        if self.setup.attention == "naive":
            return dict.fromkeys((False, True), llama.eager_mask(self.batch, self.seq, self.dtype, None))
        return dict.fromkeys((False, True), llama.sdpa_mask(self.batch, self.seq, None, allow_is_causal_skip=True))

    def run_layers(self, hidden_states: Tensor, kwargs: Callable[[int], dict]) -> Tensor:
        """The decoder layers in order, each replayed (no run of alike layers stands for others: the linear layers'
        chunk loops are the ones replayed once for their middle chunks, ``chunk_gated_delta_rule``)."""
        for i, layer in enumerate(self.layers):
            args = kwargs(i)
            if not self.cfg.layer_attention(i):  # ``create_recurrent_attention_mask``'s None (a checkpoint holds
                args = {**args, "attention_mask": None}  # what it gets)
            hidden_states = layer(hidden_states, **args)
        return hidden_states


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B) -> Qwen3NextForCausalLM:
    """The program of ``ops.transformers.predict_step``."""
    return Qwen3NextForCausalLM(cfg, seq, setup, batch)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = moe.unsupported(cfg, setup)
    if cfg.sliding_window is not None:
        out.append("a qwen3_next model with a window")
    return out
