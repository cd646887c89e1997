"""CUDA's bf16 autocast, emulated for meta and cpu tensors.

``torch.autocast`` only casts tensors of its own device type: ``is_autocast_eligible`` in
torch/include/ATen/autocast_mode.h accepts CUDA tensors for "cuda" and CPU tensors for "cpu", and
"meta" is no autocast device at all ("unsupported autocast device_type 'meta'").  So a meta model
under autocast runs in fp32, and a cpu model under ``autocast("cpu")`` follows the CPU op lists,
which differ from CUDA's (on CPU ``exp``, ``log``, ``rsqrt``, ``pow`` and ``sum`` are not upcast).

``CudaAutocast`` is a ``TorchFunctionMode`` that applies CUDA's cast policies by op name, with the
lists copied from torch 2.13's ``autocast_mode.h`` (``AT_FORALL_LOWER_PRECISION_FP``,
``AT_FORALL_FP32``, ``AT_FORALL_FP32_SET_OPT_DTYPE``, ``AT_FORALL_PROMOTE``) and the eligibility rule
of ``is_eligible`` (a floating tensor that is not fp64).  Each cast is ``Tensor.to(dtype)``, the
``aten._to_copy`` that autocast's ``cached_cast`` issues, so the ops and saved tensors are the ones a
GPU run records.  A function mode lives above the dispatcher: it installs no Python *dispatch* mode,
so autograd's choice of backward kernels is unchanged.

Not emulated: autocast's weight-cast cache.  ``cached_cast`` caches only leaf, non-view fp32 tensors
that require grad; every weight of our model reaches a matmul as ``weight.t()`` (a view), so the
cache never hits for it and caching would change nothing.
"""

from __future__ import annotations

import functools

import torch
from torch.overrides import TorchFunctionMode

# torch/include/ATen/autocast_mode.h (torch 2.13), the CUDA lists, names only.
LOWER_PRECISION_FP = frozenset(
    "_convolution conv1d conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d conv_transpose3d "
    "convolution prelu addmm addmv addr matmul einsum mm mv linalg_vecdot linear addbmm baddbmm bmm "
    "chain_matmul linalg_multi_dot lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell "
    "_scaled_dot_product_flash_attention scaled_dot_product_attention".split()
)
FP32 = frozenset(
    "acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow softplus "
    "layer_norm native_layer_norm rms_norm group_norm frobenius_norm nuclear_norm cosine_similarity "
    "poisson_nll_loss cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss kl_div l1_loss "
    "smooth_l1_loss huber_loss mse_loss margin_ranking_loss multilabel_margin_loss soft_margin_loss "
    "triplet_margin_loss multi_margin_loss binary_cross_entropy_with_logits dist pdist cdist renorm "
    "logsumexp".split()
)
FP32_SET_OPT_DTYPE = frozenset(
    "prod softmax log_softmax cumprod cumsum linalg_vector_norm linalg_matrix_norm sum".split()
)
PROMOTE = frozenset("addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put tensordot scatter_add".split())
_DUNDER = {"__matmul__": "matmul", "__rmatmul__": "matmul", "__pow__": "pow", "__rpow__": "pow"}


def _eligible(t) -> bool:
    """``is_eligible``: a floating tensor that is not fp64 (the device check is the emulated one)."""
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64


def _cast(value, dtype: torch.dtype):
    """``cached_cast`` without the cache: eligible tensors (also inside lists/tuples) -> dtype."""
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    if _eligible(value) and value.dtype != dtype:
        return value.to(dtype)
    return value


class CudaAutocast(TorchFunctionMode):
    """``with CudaAutocast(torch.bfloat16): model(x)`` runs ``model`` as CUDA autocast would."""

    def __init__(self, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.dtype = dtype

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        name = _DUNDER.get(name, name)
        if name in LOWER_PRECISION_FP:
            args, kwargs = _cast(args, self.dtype), {k: _cast(v, self.dtype) for k, v in kwargs.items()}
        elif name in FP32:
            args, kwargs = _cast(args, torch.float32), {k: _cast(v, torch.float32) for k, v in kwargs.items()}
        elif name in FP32_SET_OPT_DTYPE:
            # fp32_set_opt_dtype: an eligible first argument gets dtype=float32 unless one is given
            if args and _eligible(args[0]) and kwargs.get("dtype") is None:
                kwargs["dtype"] = torch.float32
        elif name in PROMOTE:
            dtypes = [a.dtype for a in args if _eligible(a)]
            if dtypes:  # promote: every eligible argument to the widest floating type among them
                args = _cast(args, functools.reduce(torch.promote_types, dtypes))
        return func(*args, **kwargs)
