"""Aten-level primitives on symbolic tensors, each written once: forward allocations, saved tensors and backward.

Every op follows torch 2.13 on a traced (meta) run: the forward's outputs and kernel temporaries, what
autograd saves (``tools/autograd/derivatives.yaml``: only what the wanted gradients read), and the backward
formula's allocations in the order the generated code runs them (the derivatives of one node in the
alphabetical order of their input names: ``torchgen/api/autograd.py`` sorts ``defn.keys()``; so mm's mat2
before self, mul's other before self).  CompositeImplicit ops (``linear``, ``matmul``, ``reshape``,
``softmax`` with a dtype, ``cross_entropy``) are written as their decompositions
(``aten/src/ATen/native/LinearAlgebra.cpp``, ``Linear.cpp``, ``TensorShape.cpp``, ``SoftMax.cpp``,
``LossNLL.cpp``).  Python numbers are 0-dim CPU tensors, invisible on the device (a CPU run's wrapped
scalars are a target fact, not modelled here yet).  No torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from .engine import Affine
from .tensors import (
    ITEMSIZE,
    Dim,
    Storage,
    Tensor,
    WrappedNumber,
    contiguous_perm,
    current,
    empty,
    numel,
    record,
    record_first,
    view_of,
    wants,
)

FLOAT_RANK = {"bf16": 1, "fp16": 1, "fp32": 2}


# -- shapes and layouts -------------------------------------------------------------------------


def broadcast(*shapes: Sequence[Dim]) -> tuple:
    n = max(len(s) for s in shapes)
    out = []
    for i in range(n):
        dims = [s[len(s) - n + i] for s in shapes if len(s) - n + i >= 0]
        big = [d for d in dims if d != 1]
        out.append(big[0] if big else 1)
    return tuple(out)


def promote(*ts: Tensor | float) -> str:
    """torch's type promotion for floating tensors: 0-dim tensors and Python numbers defer to dimensioned ones."""
    tensors = [t for t in ts if isinstance(t, Tensor)]
    dimmed = [t for t in tensors if t.ndim] or tensors
    dtypes = {t.dtype for t in dimmed}
    if len(dtypes) == 1:
        return dtypes.pop()
    floats = [d for d in dtypes if d in FLOAT_RANK]
    if len(floats) > 1 and {"bf16", "fp16"} <= set(floats):
        return "fp32"
    return max(floats, key=FLOAT_RANK.__getitem__) if floats else min(dtypes)


def _like(shape: tuple, *operands) -> tuple | None:
    """TensorIterator's output layout: that of the first operand of the full shape and no broadcast dims."""
    for t in operands:
        if isinstance(t, Tensor) and t.shape == shape and not any(t.shape[d] != 1 for d in t.zero):
            return t.perm
    return None


def _resolve(t: Tensor, shape: Sequence[Dim]) -> tuple:
    shape = list(shape)
    if -1 in [d for d in shape if isinstance(d, int)]:
        i = next(k for k, d in enumerate(shape) if isinstance(d, int) and d == -1)
        rest = numel([d for k, d in enumerate(shape) if k != i])
        shape[i] = _exact_div(t.numel, rest)
    return tuple(shape)


def _exact_div(n: Dim, d: Dim) -> Dim:
    if isinstance(d, Affine):
        if not isinstance(n, Affine):
            raise TypeError("a size is never quadratic in the batch")
        k = n.a // d.a if d.a else n.b // d.b
        if d * k != n:
            raise ArithmeticError(f"{n!r} is not a multiple of {d!r}")
        return k
    return n // d


def view_layout(t: Tensor, shape: tuple) -> tuple | None:
    """(perm, zero) of ``t.view(shape)``, or None where no view exists (``reshape`` then copies).

    A view can merge or split only dims that are adjacent and in order in memory (``computeStride``): the
    non-size-1 dims of ``t`` form chunks of such runs (a broadcast dim is a chunk of its own); the new
    shape must split at every chunk boundary."""
    return _view_layout(t.shape, tuple(t.perm), tuple(t.zero), tuple(shape))


@lru_cache(maxsize=4096)  # a function of the shapes and layout only; the same views recur in every program
def _view_layout(old: tuple, perm: tuple, zeros: tuple, shape: tuple) -> tuple | None:
    nz = [d for d in range(len(old)) if old[d] != 1]
    mem = [d for d in perm if d in nz]
    pos = {d: i for i, d in enumerate(mem)}
    chunks: list[list[int]] = []
    for d in nz:
        if chunks and d not in zeros and chunks[-1][-1] not in zeros and pos[d] == pos[chunks[-1][-1]] + 1:
            chunks[-1].append(d)
        else:
            chunks.append([d])
    new_nz = [i for i, d in enumerate(shape) if d != 1]
    keys: dict[int, tuple] = {}
    zero = []
    k, acc = 0, 1
    for i in new_nz:
        if k >= len(chunks):
            return None
        acc = shape[i] * acc
        keys[i] = (pos[chunks[k][0]], i)
        if chunks[k][0] in zeros:
            zero.append(i)
        if acc == numel([old[d] for d in chunks[k]]):
            k, acc = k + 1, 1
    if k != len(chunks) or acc != 1:
        return None
    order = sorted(new_nz, key=keys.__getitem__)
    perm = tuple(order + [i for i in range(len(shape)) if shape[i] == 1])
    return perm, tuple(zero)


