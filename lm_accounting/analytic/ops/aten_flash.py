"""``aten._scaled_dot_product_flash_attention_for_cpu``, called directly (our model's ``FusedAttention`` on meta
and cpu), on symbolic tensors.

torch 2.13 ``_meta_registrations.py`` (``meta__scaled_dot_product_flash_attention_for_cpu`` and its backward):
the output is ``empty_like(query)`` (the query's layout) and the logsumexp (B, h, S) fp32 (made as (B, S, h),
transposed); autograd saves q, k, v, the output and the logsumexp; the backward makes dq, dk, dv laid out
(B, S, heads, d) (``empty_permuted(..., (0, 2, 1, 3))``).  The CPU kernel's per-thread scratch is a target
fact of a plain CPU run (``aten.flash_scratch_forward``/``_backward``).  No torch.
"""

from __future__ import annotations

from .aten import flash_scratch_backward, flash_scratch_forward
from .tensors import Tensor, empty, record

BSHD = (0, 2, 1, 3)


def flash_attention_for_cpu(q: Tensor, k: Tensor, v: Tensor, storages=None) -> tuple[Tensor, Tensor]:
    """(output (B, h, S, d_v), logsumexp); k and v keep their kv heads.  ``storages``: the outputs' storages
    when they exist already (selective checkpointing's cache hands them back: nothing is allocated)."""
    b, h, s, _ = q.shape
    shape = q.shape[:-1] + v.shape[-1:]
    if storages is None:
        out, lse = empty(shape, q.dtype, "flash", like=q), empty((b, h, s), "fp32", "flash_lse")
        flash_scratch_forward(s, q.shape[-1], q.dtype)  # a plain CPU run's per-thread buffers
    else:
        out, lse = Tensor(shape, q.dtype, storages[0], q.perm), Tensor((b, h, s), "fp32", storages[1])

    def back(ctx, g, sq, sk, sv, so, sl):
        grads = []
        for t in (sq, sk, sv):
            grad = empty(t.shape, t.dtype, "flash_backward")
            grad.perm = BSHD
            grads.append(grad)
        flash_scratch_backward(s, sq.dtype)
        return tuple(grads)

    record("ScaledDotProductFlashAttentionForCpuBackward0", (q, k, v), (out,), back, (q, k, v, out, lse))
    return out, lse


flash_attention_for_cpu.takes_storages = True
