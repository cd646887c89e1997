"""The aten ops of the Gated DeltaNet's torch path (``torch_chunk_gated_delta_rule`` in
``models/qwen3_next/modeling_qwen3_next.py``) beyond the Mamba2 scan's (``aten_scan``: padding, cumulative sums,
masked fills, softplus, the depthwise conv1d): triangular solves, an upper-triangular mask and a copy into a selected
slice.

torch 2.13 (``tools/autograd/derivatives.yaml``, ``torch/csrc/autograd/FunctionsManual.cpp``,
``torch/csrc/autograd/functions/tensor.cpp``), each checked against the storage tracker's trace of transformers'
model (tests/test_ops_transformers_gdn.py):

* ``linalg_solve_triangular(A, B, upper=False, unitriangular=True)``: the result laid out column-major in its last
  two dims (LAPACK's); saves A and the result; backward ``G_B = solve_triangular(Aᴴ, grad)`` (column-major), then
  for A ``tril(-(G_B @ Xᴴ), -1)`` (the product and its negation dying once the next exists), A's gradient first.
* ``copy_`` into ``base.select(dim, i)`` (``base[:, :, i] = src``): no bytes; ``CopySlices`` on the base, whose
  backward makes ``new_empty_strided`` of the base (its layout), clones the slice's gradient (contiguous), casts it to
  the source's dtype if it differs, and, when the base already needed a gradient, makes the ``zeros_like`` of that
  clone that ``CopyBackwards`` returns for it.
No torch.
"""

from __future__ import annotations

from . import aten as A
from .aten_pointwise import new
from .tensors import Tensor, empty, record


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
