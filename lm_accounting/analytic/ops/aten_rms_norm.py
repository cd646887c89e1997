"""torch's own RMSNorm (``torch.nn.RMSNorm`` → ``F.rms_norm`` → ``at::rms_norm``), the norm torchtitan's models use.

On meta and cpu torch 2.13 runs ``at::rms_norm`` as a composite of aten ops (aten/src/ATen/native/layer_norm.cpp,
``rms_norm_symint``; traced with a dispatch mode: ``_to_copy``, ``pow``, ``mean``, ``add_``, ``rsqrt``, ``mul``,
``mul``, ``_to_copy``), so its memory is that of those ops, each already a primitive, plus one in-place add.
It differs from transformers' ``LlamaRMSNorm`` in two places: ``eps`` is added in place (no tensor), and the
weight multiplies the fp32 normalised input before the cast back (an fp32 product, where Llama's is in the
input's dtype).
"""

from __future__ import annotations

from . import aten as A
from .tensors import Tensor, record


def add_(a: Tensor, number: float) -> Tensor:
    """``a.add_(number)``: in place, so no output bytes; on a plain CPU run the number is wrapped and cast as
    for ``a + number`` (``add_.Scalar`` calls ``add_.Tensor`` with ``wrapped_scalar_tensor``), both freed when
    the op returns.  Autograd rebases ``a`` on an ``AddBackward1``, which hands the gradient on."""
    wrapped = A.wrap_scalar(a.dtype)
    cast = A.cast_scalar(wrapped, a.dtype)
    del cast, wrapped
    out = a.detach()
    record("AddBackward1", (a,), (out,), lambda ctx, g: (g[0],))
    return out


def rms_norm(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    """``at::rms_norm`` over the last dim: upcast to the op-math dtype (fp32 for 16-bit input), ``pow(2).mean(-1,
    keepdim).add_(eps).rsqrt()``, ``x · rsqrt``, ``· weight`` (fp32), cast back to the input's dtype."""
    input_dtype = x.dtype
    upcast = A.to(x, "fp32")
    rsqrt = A.rsqrt(add_(A.mean(A.pow_(upcast, 2), -1, keepdim=True), eps))
    out = A.mul(upcast, rsqrt)
    del rsqrt, upcast
    if weight is not None:
        out = A.mul(out, weight)
    return A.to(out, input_dtype)
