"""``aten._scaled_dot_product_flash_attention_for_cpu``, called directly (our model's ``FusedAttention`` on meta
and cpu), on symbolic tensors.

torch 2.13 ``_meta_registrations.py`` (``meta__scaled_dot_product_flash_attention_for_cpu`` and its backward):
the output is ``empty_like(query)`` (the query's layout) and the logsumexp (B, h, S) fp32 (made as (B, S, h),
transposed); autograd saves q, k, v, the output and the logsumexp; the backward makes dq, dk, dv laid out
(B, S, heads, d) (``empty_permuted(..., (0, 2, 1, 3))``).  The CPU kernel's per-thread scratch is a target
fact of a plain CPU run, not modelled here.  No torch.
"""

from __future__ import annotations

from .tensors import Tensor, empty, record

BSHD = (0, 2, 1, 3)


def flash_attention_for_cpu(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The output (B, h, S, d_v); k and v keep their kv heads."""
    b, h, s, _ = q.shape
    out = empty(q.shape[:-1] + v.shape[-1:], q.dtype, "flash", like=q)
    lse = empty((b, h, s), "fp32", "flash_lse")

    def back(ctx, g, sq, sk, sv, so, sl):
        grads = []
        for t in (sq, sk, sv):
            grad = empty(t.shape, t.dtype, "flash_backward")
            grad.perm = BSHD
            grads.append(grad)
        return tuple(grads)

    record("ScaledDotProductFlashAttentionForCpuBackward0", (q, k, v), (out,), back, (q, k, v, out, lse))
    del lse
    return out
