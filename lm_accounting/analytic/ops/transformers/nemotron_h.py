"""transformers 5.24's ``NemotronHForCausalLM`` training step, transliterated (``models/nemotron_h/
modeling_nemotron_h.py``, line numbers of transformers 5.24).

One ``NemotronHBlock`` (:934-993) per letter of the layer pattern: ``x + mixer(norm(x))``, the norm a
``NemotronHRMSNorm`` (:617-636: the weight multiplied in fp32, the product cast back) and the mixer

* ``M``: ``NemotronHMamba2Mixer`` (:390-614) on its PyTorch path, the one training takes without the CUDA kernels
  (``mamba2_split_conv1d_scan_combined`` returns None): ``in_proj``; ``A = -exp(A_log.float())``; the split into
  the gate z, x·B·C and dt; ``causal_conv1d_fn`` (:163-184: a depthwise ``F.conv1d`` padded by K − 1, cut to S,
  SiLU); the split into x, B and C; ``mamba2_chunk_scan`` (:274-387: dt + dt_bias, softplus, clamp, B and C
  repeated per head in fp32, the D residual, the sequence padded to a multiple of the chunk, ``segment_sum``,
  the four einsums of the SSD scan, the inter-chunk recurrence, the padding cut off); the gated RMSNorm per group
  (``NemotronHRMSNormGated``, :56-74); ``out_proj``;
* ``*``: ``NemotronHAttention`` (:871-931): Llama's attention without RoPE and without biases (``llama.Attention``
  with ``use_rope`` off), eager or sdpa;
* ``-``: ``NemotronHMLP`` (:639-651): ``up_proj``, the activation (``relu2``: ``torch.square`` of the ReLU),
  ``down_proj``;
* ``E``: ``NemotronHMoE`` (:715-756): DeepSeek-V3's router (``deepseek.TopkRouter``), gate-less experts under
  grouped_mm between the latent projections (``moe_latent_size``), a shared ``NemotronHMLP``.

The model (:1076-1155): the embedding, ``position_ids`` = ``arange(S) + 0``, ``create_causal_mask`` (with the
packed-sequence check) for the attention layers and ``create_recurrent_attention_mask`` (None without a padding
mask) for the Mamba2 ones, the blocks, ``norm_f``; ``NemotronHForCausalLM`` (:1158-1227): ``lm_head(h).float()``
then ``ForCausalLMLoss``.

On a GPU (the plain cuda run) the same program takes the CUDA target's kernel facts (``ops.cuda``): transformers'
PyTorch path as it runs where the mamba_ssm and causal-conv1d packages are not installed (with them transformers
takes their fused kernels, not modelled); not validated on a GPU.

amp-bf16 (``llama.LlamaForCausalLM.loss``'s autocast region): CUDA's lists as ``model.autocast`` emulates them,
``einsum`` and ``conv1d`` lower-precision ops (``aten_scan``), ``softplus`` an fp32 op, relu²'s ``torch.square`` none.
Not transliterated (``unsupported``): transformers' selective checkpointing (it has none).
"""

from __future__ import annotations

from dataclasses import replace

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..aten_activation import relu
from ..aten_index import split_with_sizes
from ..aten_pointwise import clamp, exp
from ..aten_scan import constant_pad_nd, conv1d_depthwise, cumsum, einsum, masked_fill, permute, softplus, square
from ..engine import Affine
from ..tensors import Tensor, autocast_or_not, empty, no_grad, parameter, repeated
from . import deepseek, llama, moe, nemotron
from .llama import B, Linear


class RMSNorm:
    """``NemotronHRMSNorm`` (:617-636)."""

    def __init__(self, size: int, dtype: str, name: str):
        self.weight = parameter((size,), dtype, name + ".weight")

    def __call__(self, hidden_states: Tensor) -> Tensor:
        input_dtype = hidden_states.dtype  # :627
        hidden_states = A.to(hidden_states, "fp32")
        variance = A.mean(A.pow_(hidden_states, 2), -1, keepdim=True)
        hidden_states = A.mul(hidden_states, A.rsqrt(A.add(variance, 1e-6)))
        return A.to(A.mul(A.to(self.weight, "fp32"), hidden_states), input_dtype)  # :633


