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


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# torch/include/ATen/autocast_mode.h (torch 2.13), the CUDA lists, names only.
LOWER_PRECISION_FP = _names(  # AT_FORALL_LOWER_PRECISION_FP: cast to bf16
    "_convolution conv1d conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d conv_transpose3d "
    "convolution prelu addmm addmv addr matmul einsum mm mv linalg_vecdot linear addbmm baddbmm bmm "
    "chain_matmul linalg_multi_dot lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell "
    "_scaled_dot_product_flash_attention scaled_dot_product_attention"
)
FP32 = _names(  # AT_FORALL_FP32: cast to fp32
    "acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow softplus "
    "layer_norm native_layer_norm rms_norm group_norm frobenius_norm nuclear_norm cosine_similarity "
    "poisson_nll_loss cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss kl_div l1_loss "
    "smooth_l1_loss huber_loss mse_loss margin_ranking_loss multilabel_margin_loss soft_margin_loss "
    "triplet_margin_loss multi_margin_loss binary_cross_entropy_with_logits dist pdist cdist renorm "
    "logsumexp"
)
FP32_SET_OPT_DTYPE = _names(  # AT_FORALL_FP32_SET_OPT_DTYPE: dtype=float32 unless given
    "prod softmax log_softmax cumprod cumsum linalg_vector_norm linalg_matrix_norm sum"
)
PROMOTE = _names(  # AT_FORALL_PROMOTE: to the widest input type
    "addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put tensordot scatter_add"
)
CPU_STAND_INS = _names(  # the CPU kernel ``FusedAttention`` calls where CUDA calls scaled_dot_product_attention
    "_scaled_dot_product_flash_attention_for_cpu"
)
"""Cast to bf16 like the CUDA op they stand in for: with fp32 q, k, v (Qwen2's q/k/v biases add in
fp32) a CUDA run's fused attention gets bf16 copies, so the emulation gives the CPU kernel the same."""
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


def _cast_args(args: tuple, dtype: torch.dtype) -> tuple:
    """The positional arguments cast *last first*: autocast's wrapper casts them inside one C++
    call's argument list, which GCC (torch's Linux wheels) evaluates right to left; the order fixes
    which copy is allocated first (checked against ``torch.autocast("cpu")`` in the tests)."""
    return tuple(reversed([_cast(a, dtype) for a in reversed(args)]))


class CudaAutocast(TorchFunctionMode):
    """``with CudaAutocast(torch.bfloat16): model(x)`` runs ``model`` as CUDA autocast would.

    The op lists can be replaced (the tests check the mechanism against ``torch.autocast("cpu")``
    with the CPU lists)."""

    def __init__(
        self,
        dtype: torch.dtype = torch.bfloat16,
        *,
        lower=LOWER_PRECISION_FP | CPU_STAND_INS,
        fp32=FP32,
        fp32_set_opt_dtype=FP32_SET_OPT_DTYPE,
        promote=PROMOTE,
    ):
        super().__init__()
        self.dtype = dtype
        self.lower, self.fp32, self.fp32_set_opt_dtype, self.promote = lower, fp32, fp32_set_opt_dtype, promote

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        name = _DUNDER.get(name, name)
        if name in self.lower:
            args, kwargs = _cast_args(args, self.dtype), {k: _cast(v, self.dtype) for k, v in kwargs.items()}
        elif name in self.fp32:
            args, kwargs = _cast_args(args, torch.float32), {k: _cast(v, torch.float32) for k, v in kwargs.items()}
        elif name in self.fp32_set_opt_dtype:
            # fp32_set_opt_dtype: an eligible first argument gets dtype=float32 unless one is given
            if args and _eligible(args[0]) and kwargs.get("dtype") is None:
                kwargs["dtype"] = torch.float32
        elif name in self.promote:
            dtypes = [a.dtype for a in args if _eligible(a)]
            if dtypes:  # promote: every eligible argument to the widest floating type among them
                args = _cast_args(args, functools.reduce(torch.promote_types, dtypes))
        return func(*args, **kwargs)