# -- autocast (torch 2.13 ``aten/src/ATen/autocast_mode.h``: CUDA's lists, as ``model.autocast`` emulates) --


def lower(*args):
    """The arguments of a lower-precision op (``AT_FORALL_LOWER_PRECISION_FP``: linear, matmul, mm, bmm,
    addmm, scaled_dot_product_attention) under autocast, cast last first (``cached_cast`` inside one C++
    argument list); an fp32 leaf that requires grad is cast once per region and cached.  As measured (the
    emulation of ``measure.hf.HFAutocast``), the cached leaves are cast first, then the other arguments:
    ``addmm(bias, x, weight)`` casts weight, bias, x."""
    run = current()
    if run.autocast is None:
        return args
    out = list(args)
    for leaves in (True, False):
        for i in reversed(range(len(args))):
            t = args[i]
            if not isinstance(t, Tensor) or t.dtype not in FLOAT_RANK or t.dtype == run.autocast:
                continue
            leaf = t.dtype == "fp32" and t.requires_grad and t.grad_fn is None
            if leaf != leaves:
                continue
            if leaf:
                hit = run.autocast_cache.get(id(t))
                if hit is None:
                    hit = run.autocast_cache[id(t)] = (t, to(t, run.autocast))
                out[i] = hit[1]
            else:
                out[i] = to(t, run.autocast)
    return out


def upcast(t: Tensor) -> Tensor:
    """An fp32 op's argument under autocast (``AT_FORALL_FP32``: pow, rsqrt, exp, log, nll_loss, ...)."""
    if current().autocast is None or t.dtype not in FLOAT_RANK:
        return t
    return to(t, "fp32")


def opt_dtype(dtype: str | None) -> str | None:
    """``AT_FORALL_FP32_SET_OPT_DTYPE`` (softmax, log_softmax, sum, cumsum): fp32 unless a dtype is given."""
    return dtype if dtype is not None or current().autocast is None else "fp32"


# -- views ------------------------------------------------------------------------------------------


def view(t: Tensor, *shape: Dim) -> Tensor:
    """``Tensor.view``: an alias; its backward reshapes the gradient back (a view, or a copy)."""
    shape = _resolve(t, shape)
    layout = view_layout(t, shape)
    if layout is None:
        raise ValueError(f"view of {t} as {shape} needs a copy: use reshape")
    src = t.shape
    return view_of(t, shape, layout[0], "ViewBackward0", lambda g: reshape(g, *src), layout[1])


def reshape(t: Tensor, *shape: Dim) -> Tensor:
    """``Tensor.reshape``: a view where one exists, else ``_unsafe_view(clone(contiguous))``."""
    shape = _resolve(t, shape)
    if shape == t.shape:
        return t
    if view_layout(t, shape) is not None:
        return view(t, *shape)
    return unsafe_view(clone(t, contiguous=True), *shape)


def unsafe_view(t: Tensor, *shape: Dim) -> Tensor:
    shape = _resolve(t, shape)
    layout = view_layout(t, shape)
    src = t.shape
    return view_of(t, shape, layout[0], "UnsafeViewBackward0", lambda g: reshape(g, *src), layout[1])


def transpose(t: Tensor, i: int, j: int) -> Tensor:
    i, j = i % t.ndim, j % t.ndim
    shape = list(t.shape)
    shape[i], shape[j] = shape[j], shape[i]
    perm = tuple(j if p == i else i if p == j else p for p in t.perm)
    zero = tuple(j if p == i else i if p == j else p for p in t.zero)
    return view_of(t, shape, perm, "TransposeBackward0", lambda g: transpose(g, i, j), zero)


def t_(t: Tensor) -> Tensor:
    """``Tensor.t()`` of a matrix."""
    return transpose(t, 0, 1)


def unsqueeze(t: Tensor, dim: int) -> Tensor:
    dim = dim % (t.ndim + 1)
    shape = t.shape[:dim] + (1,) + t.shape[dim:]
    up = lambda d: d + 1 if d >= dim else d
    perm = tuple(up(p) for p in t.perm) + (dim,)
    return view_of(t, shape, perm, "UnsqueezeBackward0", lambda g: squeeze(g, dim), tuple(up(z) for z in t.zero))


def squeeze(t: Tensor, dim: int) -> Tensor:
    dim = dim % t.ndim
    shape = t.shape[:dim] + t.shape[dim + 1 :]
    down = lambda d: d - 1 if d > dim else d
    perm = tuple(down(p) for p in t.perm if p != dim)
    zero = tuple(down(z) for z in t.zero if z != dim)
    return view_of(t, shape, perm, "SqueezeBackward1", lambda g: unsqueeze(g, dim), zero)


