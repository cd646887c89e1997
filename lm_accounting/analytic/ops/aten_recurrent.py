"""The aten ops of transformers' torch paths for recurrent token mixers (the chunked gated delta rule and the causal
conv1d of ``models/qwen3_next/modeling_qwen3_next.py``): padding, cumulative sums, masked fills, triangular solves,
a depthwise convolution, softplus, an upper-triangular mask and a copy into a selected slice.

torch 2.13 (``tools/autograd/derivatives.yaml``, ``torch/csrc/autograd/FunctionsManual.cpp``,
``torch/csrc/autograd/functions/tensor.cpp``), each checked against the storage tracker's trace of transformers'
model (tests/test_ops_transformers_gdn.py):

* ``constant_pad_nd``: a new contiguous tensor (no padding: a clone keeping the layout); saves nothing; backward
  ``constant_pad_nd(grad, -pad)``: one tensor laid out as the gradient.
* ``cumsum``: saves nothing; backward ``grad.flip(dim).cumsum(dim).flip(dim)``: three tensors, the two temporaries
  dead once the last exists.
* ``masked_fill`` with a number: saves the mask; backward ``grad.masked_fill(mask, 0)``: one tensor.
* ``linalg_solve_triangular(A, B, upper=False, unitriangular=True)``: the result laid out column-major in its last
  two dims (LAPACK's); saves A and the result; backward ``G_B = solve_triangular(Aᴴ, grad)`` (column-major), then
  for A ``tril(-(G_B @ Xᴴ), -1)`` (the product and its negation dying once the next exists), A's gradient first.
* ``convolution`` (depthwise, no bias; under autocast its arguments cast to 16 bits): a new contiguous
  (B, C, S + K - 1); saves input and weight; backward ``convolution_backward``: the input's gradient (contiguous)
  and the weight's.
* ``softplus``: saves its input; backward ``softplus_backward``: one tensor.
* ``copy_`` into ``base.select(dim, i)`` (``base[:, :, i] = src``): no bytes; ``CopySlices`` on the base, whose
  backward makes ``new_empty_strided`` of the base (its layout), clones the slice's gradient (contiguous), casts it to
  the source's dtype if it differs, and, when the base already needed a gradient, makes the ``zeros_like`` of that
  clone that ``CopyBackwards`` returns for it.
No torch.
"""

from __future__ import annotations

from . import aten as A
from .aten_pointwise import new
from .tensors import Tensor, empty, record, record_first


def constant_pad_nd(x: Tensor, pad_last: int, dim: int) -> Tensor:
    """``F.pad(x, ...)`` padding ``dim`` by ``pad_last`` zeros at its end: a new contiguous tensor; no padding at
    all is ``clone()`` (``all_pads_non_positive``: the narrowed input cloned, its layout kept)."""
    dim = dim % x.ndim
    shape = x.shape[:dim] + (x.shape[dim] + pad_last,) + x.shape[dim + 1 :]
    out = empty(shape, x.dtype, "constant_pad_nd", like=x if pad_last == 0 else None)
    src = x.shape

    def back(ctx, g):
        grad = empty(src, g[0].dtype, "constant_pad_nd")
        grad.perm = g[0].perm
        return (grad,)

    record("ConstantPadNdBackward0", (x,), (out,), back)
    return out


def cumsum(x: Tensor, dim: int) -> Tensor:
    """``x.cumsum(dim)``."""
    out = new(x.shape, x.dtype, "cumsum", x)

    def back(ctx, g):
        flipped = new(g[0].shape, g[0].dtype, "flip", g[0])
        summed = new(g[0].shape, g[0].dtype, "cumsum", flipped)
        out = new(g[0].shape, g[0].dtype, "flip", summed)
        del flipped, summed  # the expression's temporaries
        return (out,)

    record("CumsumBackward0", (x,), (out,), back)
    return out


def masked_fill(x: Tensor, mask: Tensor) -> Tensor:
    """``x.masked_fill(mask, number)`` (a mask that needs no gradient)."""
    out = new(A.broadcast(x.shape, mask.shape), x.dtype, "masked_fill", x)
    back = lambda ctx, g, m: (new(g[0].shape, g[0].dtype, "masked_fill", g[0]),)
    record("MaskedFillBackward0", (x,), (out,), back, (mask,))
    return out


