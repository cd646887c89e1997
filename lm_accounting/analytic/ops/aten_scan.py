"""The aten ops of the recurrent mixers' PyTorch paths: the Mamba2 mixer's (transformers 5.24 ``mamba2_chunk_scan``
and ``causal_conv1d_fn``, models/nemotron_h/modeling_nemotron_h.py) and, beside ``aten_recurrent``'s, the Gated
DeltaNet's (``torch_chunk_gated_delta_rule``, models/qwen3_next/modeling_qwen3_next.py): ``permute``, ``einsum``,
``cumsum``, ``masked_fill``, ``softplus``, ``constant_pad_nd`` and the depthwise ``conv1d`` (with or without a
bias).

torch 2.13 (``tools/autograd/derivatives.yaml``, ``torch/csrc/autograd/FunctionsManual.cpp``,
``aten/src/ATen/native/Linear.cpp``):

* ``permute``: a view; backward the inverse permutation (a view).
* ``einsum`` of two operands (``Linear.cpp`` ``einsum``): each operand unsqueezed for its missing labels and
  permuted to the output's labels then the contracted ones (in subscript order, A-Z then a-z); then
  ``sumproduct_pair``: the dims split into lro (both operands and the output), lo, ro and summed, the operands
  swapped when every ro dim precedes every lo dim, each permuted and *reshaped* to 3-d (a view, or a copy where
  the layout forbids one: ``aten.reshape``), one ``bmm``, its output viewed and permuted back, and the contracted
  dims dropped by a view.  What is saved is bmm's (both 3-d operands).
* ``cumsum``: saves nothing; backward ``grad.flip(dim).cumsum(dim).flip(dim)`` (three tensors, the first two
  dying at the end), the gradient itself where the dim has one element.
* ``masked_fill(self, mask, number)``: a new tensor of the broadcast shape; saves ``mask``; backward
  ``grad.masked_fill(mask, 0)``: one tensor.
* ``softplus``: saves its input; backward ``softplus_backward``: one tensor.
* ``constant_pad_nd``: a new tensor laid out as its input (the layout permutation kept); saves nothing; backward
  ``constant_pad_nd`` of the gradient with the negated pads: one tensor of the input's shape.
* ``convolution`` (``F.conv1d`` with ``groups`` = channels): output (B, C, S + 2·padding − K + 1); saves input and
  weight; backward ``convolution_backward``: input's gradient (contiguous), then weight's and bias's.
* ``square``: ``pow(x, 2)`` without ``pow``'s autocast policy.

Under autocast (CUDA's lists, ``model.autocast``): ``einsum`` and ``conv1d`` are lower-precision ops, ``softplus``
an fp32 op, ``cumsum`` sets ``dtype=float32``.
No torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from .aten import (
    bmm,
    broadcast,
    lower,
    mul,
    opt_dtype,
    pow_,
    promote,
    reshape,
    silu,
    slice_,
    sum_to,
    to,
    unsqueeze,
    upcast,
    view,
)
from .aten_pointwise import new
from .tensors import Tensor, current, empty, numel, record, record_first, view_of


def permute(t: Tensor, *dims: int) -> Tensor:
    """``t.permute(dims)``: new dim i is old dim ``dims[i]``."""
    dims = tuple(d % t.ndim for d in dims)
    where = {old: new_ for new_, old in enumerate(dims)}
    perm = tuple(where[p] for p in t.perm)
    zero = tuple(where[z] for z in t.zero)
    shape = tuple(t.shape[d] for d in dims)
    inverse = tuple(dims.index(i) for i in range(len(dims)))
    return view_of(t, shape, perm, "PermuteBackward0", lambda g: permute(g, *inverse), zero)


def _label_key(c: str) -> tuple:
    return (c.islower(), c)  # ``label_to_subscript``: A-Z, then a-z


def einsum(equation: str, a: Tensor, b: Tensor) -> Tensor:
    """``torch.einsum(equation, a, b)`` without ellipsis or repeated labels."""
    a, b = lower(a, b)  # a lower-precision op under autocast: its operands cast last first
    lhs, out = equation.replace(" ", "").split("->")
    labels = lhs.split(",")
    order = list(out) + sorted(set("".join(labels)) - set(out), key=_label_key)
    ops, counts = [], [0] * len(order)
    for sub, t in zip(labels, (a, b), strict=True):
        perm = [-1] * len(order)
        for dim, c in enumerate(sub):
            perm[order.index(c)] = dim
            if t.shape[dim] != 1:
                counts[order.index(c)] += 1
        op, ndim = t, t.ndim
        for i, p in enumerate(perm):
            if p == -1:
                op = unsqueeze(op, ndim)
                perm[i] = ndim
                ndim += 1
        ops.append(permute(op, *perm))
    del t, op
    left, right = ops
    sum_dims = []
    for d in range(len(out), len(order)):
        if left.shape[d] != 1 and right.shape[d] != 1:
            counts[d] -= 1
            if counts[d] == 1:
                sum_dims.append(d)
        elif counts[d] == 1:  # only one operand has it: summed right away (not in the programs' equations)
            raise NotImplementedError(f"einsum {equation}: label {order[d]} in one operand only")
    result = sumproduct_pair(left, right, sum_dims)
    del left, right, ops
    if len(order) > len(out):
        result = view(result, *result.shape[: len(out)])
    del b, a  # autocast's copies die last first (the argument tuple of the cast call)
    return result


def sumproduct_pair(left: Tensor, right: Tensor, sum_dims: Sequence[int]) -> Tensor:
    """``sumproduct_pair(left, right, sum_dims, keepdim=True)`` (Linear.cpp) of two aligned operands."""
    lro, lo, ro = [], [], []
    lro_size = lo_size = ro_size = sum_size = 1
    for i in range(left.ndim):
        sl, sr = left.shape[i] != 1, right.shape[i] != 1
        if i in sum_dims:
            if sl and sr:
                sum_size = sum_size * left.shape[i]
            elif sl or sr:
                raise NotImplementedError("a summed dim in one operand only")
        elif sl and sr:
            lro.append(i)
            lro_size = lro_size * left.shape[i]
        elif sl:
            lo.append(i)
            lo_size = lo_size * left.shape[i]
        else:
            ro.append(i)
            ro_size = ro_size * right.shape[i]
    if lo and ro and ro[-1] < lo[0]:  # swap_lo_ro: bmm then writes the output in its order
        left, right, lo, ro, lo_size, ro_size = right, left, ro, lo, ro_size, lo_size
    out_size = [left.shape[d] for d in lro + lo] + [1] * len(sum_dims) + [right.shape[d] for d in ro]
    lperm = lro + lo + list(sum_dims) + ro
    rperm = lro + list(sum_dims) + ro + lo
    operm = [0] * len(out_size)
    for i, d in enumerate(lro + lo + list(sum_dims) + ro):
        operm[d] = i
    left = reshape(permute(left, *lperm), lro_size, lo_size, sum_size)
    right = reshape(permute(right, *rperm), lro_size, sum_size, ro_size)
    result = bmm(left, right)
    del right, left  # C++ destroys its locals in reverse: the right operand's copy dies first
    return permute(view(result, *out_size), *operm)


def cumsum(x: Tensor, dim: int) -> Tensor:
    """``torch.cumsum(x, dim)``."""
    dim = dim % x.ndim
    dtype = opt_dtype(None)  # under autocast ``dtype=float32``: the programs' inputs are fp32 already
    if dtype is not None and dtype != x.dtype:
        raise NotImplementedError("cumsum of a 16-bit tensor under autocast")
    out = new(x.shape, x.dtype, "cumsum", x)

    def back(ctx, g):
        if numel(g[0].shape) == 1 or g[0].shape[dim] == 1:
            return (g[0],)
        flipped = empty(g[0].shape, g[0].dtype, "flip")
        summed = empty(g[0].shape, g[0].dtype, "cumsum")
        grad = empty(g[0].shape, g[0].dtype, "flip")
        del flipped, summed
        return (grad,)

    record("CumsumBackward0", (x,), (out,), back)
    return out


def masked_fill(x: Tensor, mask: Tensor, number: float) -> Tensor:
    """``x.masked_fill(mask, number)``: saves the mask; backward ``grad.masked_fill(mask, 0)``."""
    shape = broadcast(x.shape, mask.shape)
    out = empty(shape, x.dtype, "masked_fill")

    def back(ctx, g, m):
        return (sum_to(new(g[0].shape, g[0].dtype, "masked_fill", g[0]), ctx.shape),)

    record("MaskedFillBackward0", (x,), (out,), back, (mask,), shape=x.shape)
    return out


def softplus(x: Tensor) -> Tensor:
    """``F.softplus(x)``: saves x; backward ``softplus_backward(grad, self, beta, threshold)``."""
    x = upcast(x)  # an fp32 op under autocast
    back = lambda ctx, g, sx: (new(sx.shape, promote(g[0], sx), "softplus_backward", g[0], sx),)
    return record_first("SoftplusBackward0", (x,), lambda: (new(x.shape, x.dtype, "softplus", x),), back, (x,))[0]


CHANNELS_LAST = {4: (0, 2, 3, 1), 5: (0, 2, 3, 4, 1)}  # memory order of channels-last (3d) tensors


def constant_pad_nd(x: Tensor, dim: int, before: int, after: int) -> Tensor:
    """``F.pad(x, ...)`` (mode "constant") padding only ``dim``: a new tensor (``_padded``); no padding at all is
    ``clone()`` (``all_pads_non_positive``: the narrowed input cloned, its layout kept)."""
    dim = dim % x.ndim
    shape = x.shape[:dim] + (before + x.shape[dim] + after,) + x.shape[dim + 1 :]
    out = _padded(shape, x, clone=before == after == 0)
    src = x.shape
    record("ConstantPadNdBackward0", (x,), (out,), lambda ctx, g: (_padded(src, g[0], clone=False),))
    return out


def _padded(shape: tuple, x: Tensor, clone: bool) -> Tensor:
    """``constant_pad_nd``'s output (torch 2.13 PadNd.cpp): ``at::empty`` in ``x.suggest_memory_format()``, contiguous
    unless x is laid out channels-last (4-d or 5-d: its dim 1 innermost), whose layout it keeps; a clone keeps any
    layout of x without broadcast dims."""
    out = empty(shape, x.dtype, "constant_pad_nd")
    if not any(x.shape[d] != 1 for d in x.zero) and (clone or CHANNELS_LAST.get(x.ndim) == x.perm):
        out.perm = x.perm
    return out


def conv1d_depthwise(x: Tensor, weight: Tensor, bias: Tensor | None, padding: int) -> Tensor:
    """``F.conv1d(x, weight, bias, padding=padding, groups=C)`` of x (B, C, S) and weight (C, 1, K)."""
    given = (x, weight, bias)  # the caller's arguments live until the op returns
    (bias,) = lower(bias)  # autocast: the cached leaf first (the bias), then input, then the weight (a view)
    (x,) = lower(x)
    (weight,) = lower(weight)
    b, c, s = x.shape
    k = weight.shape[-1]

    def back(ctx, g, sx, sw):
        gx = empty(sx.shape, g[0].dtype, "convolution_backward") if ctx.need[0] else None
        gw = empty(sw.shape, g[0].dtype, "convolution_backward") if ctx.need[1] else None
        gb = empty((c,), g[0].dtype, "convolution_backward") if ctx.need[2] else None
        return gx, gw, gb

    shape, dtype = (b, c, s + 2 * padding - k + 1), promote(x, weight)
    make = lambda: (empty(shape, dtype, "convolution"),)
    out = record_first("ConvolutionBackward0", (x, weight, bias), make, back, (x, weight))[0]
    del x, weight, bias  # autocast's copies (the cast input, then the weight; the bias's is cached)
    del given
    return out


def square(x: Tensor) -> Tensor:
    """``torch.square(x)``: ``at::pow(x, 2)``, saving x; backward ``grad * (2 * x.pow(1))`` (``aten.pow_``'s).  Its
    name is in none of CUDA's autocast lists, but the dispatcher decomposes it into ``pow`` below the autocast key,
    so on CUDA autocast's fp32 policy for ``pow`` applies (an H100 measured Nemotron-H's relu² so: one fp32 copy of
    the ReLU's output saved per MLP layer, reports/cuda-h100); the emulation on meta and cpu (``measure.hf``'s
    ``HFAutocast``) sees ``torch.square`` alone and casts nothing."""
    if current().target.device == "cuda":
        x = upcast(x)

    def back(ctx, g, sx):
        tmp = pow_(sx, 1.0)  # C++ temporaries: both live until the full expression ends
        tmp2 = mul(tmp, 2.0)
        return (mul(g[0], tmp2),)

    return record_first("PowBackward0", (x,), lambda: (empty(x.shape, x.dtype, "pow", like=x),), back, (x,))[0]


def causal_conv1d(hidden_states: Tensor, weight: Tensor, bias: Tensor | None, activation: bool) -> Tensor:
    """transformers' PyTorch fallback of ``causal_conv1d_fn`` on x (B, C, S) and the squeezed weight (C, K)
    (modeling_mamba2.py, modeling_falcon_mamba.py, modeling_qwen3_next.py, modeling_lfm2.py):
    ``F.conv1d(x.to(weight.dtype), weight.unsqueeze(1), bias, padding=K - 1, groups=C)[..., :S]``, SiLU'd where
    ``activation`` ("silu"; LFM2's has none), cast back to x's dtype."""
    seq_len = hidden_states.shape[-1]
    out = conv1d_depthwise(to(hidden_states, weight.dtype), unsqueeze(weight, 1), bias, weight.shape[-1] - 1)
    out = slice_(out, -1, 0, seq_len)
    if activation:
        out = silu(out)
    return to(out, hidden_states.dtype)
