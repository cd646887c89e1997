"""``aten._scaled_dot_product_flash_attention_for_cpu``, called directly (our model's ``FusedAttention`` on meta
and cpu), on symbolic tensors.

torch 2.13 ``_meta_registrations.py`` (``meta__scaled_dot_product_flash_attention_for_cpu`` and its backward):
the output is ``empty_like(query)`` (the query's layout) and the logsumexp (B, h, S) fp32 (made as (B, S, h),
transposed); autograd saves q, k, v, the output and the logsumexp; the backward makes dq, dk, dv laid out
(B, S, heads, d) (``empty_permuted(..., (0, 2, 1, 3))``).  The CPU kernel's per-thread scratch is a target
fact of a plain CPU run (``aten.flash_scratch_forward``/``_backward``).

Under context parallel (``aten_ring.active()``: a ``Ring`` installed around the replay) the same op runs as
torch's ring attention, what it allocates in the forward and the backward (``aten_ring``); autograd saves the same
five tensors, the merged output and logsumexp.  No torch.
"""

from __future__ import annotations

from . import aten_ring
from .tensors import Tensor, record


def flash_attention_for_cpu(q: Tensor, k: Tensor, v: Tensor, storages=None) -> tuple[Tensor, Tensor]:
    """(output (B, h, S, d_v), logsumexp); k and v keep their kv heads.  ``storages``: the outputs' storages
    when they exist already (selective checkpointing's cache hands them back: nothing is allocated)."""
    b, h, s, _ = q.shape
    ring = aten_ring.active()
    if storages is not None:
        out, lse = (
            Tensor(q.shape[:-1] + v.shape[-1:], q.dtype, storages[0], q.perm),
            Tensor((b, h, s), "fp32", storages[1]),
        )
    elif ring is not None:
        out, lse = aten_ring.ring_forward(ring, q, k, v)
    else:
        out, lse = aten_ring.kernel_forward(q, k, v)  # with a plain CPU run's per-thread buffers

    def back(ctx, g, sq, sk, sv, so, sl):
        if ring is not None:
            return aten_ring.ring_backward(ring, g, sq, sk, sv, so, sl)
        return aten_ring.kernel_backward(sq, sk, sv)

    record("ScaledDotProductFlashAttentionForCpuBackward0", (q, k, v), (out,), back, (q, k, v, out, lse))
    return out, lse


flash_attention_for_cpu.takes_storages = True
