"""Indexing on symbolic tensors: ``index`` (``weight[ids]``), ``gather``, strided slices and ``stack``.

torch 2.13 (``tools/autograd/derivatives.yaml``, ``torch/csrc/autograd/FunctionsManual.cpp``):

* ``index.Tensor`` (``t[ids]``): one new tensor ``ids.shape + t.shape[1:]``; saves the indices; backward
  ``index_backward(grad.new_zeros(self.sizes()), indices, grad)``: zeros of ``t``'s shape, then
  ``index_put_`` into them, in place in a plain run; out of place when traced (``areAnyTensorSubclassLike``:
  a new tensor, then the zeros die).
* ``gather``: one new tensor of the index's shape; saves ``self`` and the index; backward ``gather_backward``:
  ``new_zeros(self.sizes())`` and ``scatter_add_`` (traced: ``scatter_add``, a new tensor, then the zeros die).
* ``t[..., start::step]`` (``slice`` with a step): a view that is not contiguous; backward ``slice_backward``:
  one tensor of ``t``'s shape.
* ``stack``: one new contiguous tensor; backward ``unbind``: views.
* ``topk`` and ``max(dim)``: the values and int64 indices; saves the indices; backward
  ``value_selecting_reduction_backward``: zeros of the input's shape and a ``scatter_`` into them (traced:
  ``scatter``, a new tensor, then the zeros die).
* ``repeat_interleave(k, dim=0)`` (``aten/src/ATen/native/Repeat.cpp``, an int count): ``unsqueeze``, ``expand``
  and one contiguous ``clone``, flattened (a view); the backward sums the expanded dim (one tensor).
* ``t.repeat(n, 1)`` of a 2-d ``t``: one new (n·rows, d) tensor; saves nothing; backward ``repeat_backward``: the
  gradient reshaped (n, rows, d) and summed over the copies (one tensor).
* ``t.scatter_(dim, index, src)`` of a ``t`` that needs no gradient (``full_like(...).scatter_``): in place, the
  result shares ``t``'s storage; ``ScatterBackward1`` saves the index; backward, src's ``grad.gather(dim, index)``
  (one tensor of the index's shape).
No torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from . import aten as A
from .aten import promote
from .tensors import ITEMSIZE, Storage, Tensor, current, empty, numel, record, record_first, view_of


def _into_zeros(shape: tuple, dtype: str, name: str, fp32_sum: bool = False) -> Tensor:
    """``new_zeros(shape)`` then an accumulating write into it: in place in a plain run, a new tensor when
    traced (the zeros then die).  ``fp32_sum``: the CPU's 16-bit ``scatter_add_`` accumulates in an fp32 copy of
    its output, made and freed inside the kernel (a plain CPU run)."""
    zeros = empty(shape, dtype, "new_zeros")
    run = current()
    if fp32_sum and run.wraps and ITEMSIZE[dtype] == 2:
        acc = Storage(numel(shape) * 4, "scatter_add_fp32")
        del acc
    if not run.traced:
        return zeros
    out = empty(shape, dtype, name)
    del zeros
    return out


def index(t: Tensor, ids: Tensor, dim: int = 0) -> Tensor:
    """``t[ids]`` along dim 0, or along ``dim`` (``t[..., ids, :]``) (``aten.index.Tensor`` with one index
    tensor): the indices are saved (packed) before the output exists."""
    shape, dtype = t.shape, t.dtype
    dim = dim % t.ndim

    def back(ctx, g, i):
        grad = _into_zeros(shape, dtype, "index_put")
        current().target.index_put(i)  # CUDA: the ids sorted beside the zeros
        # the accumulation itself, in place: i.numel rows summed into shape[dim] slots (the saved ``i``: a closure
        # over ``ids`` would keep its storage alive until the node dies)
        current().note("index_put", dtype, i.numel, numel(shape[:dim] + shape[dim + 1 :]), shape[dim])
        return (grad,)

    make = lambda: (empty(shape[:dim] + ids.shape + shape[dim + 1 :], dtype, "index"),)
    return record_first("IndexBackward0", (t,), make, back, (ids,))[0]


def gather(t: Tensor, dim: int, idx: Tensor) -> Tensor:
    """``t.gather(dim, idx)``; the CPU kernel of a 16-bit ``t`` keeps fp32 index scratch, 4 bytes per output
    element, while it runs (a plain CPU run)."""
    out = empty(idx.shape, t.dtype, "gather")
    if current().wraps and ITEMSIZE[t.dtype] == 2:
        scratch = Storage(numel(idx.shape) * 4, "gather_scratch")
        del scratch

    def back(ctx, g, s, i):
        return (_into_zeros(s.shape, s.dtype, "scatter_add", fp32_sum=True),)

    record("GatherBackward0", (t,), (out,), back, (t, idx))
    return out


def strided_slice(t: Tensor, start: int, step: int) -> Tensor:
    """``t[..., start::step]`` (the last dim): a strided view (its layout is taken as its base's: the ops that
    read it here make new tensors either way)."""
    n = t.shape[-1]
    size = (n - start + step - 1) // step
    src = t.shape
    return view_of(
        t, t.shape[:-1] + (size,), t.perm, "SliceBackward0", lambda g: empty(src, g.dtype, "slice_backward"), t.zero
    )


def stack(ts: Sequence[Tensor], dim: int) -> Tensor:
    """``torch.stack(ts, dim)``: one new contiguous tensor; the backward unbinds the gradient (views)."""
    dim = dim % (ts[0].ndim + 1)
    shape = ts[0].shape[:dim] + (len(ts),) + ts[0].shape[dim:]
    out = empty(shape, promote(*ts), "stack")
    n = len(ts)

    def back(ctx, g):
        return tuple(g[0].alias(g[0].shape[:dim] + g[0].shape[dim + 1 :]) for _ in range(n))

    record("StackBackward0", tuple(ts), (out,), back)
    return out


def split_with_sizes(t: Tensor, sizes: Sequence[int], dim: int) -> list[Tensor]:
    """``t.split([n1, n2, ...], dim)``: views; backward ``split_with_sizes_backward``: zeros for a part that got
    no gradient, then one ``cat`` of the input's shape (laid out contiguously)."""
    dim = dim % t.ndim
    shapes = [t.shape[:dim] + (n,) + t.shape[dim + 1 :] for n in sizes]
    outs = [t.alias(shape, t.perm, t.zero) for shape in shapes]
    src, dtype = t.shape, t.dtype

    def back(ctx, grads):
        zeros = [empty(shape, dtype, "zeros") for shape, g in zip(shapes, grads, strict=True) if g is None]
        out = empty(src, dtype, "cat")
        del zeros
        return (out,)

    record("SplitWithSizesBackward0", (t,), outs, back)
    return outs


def topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """``x.topk(k, dim=-1)``: (values, indices)."""
    values = empty(x.shape[:-1] + (k,), x.dtype, "topk")
    indices = empty(x.shape[:-1] + (k,), "int64", "topk")
    shape, dtype = x.shape, x.dtype
    record("TopkBackward0", (x,), (values,), lambda ctx, g, i: (_into_zeros(shape, dtype, "scatter"),), (indices,))
    return values, indices


def max_values(x: Tensor, keepdim: bool = False) -> Tensor:
    """``x.max(dim=-1[, keepdim=True]).values``: the values and int64 indices; MaxBackward0 saves the indices
    (backward ``value_selecting_reduction_backward``, as ``topk``'s)."""
    return max_dim(x, keepdim)[0]


def max_dim(x: Tensor, keepdim: bool = False) -> tuple[Tensor, Tensor]:
    """``x.max(dim=-1[, keepdim=True])``: (values, int64 indices); MaxBackward0 saves the indices (the node dies
    with the values when nothing takes them)."""
    shape = x.shape[:-1] + ((1,) if keepdim else ())
    values = empty(shape, x.dtype, "max")
    indices = empty(shape, "int64", "max")
    src, dtype = x.shape, x.dtype
    record("MaxBackward0", (x,), (values,), lambda ctx, g, i: (_into_zeros(src, dtype, "scatter"),), (indices,))
    return values, indices


def repeat_interleave(t: Tensor, k: int) -> Tensor:
    """``t.repeat_interleave(k, dim=0)`` of a 2-d ``t``."""
    rows, d = t.shape
    return A.view(A.clone(A.expand(A.unsqueeze(t, 1), rows, k, d), contiguous=True), rows * k, d)


def repeat_rows(t: Tensor, n: int) -> Tensor:
    """``t.repeat(n, 1)`` of a 2-d ``t`` (rows, d): (n·rows, d), nothing saved; backward the gradient reshaped
    (n, rows, d) and summed over dim 0."""
    rows, d = t.shape
    out = empty((rows * n, d), t.dtype, "repeat")
    record("RepeatBackward0", (t,), (out,), lambda ctx, g: (A.sum_(A.reshape(g[0], n, rows, d), 0),))
    return out


def scatter_src_(t: Tensor, index: Tensor, src: Tensor) -> Tensor:
    """``t.scatter_(-1, index, src)`` of a ``t`` needing no gradient: no new storage (the result shares ``t``'s);
    ScatterBackward1 saves the index; backward src's ``grad.gather(-1, index)``."""
    out = t.detach()
    back = lambda ctx, g, i: (empty(i.shape, g[0].dtype, "gather"),)
    record("ScatterBackward1", (src,), (out,), back, (index,))
    return out