def expand(t: Tensor, *shape: Dim) -> Tensor:
    """``Tensor.expand``: broadcast dims get stride 0; the backward sums the gradient back (``sum_to``).
    Expanding to the same shape (matmul's batch expand) is the tensor itself here: no bytes either way."""
    lead = len(shape) - t.ndim
    shape = tuple(t.shape[i - lead] if isinstance(d, int) and d == -1 else d for i, d in enumerate(shape))
    if shape == t.shape:
        return t
    zero = [i for i in range(len(shape)) if i < lead or (t.shape[i - lead] == 1 and shape[i] != 1)]
    zero += [z + lead for z in t.zero]
    perm = tuple(range(lead)) + tuple(p + lead for p in t.perm)
    src = t.shape
    return view_of(t, shape, perm, "ExpandBackward0", lambda g: sum_to(g, src), tuple(zero))


def slice_(t: Tensor, dim: int, start: int, end: int) -> Tensor:
    """``t[..., start:end]`` along ``dim``: a view; its backward writes the gradient into zeros of ``t``'s
    shape (``slice_backward``: one new tensor)."""
    dim = dim % t.ndim
    shape = t.shape[:dim] + (end - start,) + t.shape[dim + 1 :]
    src = t.shape
    return view_of(t, shape, t.perm, "SliceBackward0", lambda g: empty(src, g.dtype, "slice_backward"), t.zero)


def select(t: Tensor, dim: int, index: int) -> Tensor:
    """``t.select(dim, index)`` (``t[..., index, :]``): a view without that dim; backward ``select_backward``: a
    zero-filled tensor of ``t``'s shape."""
    dim = dim % t.ndim
    shape = t.shape[:dim] + t.shape[dim + 1 :]
    perm = tuple(p - (p > dim) for p in t.perm if p != dim)
    zero = tuple(z - (z > dim) for z in t.zero if z != dim)
    src = t.shape
    return view_of(t, shape, perm, "SelectBackward0", lambda g: empty(src, g.dtype, "select_backward"), zero)


def sum_to(g: Tensor, shape: tuple) -> Tensor:
    """``at::sum_to``: the tensor itself when the shapes agree, else one sum (keepdim), then a view."""
    if g.shape == tuple(shape):
        return g
    lead = g.ndim - len(shape)
    kept = tuple(1 if i < lead or (shape[i - lead] == 1 and g.shape[i] != 1) else d for i, d in enumerate(g.shape))
    out = empty(kept, g.dtype, "sum")
    # a reduction reads more than it writes (``analytic.step_time``), rows of its input's width
    current().note("reads", g.nbytes, g.shape[-1])
    current().target.sum_rows(g, kept)
    return out.alias(shape) if lead else out


# -- copies and casts -------------------------------------------------------------------------------


def clone(t: Tensor, contiguous: bool = False) -> Tensor:
    """``clone`` (``preserve_format``: a dense input keeps its layout) or ``clone(contiguous_format)``;
    its backward passes the gradient through (CloneBackward0)."""
    keep = not contiguous and not any(t.shape[d] != 1 for d in t.zero)
    out = empty(t.shape, t.dtype, "clone", like=t if keep else None)
    record("CloneBackward0", (t,), (out,), lambda ctx, g: (g[0],))
    return out


def contiguous(t: Tensor) -> Tensor:
    return t if t.is_contiguous() else clone(t, contiguous=True)


def to(t: Tensor, dtype: str) -> Tensor:
    """``Tensor.to(dtype)``: the tensor itself when the dtype agrees, else ``_to_copy`` (same layout)."""
    if t.dtype == dtype:
        return t
    out = empty(t.shape, dtype, "_to_copy", like=t)
    src = t.dtype
    record("ToCopyBackward0", (t,), (out,), lambda ctx, g: (to(g[0], src),))
    return out


# -- elementwise ------------------------------------------------------------------------------------


def _binary_out(a: Tensor, b, name: str, dtype: str | None = None) -> Tensor:
    shape = broadcast(a.shape, b.shape) if isinstance(b, Tensor) else a.shape
    common = promote(a, b)
    copies = mixed_copies(common, a, b)
    out = empty(shape, dtype or common, name)
    del copies
    perm = _like(shape, a, b)
    if perm is not None:
        out.perm = perm
    return out


def mixed_copies(common: str, *operands) -> list[Storage]:
    """A plain CPU run: TensorIterator copies each dimensioned operand of another floating dtype to the common
    one before it makes the output (``compute_types``: ``op.tensor().to(common_dtype_)``; CUDA casts inside
    the kernel), freed when the op returns: fp32 + bf16 under amp-bf16.  Inside the kernel: no tracker sees it."""
    if not current().wraps:
        return []
    return [
        Storage(t.numel * ITEMSIZE[common], "mixed_dtype_copy")
        for t in operands
        if isinstance(t, Tensor) and t.ndim and t.dtype != common and t.dtype in FLOAT_RANK and common in FLOAT_RANK
    ]