class RMSNormGated:
    """``NemotronHRMSNormGated`` (:56-74): the input times SiLU of the gate, normed per group in fp32."""

    def __init__(self, size: int, groups: int, dtype: str, name: str):
        self.weight = parameter((size,), dtype, name + ".weight")
        self.group_size = size // groups

    def __call__(self, hidden_states: Tensor, gate: Tensor) -> Tensor:
        input_dtype = hidden_states.dtype  # :64
        hidden_states = A.to(hidden_states, "fp32")
        hidden_states = A.mul(hidden_states, A.silu(A.to(gate, "fp32")))  # :67
        *prefix_dims, last_dim = hidden_states.shape
        group_count = last_dim // self.group_size
        hidden_states_group = A.view(hidden_states, *prefix_dims, group_count, self.group_size)
        variance = A.mean(A.pow_(hidden_states_group, 2), -1, keepdim=True)
        hidden_states_group = A.mul(hidden_states_group, A.rsqrt(A.add(variance, 1e-6)))
        hidden_states = A.view(hidden_states_group, *prefix_dims, group_count * self.group_size)
        return A.mul(self.weight, A.to(hidden_states, input_dtype))  # :74


def pad_tensor_by_size(input_tensor: Tensor, pad_size: int) -> Tensor:
    """:80-88: the sequence (dim 1) padded by ``pad_size`` (``F.pad`` makes a new tensor even for 0)."""
    return constant_pad_nd(input_tensor, 1, 0, pad_size)


def reshape_into_chunks(input_tensor: Tensor, pad_size: int, chunk_size: int) -> Tensor:
    """:91-108."""
    input_tensor = pad_tensor_by_size(input_tensor, pad_size)
    if input_tensor.ndim == 3:
        return A.reshape(input_tensor, input_tensor.shape[0], -1, chunk_size, input_tensor.shape[2])
    shape = input_tensor.shape
    return A.reshape(input_tensor, shape[0], -1, chunk_size, shape[2], shape[3])


def tril_mask(chunk_size: int, diagonal: int) -> Tensor:
    """``torch.tril(torch.ones(chunk, chunk, dtype=bool), diagonal)``: the ones die once the tril is made."""
    ones = empty((chunk_size, chunk_size), "bool", "ones")
    out = empty((chunk_size, chunk_size), "bool", "tril")
    del ones
    return out


def bitwise_not(mask: Tensor) -> Tensor:
    return empty(mask.shape, "bool", "bitwise_not")


def segment_sum(input_tensor: Tensor) -> Tensor:
    """:111-128."""
    chunk_size = input_tensor.shape[-1]
    input_tensor = A.expand(A.unsqueeze(input_tensor, -1), *input_tensor.shape, chunk_size)
    mask = tril_mask(chunk_size, -1)
    input_tensor = masked_fill(input_tensor, bitwise_not(mask), 0.0)
    tensor_segsum = cumsum(input_tensor, -2)
    mask = tril_mask(chunk_size, 0)
    tensor_segsum = masked_fill(tensor_segsum, bitwise_not(mask), float("-inf"))
    return tensor_segsum


def repeat_interleave(t: Tensor, repeats: int, dim: int) -> Tensor:
    """``t.repeat_interleave(repeats, dim, output_size=...)``: an expand of a new dim after ``dim`` and a reshape
    (a copy, or a view where ``repeats`` is 1)."""
    shape = t.shape
    expanded = A.expand(A.unsqueeze(t, dim + 1), *shape[: dim + 1], repeats, *shape[dim + 1 :])
    return A.reshape(expanded, *shape[:dim], shape[dim] * repeats, *shape[dim + 1 :])


