"""``scaled_dot_product_attention``'s math path on symbolic tensors.

torch 2.13 runs ``_scaled_dot_product_attention_math`` (``aten/src/ATen/native/transformers/attention.cpp``)
where no fused kernel takes the call: on the cpu whenever ``dropout_p > 0`` (``sdp_utils_cpp.cpp``
``use_flash_attention_cpp``: ``check_for_dropout``), and on meta.  It is CompositeImplicit, so autograd sees its
pieces: ``query * sqrt(scale)``; for ``is_causal`` a (L, S) bool ``ones(...).tril()`` turned into an additive
mask of the query's dtype (``convert_boolean_attn_mask``: ``where(mask, 0, -inf)``); ``key.transpose(-2, -1) *
sqrt(scale)``; ``matmul``; the mask added (``attn.add_(mask)`` in a plain run, ``attn.add(mask)`` under a dispatch
mode: a traced run); ``_safe_softmax`` (saves its result, like ``_softmax``); ``dropout``; ``matmul`` with the
values.  No torch.
"""

from __future__ import annotations

from . import aten as A
from .aten_activation import dropout
from .tensors import Tensor, autocast_off, current, empty


def sdpa_math(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    causal: bool,
    dropout_p: float = 0.0,
    device: str = "meta",
    mask: Tensor | None = None,
    gqa: bool = True,
) -> Tensor:
    """``F.scaled_dot_product_attention(query, key, value, attn_mask=mask, is_causal=causal, dropout_p=dropout_p,
    enable_gqa=gqa)`` by the math path: the output (B, h, L, d_v).  Grouped K/V heads are repeated
    (``enable_gqa``), or without it broadcast by the matmuls (copies there).  A bool ``mask`` becomes an additive
    one of the query's dtype first (``convert_boolean_attn_mask``: two 0-d scalars and ``where``).  A bf16/fp16
    query, key and value are upcast to fp32 first and the results cast back; of ``make_tuple(matmul(attn,
    value).to(dtype), attn.to(dtype))`` the second (discarded by the caller) is evaluated first (measured: torch
    2.13, cpu)."""
    query, key, value = A.lower(query, key, value)  # under autocast: a lower-precision op
    with internals():
        additive = None
        if mask is not None:
            zero, low = empty((), query.dtype, "scalar_tensor"), empty((), query.dtype, "scalar_tensor")
            additive = empty(mask.shape, query.dtype, "where")
            del zero, low
        return _math(query, key, value, causal, dropout_p, device, additive, gqa)


internals = autocast_off
"""The composite's own ops, which a function-level autocast (``measure.hf``'s emulation) never sees."""


def _math(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    causal: bool,
    dropout_p: float,
    device: str,
    mask: Tensor | None = None,
    gqa: bool = True,
) -> Tensor:
    origin = query.dtype
    query_acc, key_acc, value_acc = (A.to(t, "fp32") for t in (query, key, value))
    scaling_factor = query.shape[-1] ** -0.25
    q = A.mul_scalar(query_acc, scaling_factor)  # mul.Scalar: MulBackward1
    if causal:
        lq, lk = query.shape[-2], key.shape[-2]
        ones = empty((lq, lk), "bool", "ones")
        tril = empty((lq, lk), "bool", "tril")
        del ones
        zero, low = empty((), q.dtype, "scalar_tensor"), empty((), q.dtype, "scalar_tensor")
        mask = empty((lq, lk), q.dtype, "where")
        del zero, low, tril
    groups = query.shape[-3] // key.shape[-3]
    key_rep, value_rep = key_acc, value_acc  # the upcast copies stay held beside the repeated ones
    if gqa and groups > 1:  # enable_gqa: pre_process_group_query_attention_input, repeat_interleave on the head dim
        key_rep, value_rep = repeat_interleave(key_acc, groups), repeat_interleave(value_acc, groups)
    attn = A.matmul(q, A.mul_scalar(A.transpose(key_rep, -2, -1), scaling_factor))  # the scaled key: a temporary
    if mask is not None and current().traced:
        attn = A.add(attn, mask)
    elif mask is not None:  # attn.add_(mask): a plain CPU run copies a mask of another dtype to attn's first
        promoted = A.mixed_copies(attn.dtype, mask)
        del promoted
    probs = A.softmax(attn, -1)
    current().target.safe_softmax(attn)  # ``_safe_softmax``'s temporaries, its input alive (``cuda.Cuda``)
    attn = probs
    del probs
    attn = dropout(attn, dropout_p, device=device)
    weights = A.to(attn, origin)
    out = A.to(A.matmul(attn, value_rep), origin)
    del weights
    return out  # the locals (the upcast inputs, the scaled query, the mask) die after it


def repeat_interleave(t: Tensor, repeats: int) -> Tensor:
    """``t.repeat_interleave(repeats, -3)`` (Repeat.cpp, an int ``repeats``): ``unsqueeze``, ``expand``, a
    contiguous ``clone`` and a ``view`` (measured, torch 2.13): a copy even of one K/V head, which a reshape
    would view."""
    b, kv, s, d = t.shape
    expanded = A.expand(A.unsqueeze(t, 2), b, kv, repeats, s, d)
    return A.view(A.clone(expanded, contiguous=True), b, kv * repeats, s, d)