def wrap_scalar(dtype: str) -> Storage | None:
    """A plain CPU run (``Run.wraps``): the 0-d float64 (int64) tensor wrapping a Python number operand
    (8 bytes, ``scalar_to_tensor``); None elsewhere (on meta and cuda it is host memory the device never
    sees; the storage tracker sees no dispatch output)."""
    return Storage(8, "wrapped_number") if current().wraps else None


def cast_scalar(wrapped: Storage | None, dtype: str) -> Storage | None:
    """TensorIterator's copy of a wrapped CPU scalar to a floating op's dtype (freed when the op returns)."""
    return Storage(ITEMSIZE[dtype], "scalar_cast") if wrapped is not None and dtype in FLOAT_RANK else None


def _scalar_op(a: Tensor, number, name: str) -> tuple[Tensor, Storage | None]:
    """An op with a Python-number operand (``a * 0.5``, ``a + eps``, ``a / n``): on a plain CPU run the number
    is wrapped (8 bytes) and cast to the op's dtype (e bytes) before the output is made, the cast dying with
    the op and the wrapper with it unless autograd saves it (returned)."""
    wrapped = wrap_scalar(a.dtype)
    cast = cast_scalar(wrapped, a.dtype)
    out = _binary_out(a, number, name)
    del cast
    return out, wrapped


def _saving_scalar_op(a: Tensor, number, name: str, node: str) -> Tensor:
    """``a * number`` or ``a / number`` (``_scalar_op``) whose node saves the wrapper and applies it to the
    gradient (``grad * other``, ``grad / other``: the wrapper cast again to the gradient's dtype)."""
    out, wrapped = _scalar_op(a, number, name)
    if wants(a) is not None:
        held = WrappedNumber((), "int64", wrapped) if wrapped is not None else None

        def back_scalar(ctx, g, w):
            cast = cast_scalar(wrapped_again(w), g[0].dtype)
            grad = _binary_out(g[0], number, name)
            del cast
            return (grad,)

        record(node, (a,), (out,), back_scalar, (held,))
        del held
    del wrapped  # the op's own reference dies before its Python operands
    return out


def mul(a: Tensor, b: Tensor | float) -> Tensor:
    """``a * b``.  Saves b if a needs a gradient and a if b does; backward: other's (grad·self), then
    self's (grad·other), each then summed to its input's shape and cast to its dtype (validate_outputs).
    A number b is wrapped into a 0-d tensor (``_scalar_op``), the one MulBackward0 saves."""
    if not isinstance(b, Tensor):
        return _saving_scalar_op(a, b, "mul", "MulBackward0")
    need = wants(a, b)
    if need is None:
        return _binary_out(a, b, "mul")

    def back(ctx, g, sa, sb):
        gb = mul(g[0], sa) if ctx.need[1] else None
        ga = mul(g[0], sb) if ctx.need[0] else None
        return ga, gb

    saved = (a if need[1] else None, b if need[0] else None)
    return record_first("MulBackward0", (a, b), lambda: (_binary_out(a, b, "mul"),), back, saved)[0]


def mul_scalar(a: Tensor, number: float) -> Tensor:
    """``a * number`` inside a C++ composite (``mul.Scalar``, e.g. sdpa's math path): MulBackward1 keeps the
    number itself, no tensor; the wrapper lives inside the op (``_scalar_op``), and again in the backward's."""
    out, wrapped = _scalar_op(a, number, "mul")
    del wrapped
    record("MulBackward1", (a,), (out,), lambda ctx, g: (mul_scalar(g[0], number),))
    return out


def wrapped_again(w: Tensor | None) -> Storage | None:
    """A saved wrapped number (already a tensor: no new wrapper; its cast is made again per use)."""
    return w.storage if w is not None else None


def add(a: Tensor, b: Tensor | float, alpha: float = 1) -> Tensor:
    """``a + b``: nothing saved; both gradients are the incoming gradient itself (alpha 1)."""
    if isinstance(b, Tensor):
        out = _binary_out(a, b, "add")
    else:
        out, wrapped = _scalar_op(a, b, "add")
        del wrapped
    if isinstance(b, Tensor):
        record("AddBackward0", (a, b), (out,), lambda ctx, g: (g[0], g[0] if alpha == 1 else mul(g[0], alpha)))
    else:
        record("AddBackward1", (a,), (out,), lambda ctx, g: (g[0],))
    return out


def sub(a: Tensor, b: Tensor) -> Tensor:
    out = _binary_out(a, b, "sub")
    record("SubBackward0", (a, b), (out,), lambda ctx, g: (g[0], neg(g[0]) if ctx.need[1] else None))
    return out


def div(a: Tensor, b: float) -> Tensor:
    """``a / number``: Python wraps the number into a 0-d tensor (``_scalar_op``), so it is ``div.Tensor``, whose
    DivBackward0 saves other, the wrapper (8 bytes on a plain CPU run, held by a checkpointed region too), and
    divides the gradient by it (``div_tensor_self_backward``), as ``mul``'s MulBackward0."""
    return _saving_scalar_op(a, b, "div", "DivBackward0")