def colmajor(shape: tuple, dtype: str, name: str) -> Tensor:
    """A new tensor laid out column-major in its last two dims (LAPACK's output)."""
    out = empty(shape, dtype, name)
    n = len(shape)
    out.perm = tuple(range(n - 2)) + (n - 1, n - 2)
    return out


def solve_triangular(a: Tensor, b: Tensor) -> Tensor:
    """``torch.linalg.solve_triangular(a, b, upper=False, unitriangular=True)``."""
    out = colmajor(b.shape, b.dtype, "linalg_solve_triangular")

    def back(ctx, g, sa, x):
        g_b = colmajor(x.shape, g[0].dtype, "linalg_solve_triangular")
        g_a = None
        if ctx.need[0]:
            product = A.matmul(g_b, A.transpose(x, -1, -2))
            negated = A.neg(product)
            del product
            g_a = new(negated.shape, negated.dtype, "tril", negated)
            del negated
        return g_a, g_b if ctx.need[1] else None

    record("LinalgSolveTriangularBackward0", (a, b), (out,), back, (a, out))
    return out


def conv1d_depthwise(x: Tensor, weight: Tensor, padding: int) -> Tensor:
    """``F.conv1d(x, weight=weight, bias=None, padding=padding, groups=C)`` of (B, C, S) by (C, 1, K); a
    lower-precision op under autocast (``aten.lower``), as measured (``measure.hf.HFAutocast``): the positional input
    cast before the keyword weight (transformers passes ``weight=``)."""
    given = x  # the caller's argument lives until the call returns
    (x,) = A.lower(x)
    (weight,) = A.lower(weight)
    b, c, s = x.shape
    k = weight.shape[-1]
    xs, ws = x.shape, weight.shape

    def back(ctx, g, sx, sw):
        gx = empty(xs, g[0].dtype, "convolution_backward") if ctx.need[0] else None
        gw = empty(ws, g[0].dtype, "convolution_backward") if ctx.need[1] else None
        return gx, gw

    make = lambda: (empty((b, c, s + 2 * padding - k + 1), x.dtype, "convolution"),)
    out = record_first("ConvolutionBackward0", (x, weight), make, back, (x, weight))[0]
    del given
    return out


def softplus(x: Tensor) -> Tensor:
    """``F.softplus(x)`` (beta 1, threshold 20)."""
    back = lambda ctx, g, sx: (new(sx.shape, g[0].dtype, "softplus_backward", g[0]),)
    return record_first("SoftplusBackward0", (x,), lambda: (new(x.shape, x.dtype, "softplus", x),), back, (x,))[0]


def upper_mask(n: int) -> Tensor:
    """``torch.ones(n, n, dtype=torch.bool).triu(1)``: the ones die once the triangle exists."""
    ones = empty((n, n), "bool", "ones")
    out = empty((n, n), "bool", "triu")
    del ones
    return out


def copy_into_select(base: Tensor, src: Tensor) -> None:
    """``base.select(dim, i).copy_(src)`` of a ``src`` shaped as the slice: ``CopySlices`` on ``base`` (see the
    module docstring); ``base`` then carries the node."""
    if not src.requires_grad and not base.requires_grad:
        return
    shape, perm, slice_shape, src_dtype = base.shape, base.perm, src.shape, src.dtype

    def back(ctx, g):
        result = empty(shape, g[0].dtype, "new_empty_strided")
        result.perm = perm
        grad_slice = empty(slice_shape, g[0].dtype, "clone")
        if ctx.need[0]:
            zeros = empty(slice_shape, g[0].dtype, "zeros_like")  # CopyBackwards' gradient for the old slice
            del zeros
        # CopyBackwards: ``grad.to(src's dtype)``, made while the result and the clone live
        grad_src = grad_slice if src_dtype == g[0].dtype else empty(slice_shape, src_dtype, "_to_copy")
        return result, grad_src

    record("CopySlices", (base, src), (base,), back)