def mamba2_chunk_scan(
    hidden_states: Tensor,
    dt: Tensor,
    A_: Tensor,
    B: Tensor,
    C: Tensor,
    chunk_size: int,
    D: Tensor,
    dt_bias: Tensor,
) -> Tensor:
    """:274-387 (no initial state, ``dt_softplus``, the limits (0, inf), no final state); the locals named as
    there, so they die in the same order at the return."""
    batch_size, sequence_length, num_heads, head_dim = hidden_states.shape
    num_groups = B.shape[2]
    dt = A.add(dt, A.to(dt_bias, dt.dtype))  # :292
    dt = softplus(dt)
    dt = clamp(dt, both=True)  # :296 (min=0.0, max=inf: both bounds given)
    hidden_states = A.to(hidden_states, "fp32")
    B = repeat_interleave(A.to(B, "fp32"), num_heads // num_groups, 2)
    C = repeat_interleave(A.to(C, "fp32"), num_heads // num_groups, 2)
    pad_size = (chunk_size - sequence_length % chunk_size) % chunk_size
    D_residual = A.mul(A.unsqueeze(D, -1), pad_tensor_by_size(hidden_states, pad_size))  # :305
    hidden_states = A.mul(hidden_states, A.to(A.unsqueeze(dt, -1), "fp32"))  # :308
    A_ = A.mul(A.to(A_, hidden_states.dtype), A.to(dt, "fp32"))
    hidden_states, A_, B, C = [reshape_into_chunks(t, pad_size, chunk_size) for t in (hidden_states, A_, B, C)]
    A_ = permute(A_, 0, 3, 1, 2)  # :316
    A_cumsum = cumsum(A_, -1)
    L = exp(segment_sum(A_))  # :321
    G = einsum("bclhn,bcshn->bclsh", C, B)
    M = A.mul(G, permute(L, 0, 2, 3, 4, 1))
    Y_diag = einsum("bclsh,bcshp->bclhp", M, hidden_states)
    chunk = A_cumsum.shape[-1]
    decay_states = exp(A.sub(A.slice_(A_cumsum, -1, chunk - 1, chunk), A_cumsum))  # :337
    B_decay = A.mul(B, A.unsqueeze(permute(decay_states, 0, 2, 3, 1), -1))
    states = einsum("bclhn,bclhp->bchpn", B_decay, hidden_states)
    with no_grad():  # torch.zeros_like(states[:, :1])
        previous_states = empty((states.shape[0], 1, *states.shape[2:]), states.dtype, "zeros_like")
    states = A.cat((previous_states, states), 1)  # :351
    last = A.select(A_cumsum, -1, chunk - 1)
    decay_chunk = A.transpose(exp(segment_sum(constant_pad_nd(last, -1, 1, 0))), 1, 3)
    del last
    new_states = einsum("bzch,bzhpn->bchpn", decay_chunk, states)
    chunks = new_states.shape[1] - 1
    states, final_state = A.slice_(new_states, 1, 0, chunks), A.select(new_states, 1, chunks)  # noqa: F841 (a local)
    state_decay_out = exp(A_cumsum)  # :361
    C_times_states = einsum("bclhn,bchpn->bclhp", C, states)
    Y_off = A.mul(C_times_states, A.unsqueeze(permute(state_decay_out, 0, 2, 3, 1), -1))
    output = A.contiguous(A.add(Y_diag, Y_off))  # :373
    output = A.reshape(output, batch_size, -1, num_heads, head_dim)
    output = A.add(output, D_residual)
    if pad_size > 0:
        output = A.slice_(output, 1, 0, sequence_length)
    return output


class Mamba2Mixer:
    """``NemotronHMamba2Mixer`` (:390-614) in training, without a cache or a padding mask."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        d, h = cfg.d_model, cfg.mamba_heads
        self.num_heads, self.head_dim, self.n_groups = h, cfg.mamba_head_dim, cfg.mamba_groups
        self.ssm_state_size, self.chunk_size, self.kernel = (
            cfg.mamba_state_size,
            cfg.mamba_chunk_size,
            cfg.mamba_conv_kernel,
        )
        self.intermediate_size, self.conv_dim = cfg.mamba_inner, cfg.mamba_conv_dim
        # model.parameters() order: the mixer's own (dt_bias, A_log, D), then its children's
        self.dt_bias = parameter((h,), dtype, name + ".dt_bias")
        self.A_log = parameter((h,), dtype, name + ".A_log")
        self.D = parameter((h,), dtype, name + ".D")
        self.conv_weight = parameter((self.conv_dim, 1, self.kernel), dtype, name + ".conv1d.weight")
        self.conv_bias = parameter((self.conv_dim,), dtype, name + ".conv1d.bias")
        self.in_proj = Linear(d, cfg.mamba_in_width, False, dtype, name + ".in_proj")
        self.norm = RMSNormGated(self.intermediate_size, self.n_groups, dtype, name + ".norm")
        self.out_proj = Linear(self.intermediate_size, d, False, dtype, name + ".out_proj")

    def params(self) -> list[Tensor]:
        own = [self.dt_bias, self.A_log, self.D, self.conv_weight, self.conv_bias]
        return own + self.in_proj.params() + [self.norm.weight] + self.out_proj.params()

    def causal_conv1d_fn(self, hidden_states: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        """:163-184 (activation "silu")."""
        seq_len = hidden_states.shape[-1]
        out = conv1d_depthwise(A.to(hidden_states, weight.dtype), A.unsqueeze(weight, 1), bias, self.kernel - 1)
        out = A.silu(A.slice_(out, -1, 0, seq_len))
        return A.to(out, hidden_states.dtype)

    def __call__(self, hidden_states: Tensor) -> Tensor:
        batch_size, seq_len, _ = hidden_states.shape  # :476
        dtype = hidden_states.dtype
        projected_states = self.in_proj(hidden_states)  # :488
        A_ = A.neg(exp(A.to(self.A_log, "fp32")))  # :490
        sizes = [self.intermediate_size, self.conv_dim, self.num_heads]
        gate, hidden_states_B_C, dt = split_with_sizes(projected_states, sizes, -1)  # :517
        hidden_states_B_C = A.transpose(hidden_states_B_C, 1, 2)
        weight = A.squeeze(self.conv_weight, 1)
        hidden_states_B_C = self.causal_conv1d_fn(hidden_states_B_C, weight, self.conv_bias)  # :540
        del weight
        hidden_states_B_C = A.transpose(hidden_states_B_C, 1, 2)  # :552
        n = self.n_groups * self.ssm_state_size
        hidden_states, B_, C_ = split_with_sizes(hidden_states_B_C, [self.intermediate_size, n, n], -1)
        # ``scan_output`` first appears in the decode branch (:566), before ``scan_result`` (:587): the frame
        # holds it first, so at the return it dies before the scan's padded output
        scan_output = None
        scan_result = mamba2_chunk_scan(
            A.view(hidden_states, batch_size, seq_len, self.num_heads, self.head_dim),
            dt,
            A_,
            A.view(B_, batch_size, seq_len, self.n_groups, self.ssm_state_size),
            A.view(C_, batch_size, seq_len, self.n_groups, self.ssm_state_size),
            self.chunk_size,
            self.D,
            self.dt_bias,
        )  # :587-601
        scan_output = A.reshape(scan_result, batch_size, seq_len, -1)  # :603-609
        scan_output = self.norm(scan_output, gate)
        return self.out_proj(A.to(scan_output, dtype))  # :614


class Attention(llama.Attention):
    """``NemotronHAttention`` (:871-931): Llama's without RoPE and without biases."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str):
        super().__init__(cfg, dtype, attn, name)
        self.use_rope = False

    def __call__(self, hidden_states: Tensor, position_embeddings, attention_mask) -> tuple[Tensor, Tensor | None]:
        input_shape = hidden_states.shape[:-1]  # :896
        hidden_shape = (*input_shape, -1, self.head_dim)
        query_states = A.transpose(A.view(self.q_proj(hidden_states), *hidden_shape), 1, 2)  # :899-901
        key_states = A.transpose(A.view(self.k_proj(hidden_states), *hidden_shape), 1, 2)
        value_states = A.transpose(A.view(self.v_proj(hidden_states), *hidden_shape), 1, 2)
        attn_output, attn_weights = self.attend(query_states, key_states, value_states, attention_mask)  # :910
        attn_output = A.contiguous(A.reshape(attn_output, *input_shape, -1))  # :920
        attn_output = self.o_proj(attn_output)  # :921 (the attention's output dies here, then q, k, v at return)
        return attn_output, attn_weights


def relu2(x: Tensor) -> Tensor:
    """``ReLUSquaredActivation`` (activations.py): ``torch.square(F.relu(x))``; ``square`` has no autocast policy
    (``nemotron.relu2``'s ``pow`` is an fp32 op under autocast)."""
    return square(relu(x))


class MLP(nemotron.MLP):
    """``NemotronHMLP`` (:639-651): ``down_proj(act(up_proj(x)))``, width ``intermediate_size`` (a shared expert's
    ``moe_shared_expert_intermediate_size``)."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        super().__init__(cfg, dtype, name)
        self.act = relu2 if cfg.mlp == "relu2" else relu


class Experts(moe.Experts):
    """``NemotronHExperts`` (:654-712) under ``grouped_mm`` (``@use_experts_implementation(has_gate=False)``):
    ``up_proj`` (E, f, d_in) then the activation (``relu2``) in place of the gate, ``down_proj`` (E, d_in, f)."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        e, d, f = cfg.num_experts, cfg.expert_in, cfg.expert_width
        self.up_proj = parameter((e, f, d), dtype, name + ".up_proj")
        self.down_proj = parameter((e, d, f), dtype, name + ".down_proj")
        self.gate_up_proj = self.up_proj  # ``selected_weights = self.up_proj`` without a gate
        self.num_experts, self.intermediate_dim = e, f
        self.act = relu2 if cfg.mlp == "relu2" else relu

    def params(self) -> list[Tensor]:
        return [self.up_proj, self.down_proj]

    def apply_gate(self, gate_up_out: Tensor) -> Tensor:
        return self.act(gate_up_out)  # ``proj_out = self.act_fn(proj_out)``


class MoE:
    """``NemotronHMoE`` (:715-756): DeepSeek-V3's router (``NemotronHTopkRouter`` = ``deepseek.TopkRouter``: an fp32
    weight kept in fp32, ``_keep_in_fp32_modules_strict``), the experts between the latent projections when
    ``moe_latent_size`` is set, and a shared ``NemotronHMLP``; registered experts, gate, shared experts, latents."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.experts = Experts(cfg, dtype, name + ".experts")
        self.gate = deepseek.TopkRouter(cfg, name + ".gate")
        self.shared_experts = MLP(replace(cfg, d_ff=cfg.shared_width), dtype, name + ".shared_experts")
        latent = cfg.expert_latent
        self.fc1_latent_proj = Linear(cfg.d_model, latent, cfg.mlp_bias, dtype, name + ".fc1") if latent else None
        self.fc2_latent_proj = Linear(latent, cfg.d_model, cfg.mlp_bias, dtype, name + ".fc2") if latent else None

    def params(self) -> list[Tensor]:
        out = self.experts.params() + [self.gate.weight] + self.shared_experts.params()
        if self.fc1_latent_proj is not None:
            out += self.fc1_latent_proj.params() + self.fc2_latent_proj.params()
        return out

    def __call__(self, hidden_states: Tensor) -> Tensor:
        residuals = hidden_states  # :744
        orig_shape = hidden_states.shape
        _, topk_weights, topk_indices = self.gate(hidden_states)
        hidden_states = A.view(hidden_states, -1, hidden_states.shape[-1])
        if self.fc1_latent_proj is not None:
            hidden_states = self.fc1_latent_proj(hidden_states)  # :751
        hidden_states = self.experts(hidden_states, topk_indices, topk_weights)
        if self.fc2_latent_proj is not None:
            hidden_states = self.fc2_latent_proj(hidden_states)
        hidden_states = A.view(hidden_states, *orig_shape)
        return A.add(hidden_states, self.shared_experts(residuals))  # :755


class Block(llama.GradientCheckpointingLayer):
    """``NemotronHBlock`` (:934-993)."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str, kind: str):
        self.norm = RMSNorm(cfg.d_model, dtype, name + ".norm")
        self.kind = kind
        if kind == "M":
            self.mixer = Mamba2Mixer(cfg, dtype, name + ".mixer")
        elif kind == "*":
            self.mixer = Attention(cfg, dtype, attn, name + ".mixer")
        elif kind == "E":
            self.mixer = MoE(cfg, dtype, name + ".mixer")
        else:
            self.mixer = MLP(cfg, dtype, name + ".mixer")

    def params(self) -> list[Tensor]:
        return [self.norm.weight] + self.mixer.params()

    def forward(self, hidden_states: Tensor, attention_mask=None, position_ids=None) -> Tensor:
        residual = hidden_states  # :969
        hidden_states = self.norm(A.to(hidden_states, self.norm.weight.dtype))
        if self.kind == "*":
            hidden_states, _ = self.mixer(hidden_states, None, attention_mask)  # :979-986
        else:
            hidden_states = self.mixer(hidden_states)
        return A.add(residual, hidden_states)  # :990


class NemotronHForCausalLM:
    """``NemotronHForCausalLM`` with ``NemotronHModel`` (:1076-1227), labels given."""

    def __init__(self, cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B):
        dtype = llama.DTYPES[setup.precision]
        self.cfg, self.seq, self.batch, self.setup, self.dtype = cfg, seq, batch, setup, dtype
        self.embeddings = parameter((cfg.vocab_size, cfg.d_model), dtype, "embeddings.weight")
        self.layers = [
            Block(cfg, dtype, setup.attention, f"layers.{i}", cfg.layer_kind(i)) for i in range(cfg.num_layers)
        ]
        for layer in self.layers:
            layer.gradient_checkpointing = setup.checkpoint == "full"
        self.norm_f = RMSNorm(cfg.d_model, dtype, "norm_f")
        self.lm_head = parameter((cfg.vocab_size, cfg.d_model), dtype, "lm_head.weight")
        self.input_ids = empty((batch, seq), "int64", "input_ids")
        self.labels = empty((batch, seq), "int64", "labels")

    def parameters(self) -> list[Tensor]:
        out = [self.embeddings]
        for layer in self.layers:
            out += layer.params()
        return out + [self.norm_f.weight, self.lm_head]

    def runs(self) -> list[tuple[int, int]]:
        """(first layer, count): the first and the last layer alone, the middle ones in runs of one letter, each
        run replayed once (``tensors.repeated``)."""
        n, kind = self.cfg.num_layers, self.cfg.layer_kind
        out, i = [(0, 1)], 1
        while i < n - 1:
            j = i
            while j < n - 1 and kind(j) == kind(i):
                j += 1
            out.append((i, j - i))
            i = j
        return out + ([(n - 1, 1)] if n > 1 else [])

    def model(self) -> Tensor:
        """``NemotronHModel.forward`` (:1096-1155)."""
        inputs_embeds = A.embedding(self.embeddings, self.input_ids)  # :1110
        hidden_states = inputs_embeds
        position_ids = A.unsqueeze(llama.arange_plus(self.seq), 0)  # :1118-1120
        with no_grad():  # create_causal_mask's packed-sequence check
            llama.find_packed_sequence_indices(A.expand(position_ids, self.batch, -1))
        if self.setup.attention == "naive":
            mask = llama.eager_mask(self.batch, self.seq, self.dtype, None)
        else:
            mask = llama.sdpa_mask(self.batch, self.seq, None, allow_is_causal_skip=True)
        for first, times in self.runs():
            with repeated(times):
                layer = self.layers[first]
                # a checkpointed block's kwargs (the mask, position_ids) live until its recomputation
                kwargs = dict(attention_mask=mask if layer.kind == "*" else None, position_ids=position_ids)
                hidden_states = layer(hidden_states, **kwargs)
                del kwargs
        hidden_states = self.norm_f(hidden_states)  # :1148
        del mask  # the mask mapping dies before the mask arguments holding position_ids
        return hidden_states

    def forward(self) -> tuple[Tensor, Tensor]:
        """:1197-1210: ``self.lm_head(hidden_states).float()``, then ``ForCausalLMLoss``: (logits, loss)."""
        hidden_states = self.model()
        logits = A.to(A.linear(A.view(hidden_states, *hidden_states.shape), self.lm_head), "fp32")
        loss = llama.for_causal_lm_loss(logits, self.labels, self.cfg.vocab_size)
        return logits, loss  # ``hidden_states`` dies here (under autocast the head saved its bf16 copy)

    def loss(self) -> Tensor:
        """``llama.LlamaForCausalLM.loss``: amp-bf16 runs the forward under autocast (the logits are fp32 already)."""
        with autocast_or_not("bf16" if self.setup.autocast else None):
            logits, loss = self.forward()
        del logits
        return loss


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B) -> NemotronHForCausalLM:
    """The program of ``ops.transformers.predict_step``."""
    return NemotronHForCausalLM(cfg, seq, setup, batch)


def fp32_kept_parameters(cfg: ModelConfig) -> int:
    """The routers' weights (E, d) of the ``E`` layers: fp32 in a 16-bit model (``_keep_in_fp32_modules_strict``:
    ``gate.weight``; ``e_score_correction_bias`` is a buffer)."""
    return cfg.num_experts * cfg.d_model * (cfg.layer_pattern or "").count("E") if cfg.moe else 0


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = []
    if setup.checkpoint == "selective":
        out.append("transformers has no selective activation checkpointing")
    if cfg.mlp not in ("relu2", "relu"):
        out.append(f"mlp_hidden_act {cfg.hf_activation or cfg.mlp} (relu2 and relu are transliterated)")
    return out