def div_(a: Tensor, number: float) -> Tensor:
    """``a /= number`` (``div_.Tensor``, the number wrapped as ``div``'s): no new storage, the result shares
    ``a``'s; DivBackward0 saves the wrapper and divides the gradient by it."""
    wrapped = wrap_scalar(a.dtype)
    cast = cast_scalar(wrapped, a.dtype)
    del cast
    out = a.detach()
    if wants(a) is not None:
        held = WrappedNumber((), "int64", wrapped) if wrapped is not None else None

        def back(ctx, g, w):
            cast = cast_scalar(wrapped_again(w), g[0].dtype)
            grad = _binary_out(g[0], number, "div")
            del cast
            return (grad,)

        record("DivBackward0", (a,), (out,), back, (held,))
        del held
    del wrapped
    return out


def add_(a: Tensor, b: Tensor) -> Tensor:
    """``a += b`` (``add_.Tensor``, b of a's dtype): no new storage, the result shares ``a``'s; AddBackward0 saves
    nothing."""
    out = a.detach()
    record("AddBackward0", (a, b), (out,), lambda ctx, g: (g[0], g[0]))
    return out


def neg(a: Tensor) -> Tensor:
    out = empty(a.shape, a.dtype, "neg", like=a)
    record("NegBackward0", (a,), (out,), lambda ctx, g: (neg(g[0]),))
    return out


def pow_(a: Tensor, exponent: float) -> Tensor:
    """``a.pow(exponent)``: saves a; backward ``grad * (exponent * a.pow(exponent - 1))``."""
    a = upcast(a)

    def back(ctx, g, sa):
        tmp = pow_(sa, exponent - 1)  # C++ temporaries: both live until the full expression ends
        tmp2 = mul(tmp, exponent)
        return (mul(g[0], tmp2),)

    return record_first("PowBackward0", (a,), lambda: (empty(a.shape, a.dtype, "pow", like=a),), back, (a,))[0]


def rsqrt(a: Tensor) -> Tensor:
    """Saves its result; backward ``-0.5 * grad * result.pow(3)`` (the pow first)."""
    a = upcast(a)
    out = empty(a.shape, a.dtype, "rsqrt", like=a)

    def back(ctx, g, res):
        p3 = pow_(res, 3)
        half = mul(g[0], -0.5)
        return (mul(half, p3),)

    record("RsqrtBackward0", (a,), (out,), back, (out,))
    return out


def unary(a: Tensor, name: str) -> Tensor:
    """An elementwise op without autograd use here (``cos``, ``sin``, ``exp`` of buffers; comparisons)."""
    return empty(a.shape, a.dtype, name, like=a)


def silu(a: Tensor) -> Tensor:
    """Saves its input; backward ``silu_backward(grad, self)``: one tensor."""
    back = lambda ctx, g, x: (_new_like(g[0], x, "silu_backward"),)
    return record_first("SiluBackward0", (a,), lambda: (empty(a.shape, a.dtype, "silu", like=a),), back, (a,))[0]


def _new_like(g: Tensor, x: Tensor, name: str) -> Tensor:
    out = empty(broadcast(g.shape, x.shape), promote(g, x), name)
    perm = _like(out.shape, g, x)
    if perm is not None:
        out.perm = perm
    return out


# -- reductions --------------------------------------------------------------------------------------


def mean(a: Tensor, dim: int, keepdim: bool = False) -> Tensor:
    """Backward: the gradient expanded back (a view), divided by the count: one tensor of ``a``'s shape."""
    dim = dim % a.ndim
    shape = a.shape[:dim] + ((1,) if keepdim else ()) + a.shape[dim + 1 :]
    out = empty(shape, a.dtype, "mean")
    current().note("reads", a.nbytes, a.shape[-1])
    wrapped = wrap_scalar(a.dtype)  # the CPU kernel divides the sum by a wrapped count
    cast = cast_scalar(wrapped, a.dtype)
    del cast, wrapped
    src = a.shape

    def back(ctx, g):
        grad = g[0] if keepdim else unsqueeze(g[0], dim)
        return (div(expand(grad, *src), 1),)

    record("MeanBackward1", (a,), (out,), back)
    return out


def sum_(a: Tensor, dim: int, keepdim: bool = False, dtype: str | None = None) -> Tensor:
    """Backward: the gradient expanded back (a view: no bytes; of another ``dtype``, autograd's
    ``validate_outputs`` casts it to ``a``'s)."""
    dim = dim % a.ndim
    shape = a.shape[:dim] + ((1,) if keepdim else ()) + a.shape[dim + 1 :]
    out = empty(shape, dtype or a.dtype, "sum")
    current().note("reads", a.nbytes, a.shape[-1])
    if dtype is not None and dtype != a.dtype and current().wraps:  # the CPU kernel reduces a copy in ``dtype``
        copy = Storage(a.numel * ITEMSIZE[dtype], "sum_input_cast")  # (make_reduction_from_out_ty: ``self.to``)
        del copy
    src = a.shape
    record("SumBackward1", (a,), (out,), lambda ctx, g: (expand(g[0] if keepdim else unsqueeze(g[0], dim), *src),))
    return out


