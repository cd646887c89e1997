"""``split`` / ``chunk`` on symbolic tensors: one multi-output view node (``SplitBackward0``).

torch 2.13 (``tools/autograd/derivatives.yaml``, ``split.Tensor``: ``split_backward``): the outputs are views
of the input; the backward makes zeros for an output that got no gradient and ``cat``s the gradients along
the split dim: one tensor of the input's shape (``FunctionsManual.cpp`` ``split_backward``).  No torch.
"""

from __future__ import annotations

from .tensors import Dim, Tensor, empty, record


def split(t: Tensor, size: Dim, dim: int) -> list[Tensor]:
    """``t.split(size, dim)`` for a size that divides the dim."""
    dim = dim % t.ndim
    parts = t.shape[dim] // size
    shape = t.shape[:dim] + (size,) + t.shape[dim + 1 :]
    outs = [t.alias(shape, t.perm, t.zero) for _ in range(parts)]
    src, dtype = t.shape, t.dtype

    def back(ctx, grads):
        zeros = [empty(shape, dtype, "zeros") for g in grads if g is None]
        out = empty(src, dtype, "cat")
        del zeros
        return (out,)

    record("SplitBackward0", (t,), outs, back)
    return outs


def chunk(t: Tensor, chunks: int, dim: int) -> list[Tensor]:
    """``t.chunk(chunks, dim)`` for a dim that ``chunks`` divides (``split`` of dim // chunks)."""
    return split(t, t.shape[dim % t.ndim] // chunks, dim)
