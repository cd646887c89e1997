"""Pointwise ops and reductions our own model writes out by hand (``model/layers.py``'s softmax, cross-entropy,
SiLU and masks): ``where`` with a number, ``amax``, ``exp``, ``log``, ``sigmoid``, tensor ``div``, ``mean()``; and
transformers' ``clamp`` by numbers (routers, gpt-oss's SwiGLU).

torch 2.13 (``tools/autograd/derivatives.yaml``, ``torch/csrc/autograd/FunctionsManual.cpp``):

* ``torch.where(cond, x, number)``: the number becomes a 0-d tensor of x's dtype on x's device
  (``scalar_tensor``), dead once the op returns; saves ``cond``; backward ``where(cond, grad, 0)``: the same.
* ``amax``: on a detached tensor here, no node.
* ``exp``, ``sigmoid``: save their result; backward ``grad * result`` / ``sigmoid_backward``: one tensor.
* ``log``: saves its input; backward ``grad / self``: one tensor.
* ``a / b`` (two tensors): saves ``b``, and ``a`` when b needs a gradient; backward b's first (the inputs'
  alphabetical order: ``other`` before ``self``), ``-grad * ((self / other) / other)`` (the right operand
  first, GCC's order; the temporaries die in reverse at the end of the expression), then a's ``grad / other``.
* ``clamp(x, min=, max=)`` with numbers (``ClampBackward1``): saves x; backward ``where(mask, grad, 0)``: a 0-d
  zero and a bool mask per bound (and-ed in place), dead once it returns.
* ``mean()`` of every element: nothing saved; backward ``grad.expand(sizes) / numel``: one tensor (a plain
  CPU run also sees the wrapped count, ``aten.wrap_scalar``).
No torch.
"""

from __future__ import annotations

from .aten import broadcast, cast_scalar, mul, neg, promote, wrap_scalar
from .tensors import ITEMSIZE, Storage, Tensor, current, empty, numel, record, wants


def new(shape: tuple, dtype: str, name: str, *operands: Tensor) -> Tensor:
    """A TensorIterator output: laid out as the first operand of the full shape (contiguous otherwise)."""
    out = empty(shape, dtype, name)
    for t in operands:
        if t.shape == shape and not t.zero:
            out.perm = t.perm
            break
    return out


def where(cond: Tensor, x: Tensor, number: float) -> Tensor:
    """``torch.where(cond, x, number)``."""
    scalar = empty((), x.dtype, "scalar_tensor")
    out = new(broadcast(cond.shape, x.shape), x.dtype, "where", x)
    del scalar

    def back(ctx, g, c):
        zero = empty((), g[0].dtype, "scalar_tensor")
        grad = new(broadcast(c.shape, g[0].shape), g[0].dtype, "where", g[0])
        del zero
        return (grad,)

    record("WhereBackward0", (x,), (out,), back, (cond,))
    return out


def clamp(x: Tensor, both: bool = False) -> Tensor:
    """``torch.clamp(x, min=number)`` or ``max=``, or both bounds (``both``): saves x; backward
    ``clamp_backward``: a 0-d zero, the mask ``self >= min`` (and ``self <= max``, and-ed in place) and
    ``where(mask, grad, zero)``."""

    def back(ctx, g, sx):
        zero = empty((), g[0].dtype, "scalar_tensor")
        masks = [empty(sx.shape, "bool", "ge") for _ in range(2 if both else 1)]
        grad = new(broadcast(sx.shape, g[0].shape), g[0].dtype, "where", g[0])
        del masks, zero
        return (grad,)

    out = new(x.shape, x.dtype, "clamp", x)
    record("ClampBackward1", (x,), (out,), back, (x,))
    return out


def amax(x: Tensor, dim: int, keepdim: bool = True) -> Tensor:
    """``x.amax(dim, keepdim)`` of a tensor that needs no gradient."""
    dim = dim % x.ndim
    shape = x.shape[:dim] + ((1,) if keepdim else ()) + x.shape[dim + 1 :]
    return empty(shape, x.dtype, "amax")


def exp(x: Tensor) -> Tensor:
    out = new(x.shape, x.dtype, "exp", x)
    record("ExpBackward0", (x,), (out,), lambda ctx, g, res: (mul(g[0], res),), (out,))
    return out


def sigmoid(x: Tensor) -> Tensor:
    out = new(x.shape, x.dtype, "sigmoid", x)
    record(
        "SigmoidBackward0",
        (x,),
        (out,),
        lambda ctx, g, res: (new(res.shape, promote(g[0], res), "sigmoid_backward", g[0], res),),
        (out,),
    )
    return out


def log(x: Tensor) -> Tensor:
    out = new(x.shape, x.dtype, "log", x)
    record("LogBackward0", (x,), (out,), lambda ctx, g, s: (divide(g[0], s),), (x,))
    return out


def divide(a: Tensor, b: Tensor) -> Tensor:
    """``a / b`` of two tensors."""
    out = new(broadcast(a.shape, b.shape), promote(a, b), "div", a, b)
    need = wants(a, b)
    if need is None:
        return out
    record("DivBackward0", (a, b), (out,), divide_backward, (a if need[1] else None, b))
    return out


def divide_backward(ctx, g, sa: Tensor | None, sb: Tensor) -> tuple:
    """``DivBackward0`` of ``a / b`` (saved: a, when b needs a gradient, and b)."""
    gb = ga = None
    if ctx.need[1]:  # div_tensor_other_backward: -grad * ((self / other) / other)
        ratio = divide(sa, sb)
        ratio2 = divide(ratio, sb)
        minus = neg(g[0])
        gb = mul(minus, ratio2)
        del minus, ratio2, ratio
    if ctx.need[0]:  # div_tensor_self_backward: grad / other
        ga = divide(g[0], sb)
    return ga, gb


def mean_all(x: Tensor) -> Tensor:
    """``x.mean()``: a 0-d tensor.  A plain CPU run: the kernel divides by a wrapped count (8 bytes, cast to the
    accumulation dtype) and, for a 16-bit ``x``, sums an fp32 copy of it into an fp32 result first."""
    out = empty((), x.dtype, "mean")
    if current().wraps:
        k16 = ITEMSIZE[x.dtype] == 2
        acc = Storage(4, "mean_fp32") if k16 else None
        copy = Storage(numel(x.shape) * 4, "mean_fp32_input") if k16 else None
        del copy
        wrapped = wrap_scalar(x.dtype)
        cast = cast_scalar(wrapped, "fp32" if k16 else x.dtype)
        del cast, wrapped, acc
    shape = x.shape

    def back(ctx, g):  # grad.expand(sizes) / numel: the count wrapped and cast, then the quotient
        wrapped = wrap_scalar(g[0].dtype)
        cast = cast_scalar(wrapped, g[0].dtype)
        grad = empty(shape, g[0].dtype, "div")
        del cast, wrapped
        return (grad,)

    record("MeanBackward0", (x,), (out,), back)
    return out
