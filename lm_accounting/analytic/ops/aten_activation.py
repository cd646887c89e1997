"""Activations and dropout on symbolic tensors: ``tanh``, ``gelu`` (exact or tanh), ``relu``, ``dropout``.

torch 2.13 (``tools/autograd/derivatives.yaml``): ``tanh`` saves its result, backward ``tanh_backward(grad,
result)``; ``relu`` saves its result, backward ``threshold_backward(grad, result, 0)``; ``gelu`` saves its input, backward ``gelu_backward(grad, self, approximate)``: one tensor each.
``dropout`` (``aten/src/ATen/native/Dropout.cpp``): on CUDA a fused ``native_dropout`` (the output and a
bool mask); on cpu and meta (``is_fused_kernel_acceptable`` is false) ``_dropout_impl``:
``noise = empty_like(input).bernoulli_(1 - p).div_(1 - p)``, then ``input * noise`` (autograd saves the
noise: ``MulBackward0``, the gradient is ``grad * noise``).  p = 0 or eval mode: the input itself.  No torch.
"""

from __future__ import annotations

from .aten import mul
from .tensors import Tensor, empty, record, record_first


def tanh(x: Tensor) -> Tensor:
    out = empty(x.shape, x.dtype, "tanh", like=x)
    record(
        "TanhBackward0",
        (x,),
        (out,),
        lambda ctx, g, res: (empty(res.shape, res.dtype, "tanh_backward", like=res),),
        (out,),
    )
    return out


def relu(x: Tensor) -> Tensor:
    """``F.relu(x)``: the result is saved (``ReluBackward0``), as ``tanh``'s."""
    out = empty(x.shape, x.dtype, "relu", like=x)
    record(
        "ReluBackward0",
        (x,),
        (out,),
        lambda ctx, g, res: (empty(res.shape, res.dtype, "threshold_backward", like=res),),
        (out,),
    )
    return out


def gelu(x: Tensor) -> Tensor:
    """``F.gelu(x)`` or ``F.gelu(x, approximate="tanh")`` (the same bytes); the input is saved (packed) before
    the output is made (``record_first``)."""

    def back(ctx, g, inp):
        return (empty(inp.shape, inp.dtype, "gelu_backward", like=inp),)

    return record_first("GeluBackward0", (x,), lambda: (empty(x.shape, x.dtype, "gelu", like=x),), back, (x,))[0]


def dropout(x: Tensor, p: float, training: bool = True, device: str = "meta") -> Tensor:
    """``F.dropout(x, p, training)`` on ``device`` ("meta", "cpu" or "cuda")."""
    if p == 0 or not training:
        return x
    if device == "cuda":  # native_dropout: (output, mask); backward native_dropout_backward(grad, mask, scale)
        out = empty(x.shape, x.dtype, "native_dropout", like=x)
        mask = empty(x.shape, "bool", "native_dropout", like=x)
        dtype = x.dtype

        def back(ctx, g, m):
            return (empty(m.shape, dtype, "native_dropout_backward"),)

        record("NativeDropoutBackward0", (x,), (out,), back, (mask,))
        return out
    noise = empty(x.shape, x.dtype, "empty_like", like=x)  # bernoulli_ and div_ work in place
    return mul(x, noise)