def cat(ts: Sequence[Tensor], dim: int) -> Tensor:
    """One new tensor (``cat_column`` along the last dimension of rows: CUDA's strided ``CatArrayBatchedCopy``,
    priced at its own rate by ``step_time``); backward: a slice of the gradient per input (views)."""
    dim = dim % ts[0].ndim
    size = 0
    for t in ts:
        size = t.shape[dim] + size
    shape = ts[0].shape[:dim] + (size,) + ts[0].shape[dim + 1 :]
    out = empty(shape, promote(*ts), "cat_column" if dim == len(shape) - 1 > 0 else "cat")
    shapes = [t.shape for t in ts]
    record("CatBackward0", tuple(ts), (out,), lambda ctx, g: tuple(g[0].alias(s, g[0].perm) for s in shapes))
    return out


# -- matrix products ------------------------------------------------------------------------------


def _colmajor(t: Tensor) -> bool:
    return t.ndim == 2 and t.perm == (1, 0) and t.shape[0] != 1 and t.shape[1] != 1


def mm(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` (2-d).  Saves a if b needs a gradient, b if a does.  Backward: mat2's (``mm_mat2_backward``:
    laid out as mat2 is), then self's (``mm_mat1_backward``)."""
    a, b = lower(a, b)
    need = wants(a, b) or (False, False)
    shapes, cm = (a.shape, b.shape), (_colmajor(a), _colmajor(b))

    def back(ctx, g, sa, sb):
        gb = _mm_grad(shapes[1], g[0].dtype, cm[1]) if ctx.need[1] else None
        ga = _mm_grad(shapes[0], g[0].dtype, cm[0]) if ctx.need[0] else None
        _note_mm_grads(shapes, g[0].dtype, ctx.need)
        return ga, gb

    def make():
        _note_gemm(1, shapes[0][0], shapes[1][1], shapes[0][1], promote(a, b), "nt" if cm[1] else "nn")
        return (empty((a.shape[0], b.shape[1]), promote(a, b), "mm"),)

    saved = (a if need[1] else None, b if need[0] else None)
    return record_first("MmBackward0", (a, b), make, back, saved)[0]


def _note_gemm(batch: Dim, m: Dim, n: Dim, k: Dim, dtype: str, layout: str, lead: int | None = None) -> None:
    """The work of ``batch`` products (m, k) @ (k, n) in ``dtype``, operands laid out as ``layout`` says (``nt``:
    the second transposed, as ``x @ W.T``; ``nn``; ``tn``: the first transposed, as a weight gradient); ``lead``:
    the odd row stride of an operand read in place (``_odd_lead``: cuBLAS's ``align1`` kernels)."""
    current().note("gemm", dtype, layout, batch, m, n, k, lead)


def _odd_lead(t: Tensor) -> int | None:
    """The row stride of ``t`` when it is a row-major slice of rows of an odd length (gpt-oss's
    ``probs[..., :-1]``: 2,048 of each 2,049-wide row), which a product reads in place; else None."""
    base = t.base
    if base is None or t.perm != contiguous_perm(t.ndim) or base.perm != contiguous_perm(base.ndim):
        return None
    w, lead = t.shape[-1], base.shape[-1]
    if isinstance(lead, int) and lead % 2 and w < lead and numel(t.shape) * lead == numel(base.shape) * w:
        return lead
    return None


def _note_mm_grads(shapes: tuple, dtype: str, need) -> None:
    """An (m, k) @ (k, n) product's backward: mat2's gradient a.T @ g (k, n, reduced over m: ``tn``), then mat1's
    g @ b.T (m, k, reduced over n: ``nn`` for a linear's row-major weight)."""
    (m, k), (_, n) = shapes
    if need[-1]:
        _note_gemm(1, k, n, m, dtype, "tn")
    if need[-2]:
        _note_gemm(1, m, k, n, dtype, "nn")


def _mm_grad(shape: tuple, dtype: str, colmajor: bool) -> Tensor:
    """``mm_mat1_backward`` / ``mm_mat2_backward``: a new matrix, laid out as the input was (column-major
    inputs get ``(… ).t()`` of a row-major product)."""
    g = empty(shape, dtype, "mm")
    if colmajor:
        g.perm = (1, 0)
    return g


def addmm(bias: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """``bias + a @ b`` (beta = alpha = 1).  Backward: mat1's, mat2's, then self's (the gradient itself,
    summed to the bias's shape by validate_outputs)."""
    bias, a, b = lower(bias, a, b)
    need = wants(bias, a, b) or (False, False, False)
    shapes, cm = (a.shape, b.shape), (_colmajor(a), _colmajor(b))

    def back(ctx, g, sa, sb):
        ga = _mm_grad(shapes[0], g[0].dtype, cm[0]) if ctx.need[1] else None
        gb = _mm_grad(shapes[1], g[0].dtype, cm[1]) if ctx.need[2] else None
        _note_mm_grads(shapes, g[0].dtype, ctx.need[1:])
        return (g[0] if ctx.need[0] else None), ga, gb

    def make():
        _note_gemm(1, shapes[0][0], shapes[1][1], shapes[0][1], promote(a, b), "nt" if cm[1] else "nn")
        return (empty((a.shape[0], b.shape[1]), promote(a, b), "addmm"),)

    saved = (a if need[2] else None, b if need[1] else None)
    return record_first("AddmmBackward0", (bias, a, b), make, back, saved)[0]


def bmm(a: Tensor, b: Tensor) -> Tensor:
    """Batched ``a @ b``.  Backward: mat2's ``self.transpose(1, 2).bmm(grad)``, then self's
    ``grad.bmm(mat2.transpose(1, 2))``: new contiguous tensors."""
    a, b = lower(a, b)
    need = wants(a, b) or (False, False)
    sa_, sb_, lead = a.shape, b.shape, _odd_lead(a)  # a read in place: its row stride (cuBLAS's lda)

    def back(ctx, g, sa, sb):
        gb = empty(sb_, g[0].dtype, "bmm") if ctx.need[1] else None
        ga = empty(sa_, g[0].dtype, "bmm") if ctx.need[0] else None
        if ctx.need[1]:  # a.T @ g: (k, n) reduced over m; the saved a read in place again
            _note_gemm(sa_[0], sa_[2], sb_[2], sa_[1], g[0].dtype, "tn", lead)
        if ctx.need[0]:  # g @ b.T: (m, k) reduced over n
            _note_gemm(sa_[0], sa_[1], sa_[2], sb_[2], g[0].dtype, "nt")
        return ga, gb

    def make():
        _note_gemm(sa_[0], sa_[1], sb_[2], sa_[2], promote(a, b), "nn", lead)
        return (empty((a.shape[0], a.shape[1], b.shape[2]), promote(a, b), "bmm"),)

    saved = (a if need[1] else None, b if need[0] else None)
    return record_first("BmmBackward0", (a, b), make, back, saved)[0]


def baddbmm(bias: Tensor, batch1: Tensor, batch2: Tensor, alpha: float) -> Tensor:
    """``bias.baddbmm(batch1, batch2, beta=1.0, alpha=alpha)``: a lower-precision op under autocast; saves batch2
    for batch1's gradient and batch1 for batch2's (``tools/autograd/derivatives.yaml``); backward, in input order:
    ``grad.bmm(batch2ᵀ) * alpha``, then ``batch1ᵀ.bmm(grad) * alpha`` (``maybe_multiply``: ``mul.Scalar``)."""
    bias, batch1, batch2 = lower(bias, batch1, batch2)
    need = wants(bias, batch1, batch2) or (False, False, False)
    s1, s2 = batch1.shape, batch2.shape

    def back(ctx, g, b1, b2):
        g1 = mul_scalar(empty(s1, g[0].dtype, "bmm"), alpha) if ctx.need[1] else None  # the product dies
        g2 = mul_scalar(empty(s2, g[0].dtype, "bmm"), alpha) if ctx.need[2] else None
        return None, g1, g2

    def make():
        return (empty((s1[0], s1[1], s2[2]), promote(batch1, batch2), "baddbmm"),)

    saved = (batch1 if need[2] else None, batch2 if need[1] else None)
    return record_first("BaddbmmBackward0", (bias, batch1, batch2), make, back, saved)[0]


def matmul(a: Tensor, b: Tensor, call=None) -> Tensor:
    """``torch.matmul`` (LinearAlgebra.cpp ``_matmul_impl``): a ≥3-d by a matrix folds a to 2-d (a
    reshape: a view or a copy), one ``mm`` and an ``_unsafe_view``; two ≥3-d tensors expand their batch
    dims, reshape to 3-d and ``bmm``.  ``call(op, *args)``, if given, runs the ``mm``/``bmm`` (selective
    checkpointing's cache, ``course.sac``)."""
    call = call or (lambda op, *args: op(*args))
    a, b = lower(a, b)  # autocast casts at matmul, before its reshape copies (a transposed batch of keys)
    if a.ndim >= 3 and b.ndim == 2:
        folded = reshape(a, -1, a.shape[-1])
        return unsafe_view(call(mm, folded, b), *a.shape[:-1], b.shape[1])
    if a.ndim == 2 and b.ndim == 2:
        return call(mm, a, b)
    batch = broadcast(a.shape[:-2], b.shape[:-2])
    n = numel(batch)
    a3 = reshape(expand(a, *batch, *a.shape[-2:]), n, a.shape[-2], a.shape[-1])
    b3 = reshape(expand(b, *batch, *b.shape[-2:]), n, b.shape[-2], b.shape[-1])
    return unsafe_view(call(bmm, a3, b3), *batch, a.shape[-2], b.shape[-1])


def linear(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    """``F.linear`` (Linear.cpp): 2-d with a bias: ``addmm``; 3-d contiguous with a bias:
    ``_flatten_nd_linear`` (a view, ``addmm``, a view); else ``matmul(x, w.t())`` then ``+ bias``."""
    x, w, b = lower(x, w, b)
    if b is not None and x.ndim == 2:
        return addmm(b, x, t_(w))
    if b is not None and x.ndim == 3 and x.is_contiguous():
        flat = reshape(x, -1, x.shape[-1])
        return view(addmm(b, flat, t_(w)), *x.shape[:-1], w.shape[0])
    out = matmul(x, t_(w))
    return out if b is None else add(out, b)


# -- softmax and losses --------------------------------------------------------------------------------


def softmax(x: Tensor, dim: int, dtype: str | None = None) -> Tensor:
    """``F.softmax(x, dim, dtype)``: a cast first when ``dtype`` differs (SoftMax.cpp), then ``_softmax``,
    which saves its result; backward ``_softmax_backward_data``: one tensor."""
    dtype = opt_dtype(dtype)
    x = to(x, dtype) if dtype else x
    out = empty(x.shape, x.dtype, "_softmax", like=x)

    def back(ctx, g, res):
        grad_input = _new_like(g[0], res, "_softmax_backward_data")
        current().target.softmax_backward(g[0])  # CUDA's ``grad * output`` (``cuda.Cuda.softmax_backward``)
        return (grad_input,)

    record("SoftmaxBackward0", (x,), (out,), back, (out,))
    return out


def log_softmax(x: Tensor, dim: int, dtype: str | None = None) -> Tensor:
    dtype = opt_dtype(dtype)
    x = to(x, dtype) if dtype else x
    out = empty(x.shape, x.dtype, "_log_softmax", like=x)
    record(
        "LogSoftmaxBackward0",
        (x,),
        (out,),
        lambda ctx, g, res: (_new_like(g[0], res, "_log_softmax_backward_data"),),
        (out,),
    )
    return out


def nll_loss(x: Tensor, target: Tensor) -> Tensor:
    """``nll_loss_forward`` (reduction mean): a 0-d loss and a 0-d total weight; saves the input (for its
    shape), the target and the total weight; backward ``nll_loss_backward``: one tensor of the input's shape."""
    x = upcast(x)
    out = empty((), x.dtype, "nll_loss_forward")
    total = empty((), x.dtype, "nll_loss_forward")
    shape, dtype = x.shape, x.dtype
    record(
        "NllLossBackward0",
        (x,),
        (out,),
        lambda ctx, g, *s: (empty(shape, dtype, "nll_loss_backward"),),
        (x, target, total),
    )
    return out


def cross_entropy(x: Tensor, target: Tensor) -> Tensor:
    """``F.cross_entropy`` (LossNLL.cpp ``cross_entropy_loss``): ``nll_loss_nd(log_softmax(x, 1, dtype))``."""
    return nll_loss(log_softmax(x, 1, x.dtype), target)


def embedding(weight: Tensor, ids: Tensor) -> Tensor:
    """``F.embedding``: one new tensor; saves the ids; backward ``embedding_dense_backward``: a tensor of
    the weight's shape (meta: one op)."""
    shape, dtype = weight.shape, weight.dtype
    back = lambda ctx, g, i: (empty(shape, dtype, "embedding_dense_backward"),)
    make = lambda: (empty(ids.shape + weight.shape[1:], weight.dtype, "embedding"),)
    return record_first("EmbeddingBackward0", (weight,), make, back, (ids,))[0]


# -- CPU kernel scratch (a plain CPU run only) ---------------------------------------------------------


def _flash_blocks(seq: int) -> tuple[int, int]:
    """``cpu_flash_attention``'s block sizes (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp): q blocks
    of 256 from S = 768 on, 64 from 192, else 32; kv blocks of 512; each at most S."""
    q = 256 if seq >= 768 else 64 if seq >= 192 else 32
    return min(q, seq), min(512, seq)


def flash_scratch_forward(seq: int, d_head: int, dtype: str) -> None:
    """The CPU flash kernel's per-thread buffers, made after its outputs and freed before it returns:
    fp32 ``buf`` of n·(qs·ks + 2·qs + qs·d_head) and, for a 16-bit input, ``buf_reduced`` of n·qs·ks
    (n threads).  The allocator sees them (a plain CPU run); the tracker does not."""
    run = current()
    if not run.wraps:
        return
    qs, ks = _flash_blocks(seq)
    n = run.threads
    buf = Storage(n * (qs * ks + 2 * qs + qs * d_head) * 4, "flash_buf")
    reduced = Storage(n * qs * ks * 2, "flash_buf_reduced") if ITEMSIZE[dtype] == 2 else None
    del reduced, buf


def flash_scratch_backward(seq: int, dtype: str) -> None:
    """The CPU flash backward's buffers after dQ, dK, dV, freed before it returns: fp32 ``buf`` of
    n·2·qs·ks, for a 16-bit input ``buf_reduced`` of n·2·qs·ks, and the calling thread's ``dsum`` of qs fp32."""
    run = current()
    if not run.wraps:
        return
    qs, ks = _flash_blocks(seq)
    n = run.threads
    buf = Storage(n * 2 * qs * ks * 4, "flash_grad_buf")
    reduced = Storage(n * 2 * qs * ks * 2, "flash_grad_buf_reduced") if ITEMSIZE[dtype] == 2 else None
    dsum = Storage(qs * 4, "flash_dsum")
    del dsum, reduced, buf
