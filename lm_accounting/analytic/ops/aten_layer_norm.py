"""``native_layer_norm`` on symbolic tensors (``nn.LayerNorm``, ``F.layer_norm``): GPT-2's norm.

torch 2.13: ``layer_norm`` (CompositeImplicit, ``aten/src/ATen/native/layer_norm.cpp``) calls
``native_layer_norm``, which allocates the output (the input's shape and dtype) and two statistics, ``mean``
and ``rstd``, of the input's shape with the normalized dims as 1: on meta in the computation dtype (fp32 for a
bf16 or fp16 input: ``_meta_registrations.py`` ``native_layer_norm``, ``get_computation_dtype``), on the cpu in
the input's dtype unless the weight's differs (then fp32: ``layer_norm_cpu``'s ``param_scalar_type``, measured
on torch 2.13).
``tools/autograd/derivatives.yaml`` saves ``input, weight, bias, result1, result2``; the backward is one
``native_layer_norm_backward`` (of ``grad.contiguous()``) that returns the input's gradient and, when wanted,
the weight's and the bias's (each of its parameter's shape and dtype).  No torch.
"""

from __future__ import annotations

from .aten import contiguous, upcast
from .tensors import Tensor, empty, record, wants

STAT_DTYPE = {"bf16": "fp32", "fp16": "fp32", "fp32": "fp32"}
"""The dtype of ``mean``/``rstd`` per input dtype on meta (the computation dtype)."""


def layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, dims: int = 1, device: str = "meta") -> Tensor:
    """``F.layer_norm(x, x.shape[-dims:], weight, bias)``: the output; ``mean``/``rstd`` live as long
    as the node that saves them.  Under autocast its arguments are cast to fp32 (``AT_FORALL_FP32``), the
    last first."""
    bias, weight, x = (None if t is None else upcast(t) for t in (bias, weight, x))
    out = empty(x.shape, x.dtype, "native_layer_norm")
    stat = x.shape[: x.ndim - dims] + (1,) * dims
    stat_dtype = STAT_DTYPE[x.dtype]
    if device == "cpu":
        stat_dtype = x.dtype if weight is None or weight.dtype == x.dtype else "fp32"
    mean = empty(stat, stat_dtype, "native_layer_norm")
    rstd = empty(stat, stat_dtype, "native_layer_norm")
    if wants(x, weight, bias) is None:
        return out
    shape, dtype = x.shape, x.dtype
    w = None if weight is None else (weight.shape, weight.dtype)
    b = None if bias is None else (bias.shape, bias.dtype)

    def back(ctx, g, *saved):
        grad = contiguous(g[0])
        gx = empty(shape, dtype, "native_layer_norm_backward") if ctx.need[0] else None
        gw = empty(*w, "native_layer_norm_backward") if ctx.need[1] else None
        gb = empty(*b, "native_layer_norm_backward") if ctx.need[2] else None
        del grad
        return gx, gw, gb

    record("NativeLayerNormBackward0", (x, weight, bias), (out,), back, (x, weight, bias, mean, rstd))
    return out
