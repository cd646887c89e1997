"""The Mamba2 mixer of transformers 5.24's hybrids on its PyTorch path (``models/nemotron_h/modeling_nemotron_h.py``,
line numbers of transformers 5.24): ``NemotronHMamba2Mixer``, and ``BambaMixer``, ``GraniteMoeHybridMambaLayer`` and
``FalconH1Mixer``, whose forwards and ``mamba2_chunk_scan`` are the same line for line (``falcon_h1.Mixer`` adds its
multipliers).  The path training takes without the CUDA kernels (``mamba2_split_conv1d_scan_combined`` returns
None): ``in_proj``; ``A = -exp(A_log.float())``; the split into the gate z, x·B·C and dt; ``causal_conv1d_fn``
(:163-184: a depthwise ``F.conv1d`` padded by K − 1, cut to S, SiLU); the split into x, B and C;
``mamba2_chunk_scan`` (:274-387: dt + dt_bias, softplus, clamp, B and C repeated per head in fp32, the D residual,
the sequence padded to a multiple of the chunk, ``segment_sum``, the four einsums of the SSD scan, the inter-chunk
recurrence, the padding cut off); the gated RMSNorm per group (``NemotronHRMSNormGated``, :56-74); ``out_proj``.
The aten ops of the scan are ``ops.aten_scan``'s.  No torch.
"""

from __future__ import annotations

from ....config import ModelConfig
from .. import aten as A
from ..aten_index import split_with_sizes
from ..aten_pointwise import clamp, exp
from ..aten_scan import causal_conv1d, constant_pad_nd, cumsum, einsum, masked_fill, permute, softplus
from ..tensors import Tensor, empty, no_grad, parameter, runs_of
from .llama import Linear


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
    """``t.repeat_interleave(repeats, dim, output_size=...)`` (CompositeImplicitAutograd): a new dim after ``dim``
    expanded, a contiguous clone (also for ``repeats`` 1: torch 2.13 always copies), a view."""
    shape = t.shape
    expanded = A.expand(A.unsqueeze(t, dim + 1), *shape[: dim + 1], repeats, *shape[dim + 1 :])
    return A.view(A.clone(expanded, contiguous=True), *shape[:dim], shape[dim] * repeats, *shape[dim + 1 :])


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
        return causal_conv1d(hidden_states, weight, bias, activation=True)

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


def layer_runs(cfg: ModelConfig) -> list[tuple[int, int]]:
    """(first layer, count) of a patterned model: ``tensors.runs_of`` its letters."""
    return runs_of([cfg.layer_kind(i) for i in range(cfg.num_layers)])


def unproven_sizes(cfg: ModelConfig) -> list[str]:
    """A Mamba2 size of 1 (one head, a head or state of width 1) changes which dims the scan's einsums batch, and
    so their copies (``aten_scan.einsum``): with one head the last einsum flattens batch and chunk of
    ``new_states[:, :-1]``, a slice whose gap the op library's layouts do not track (torch copies it; seen on meta),
    so such mixers are refused rather than guessed."""
    ones = [k for k in ("mamba_heads", "mamba_head_dim", "mamba_state_size") if getattr(cfg, k) == 1]
    return (
        [f"a Mamba2 mixer with {', '.join(ones)} 1 (the scan's einsums then copy otherwise: not proven)"]
        if ones
        else []
    )
