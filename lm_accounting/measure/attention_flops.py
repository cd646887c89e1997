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
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import (
    flop_registry,
    register_flop_formula,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)

aten = torch.ops.aten
CPU_FLASH = aten._scaled_dot_product_flash_attention_for_cpu
CPU_FLASH_BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward


def _cpu_flash_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """(q, k, v, dropout_p, is_causal, ...) -> 4·b·h·s_q·s_k·d (torch's ``sdpa_flop_count``)."""
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _cpu_flash_backward_flop(
    grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs
) -> int:
    """(dO, q, k, v, out, logsumexp, ...) -> 10·b·h·s_q·s_k·d (torch's ``sdpa_backward_flop_count``)."""
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def install() -> None:
    """Register the CPU flash formulas with FlopCounterMode, once; a torch that has its own keeps it.

    Call it before constructing ``FlopCounterMode`` (it copies the registry when created)."""
    for op, formula in ((CPU_FLASH, _cpu_flash_flop), (CPU_FLASH_BACKWARD, _cpu_flash_backward_flop)):
        if op not in flop_registry:
            register_flop_formula(op)(formula)


def _fvcore_sdpa(inputs, outputs) -> int:
    """fvcore handle (MACs): half of ``sdpa_flop_count`` on the traced q, k, v shapes."""
    from fvcore.nn.jit_handles import get_shape

    q, k, v = (get_shape(x) for x in inputs[:3])
    return sdpa_flop_count(q, k, v) // 2


FVCORE_HANDLES = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": _fvcore_sdpa,  # our meta/cpu call
    "aten::scaled_dot_product_attention": _fvcore_sdpa,  # F.scaled_dot_product_attention (cuda)
}
"""Pass to ``FlopCountAnalysis.set_op_handle(**FVCORE_HANDLES)``."""
