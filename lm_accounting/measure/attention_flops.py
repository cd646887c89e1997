"""FLOP formulas for fused attention, which both counters miss on torch 2.13.

* ``FlopCounterMode`` has formulas for the CUDA kernels (``_scaled_dot_product_flash_attention``,
  ``_efficient_attention``, ``_cudnn_attention``; torch/utils/flop_counter.py, ``sdpa_flop`` and
  ``sdpa_backward_flop``) but none for the CPU flash kernel, so it counts it as 0 (pytorch#195460,
  fixed after 2.13).  ``install()`` registers torch's own helpers for the CPU forward and backward.
* fvcore (forward only, MACs) has no handle for either sdpa op and counts 0; ``FVCORE_HANDLES``
  maps the traced op names to a handle giving half of torch's forward count.

Conventions, both from torch's helpers (flop_counter.py): the full S×S square (``is_causal`` is
ignored), K/V heads broadcast to the h query heads (GQA costs as MHA), and 2 FLOPs per MAC:

* forward, ``sdpa_flop_count``: 1. QKᵀ 2·b·h·s·s·d  2. AV 2·b·h·s·s·d  = 4·b·h·s²·d, exactly the
  naive model's ``attn.qk`` + ``attn.av``;
* backward, ``sdpa_backward_flop_count``: 1. recompute QKᵀ  2. dP = dO·Vᵀ  3. dV = Pᵀ·dO
  4. dQ = dS·K  5. dK = dSᵀ·Q, five matmuls of 2·b·h·s²·d = 10·b·h·s²·d, where the naive model's
  autograd does steps 2-5 only (8·b·h·s²·d).  Step 1 is hardware work, not model FLOPs.

Grouped K/V heads: torch's helpers accept h_kv < h from 2.13 on; before (2.11, measured on an H200)
they assert "query/key/value shapes are incompatible", so FlopCounterMode stops on any GQA model's
fused attention (CUDA kernels and the decode step alike).  The formulas below are ours, written out
with the same conventions, and ``install()`` puts them in place of torch's helpers there.
"""

from __future__ import annotations

import torch
from torch.utils import flop_counter
from torch.utils.flop_counter import flop_registry, register_flop_formula

aten = torch.ops.aten
CPU_FLASH = aten._scaled_dot_product_flash_attention_for_cpu
CPU_FLASH_BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward


def _heads(query_shape, key_shape, value_shape) -> tuple[int, int, int, int, int]:
    """(b, h, s_q, s_k, d) of a (b, h, s_q, d) query against (b, h_kv, s_k, d) keys and values, h_kv | h."""
    (b, h, s_q, d), (b_k, h_kv, s_k, d_k), (b_v, h_v, s_v, d_v) = query_shape, key_shape, value_shape
    if not (b == b_k == b_v and h_kv == h_v and s_k == s_v and d == d_k == d_v and h_kv and h % h_kv == 0):
        raise ValueError(f"attention shapes q={query_shape}, k={key_shape}, v={value_shape} do not fit")
    return b, h, s_q, s_k, d


def sdpa_forward_flops(query_shape, key_shape, value_shape) -> int:
    """Fused attention forward: 1. QKᵀ 2·b·h·s_q·s_k·d + 2. AV 2·b·h·s_q·s_k·d (K/V broadcast to h heads)."""
    b, h, s_q, s_k, d = _heads(query_shape, key_shape, value_shape)
    return 2 * (2 * b * h * s_q * s_k * d)


def sdpa_backward_flops(grad_out_shape, query_shape, key_shape, value_shape) -> int:
    """Fused attention backward: 1. recompute QKᵀ 2. dP = dO·Vᵀ 3. dV = Pᵀ·dO 4. dQ = dS·K 5. dK = dSᵀ·Q,
    five matmuls of 2·b·h·s_q·s_k·d (K/V broadcast to h heads)."""
    b, h, s_q, s_k, d = _heads(query_shape, key_shape, value_shape)
    if tuple(grad_out_shape) != (b, h, s_q, d):
        raise ValueError(f"attention output gradient {grad_out_shape} does not fit q={query_shape}")
    return 5 * (2 * b * h * s_q * s_k * d)


def torch_counts_grouped_heads() -> bool:
    """Whether this torch's own helpers count grouped K/V heads (2.13 does; 2.11 asserts)."""
    q, kv = (1, 2, 1, 8), (1, 1, 1, 8)
    try:
        flop_counter.sdpa_flop_count(q, kv, kv)
        flop_counter.sdpa_backward_flop_count(q, q, kv, kv)
    except AssertionError:
        return False
    return True


def _cpu_flash_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """(q, k, v, dropout_p, is_causal, ...) -> 4·b·h·s_q·s_k·d (``sdpa_forward_flops``)."""
    return sdpa_forward_flops(query_shape, key_shape, value_shape)


def _cpu_flash_backward_flop(
    grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs
) -> int:
    """(dO, q, k, v, out, logsumexp, ...) -> 10·b·h·s_q·s_k·d (``sdpa_backward_flops``)."""
    return sdpa_backward_flops(grad_out_shape, query_shape, key_shape, value_shape)


def install() -> None:
    """Register the CPU flash formulas with FlopCounterMode, once; a torch that has its own keeps it.
    On a torch whose helpers reject grouped K/V heads, its CUDA kernels' registered formulas are made
    to call ours instead (they look ``sdpa_flop_count`` and ``sdpa_backward_flop_count`` up in
    torch.utils.flop_counter when they run): the same count as torch 2.13's.

    Call it before constructing ``FlopCounterMode`` (it copies the registry when created)."""
    for op, formula in ((CPU_FLASH, _cpu_flash_flop), (CPU_FLASH_BACKWARD, _cpu_flash_backward_flop)):
        if op not in flop_registry:
            register_flop_formula(op)(formula)
    if not torch_counts_grouped_heads():
        flop_counter.sdpa_flop_count = sdpa_forward_flops
        flop_counter.sdpa_backward_flop_count = sdpa_backward_flops


def _fvcore_sdpa(inputs, outputs) -> int:
    """fvcore handle (MACs): half of ``sdpa_flop_count`` on the traced q, k, v shapes."""
    from fvcore.nn.jit_handles import get_shape

    q, k, v = (get_shape(x) for x in inputs[:3])
    return sdpa_forward_flops(q, k, v) // 2


FVCORE_HANDLES = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": _fvcore_sdpa,  # our meta/cpu call
    "aten::scaled_dot_product_attention": _fvcore_sdpa,  # F.scaled_dot_product_attention (cuda)
}
"""Pass to ``FlopCountAnalysis.set_op_handle(**FVCORE_HANDLES)``."""
