"""The CUDA target: what a plain run on an NVIDIA GPU allocates that a meta or CPU run does not, written once.

A plain CUDA run is the plain run's program (in-place gradient sums, no wrapped Python numbers: those live in host
memory) with these kernel facts, each from ``analytic.cuda_kernels`` (the one registry of CUDA kernel facts, which
the legacy replay reads too), measured on an H200 (reports/cuda) for our model:

* ``Cuda.sum_rows``: a sum over the leading dims of a contiguous fp32 tensor (``validate_outputs``' ``sum_to``: a
  norm weight's or a bias's gradient) stages partial sums in global memory (``cuda_kernels.sum_rows_scratch``);
* ``Cuda.index_put``: ``index_put_`` with accumulate (the backward of ``weight[ids]``) copies and sorts the ids
  (``cuda_kernels.index_put_scratch``);
* ``scaled_dot_product_attention``: ``F.scaled_dot_product_attention`` with ``is_causal`` and no mask, restricted
  to the fused kernels: flash for 16-bit inputs (grouped K/V heads natively, ``enable_gqa``), memory-efficient for
  fp32 (heads equal).  Flash saves ``rng_state`` and ``unused`` beside its logsumexp and its backward makes
  ``softmax_d`` and ``dq_accum`` (and dK, dV expanded to every query head when grouped); the memory-efficient
  kernel lays its output out (B, S, h, d), pads its logsumexp to 32 rows, and its backward computes ``delta``
  from fp32 products (``cuda_kernels.efficient_delta_bytes``).

transformers' sdpa pins no backend: ``cudnn_attention`` for 16-bit inputs on sm90 (with a sliding window's mask as
its bias: ``masked_attention``; GPT-2's dropout inside the kernel), the memory-efficient kernel for fp32 (a mask as
its bias), and the math path (``aten_sdpa_math``, with ``Cuda.safe_softmax``) for fp32 with grouped K/V heads; all
measured on an H100 (reports/cuda-h100/hf_memory.csv).  Our model pins flash and the memory-efficient kernel.

Not modelled (``unsupported``): the flash path's padding of a head dim that is no multiple of 8
(``pad_last_dim<8>``), our model's fp32 with grouped K/V heads (it refuses it); flash's split-KV accumulators
(``set_params_splitkv``, upstream flash-attention: fp32 ``out_accum``/``softmax_lse_accum`` when B·h·⌈S/64⌉ is
below 0.8 · 2 · SMs; no H200 point was that small); the memory-efficient backward's cutlass workspace (none at
the H200's points).  Not in any figure, as in the measurements (``measure.tracker.measure_training_step_cuda``):
the cuBLAS workspaces and the caching allocator's rounding to 512-byte blocks (requested bytes are predicted,
``memory_allocated`` rounds each block up).

Sizes that are no line in the micro-batch B (the row sums' staging, the id sort) are evaluated at one batch
(``Cuda.batch``), so a step replayed with B a symbol is exact at that batch only; with ``batch`` None they are left
out (lines without them).  No torch.
"""

from __future__ import annotations

from ...config import ModelConfig
from ...setup import TrainingSetup
from ..cuda_kernels import (
    CUDNN_RNG_BYTES,
    CUDNN_WORKSPACE_BYTES,
    FLASH_RNG_STATE_BYTES,
    FLASH_UNUSED_BYTES,
    cudnn_backward_scratch,
    efficient_delta_bytes,
    efficient_lse_rows,
    flash_backward_scratch,
    index_put_scratch,
    sum_rows_scratch,
)
from . import aten as A
from .engine import Affine
from .tensors import ITEMSIZE, Dim, Storage, Target, Tensor, current, empty, numel, record

BSHD = (0, 2, 1, 3)  # (B, h, S, d) laid out as (B, S, h, d)


class Cuda(Target):
    """A plain run on a CUDA GPU (``tensors.Run.target``); ``batch``: where sizes that are no line in B are taken."""

    device = "cuda"

    def __init__(self, batch: int | None = None):
        self.batch = batch

    def at(self, n: Dim) -> int | None:
        """``n`` at ``batch`` (None: B is a symbol and no batch was given)."""
        if not isinstance(n, Affine):
            return n
        return None if self.batch is None else n.at(self.batch)

    def sum_rows(self, grad: Tensor, kept: tuple) -> None:
        """``Reduce.cuh``'s global staging for a sum of a contiguous fp32 ``grad`` over its leading dims down to
        ``kept`` (keepdim), made after the result and freed when the kernel returns."""
        reduced = [i for i, d in enumerate(grad.shape) if kept[i] == 1 and d != 1]
        whole = [i for i, d in enumerate(kept) if d != 1]
        if grad.dtype != "fp32" or not reduced or not grad.is_contiguous() or (whole and max(reduced) > min(whole)):
            return
        rows, width = self.at(numel([grad.shape[i] for i in reduced])), self.at(numel([kept[i] for i in whole]))
        if rows is not None and width is not None:
            transient(sum_rows_scratch(rows, width), "reduce_staging")

    def index_put(self, ids: Tensor) -> None:
        """``index_put_with_sort_kernel``'s id copies and sort storage, after the zeros it accumulates into."""
        tokens = self.at(ids.numel)
        if tokens is not None:
            transient(index_put_scratch(tokens), "index_put_sort")

    def softmax_backward(self, grad: Tensor) -> None:
        """``softmax_backward_cuda_out`` (SoftMax.cu) computes ``Tensor tmp = grad * output`` after its (structured)
        result is allocated, and frees it when it returns: a copy of the incoming gradient's size (seen on the H100,
        reports/cuda-h100/traces: ``aten::mul < aten::_softmax_backward_data``).  ``_log_softmax_backward_data``
        has no such product."""
        tmp = Storage(grad.nbytes, "softmax_backward_tmp")
        del tmp

    def safe_softmax(self, x: Tensor) -> None:
        """``_safe_softmax`` on CUDA: beside the softmax, a 0-d -inf of the result's dtype, ``x.eq(-inf)`` (bool, x's
        shape) and its ``all`` over the last dim (bool, keepdim), live until it returns; measured on an H100 as the
        forward peak of transformers' fp32 Llama with grouped heads under full checkpointing: +2^29 + 2^17 + 4 B at
        S 4,096 with 32 heads (reports/cuda-h100/hf_memory.csv) before this was modelled."""
        parts = [
            Storage(ITEMSIZE[x.dtype], "safe_softmax_neg_inf"),
            Storage(x.numel, "safe_softmax_masked"),
            Storage(numel(x.shape[:-1]), "safe_softmax_masked_rows"),
        ]
        del parts


def transient(nbytes: int, label: str) -> None:
    """Bytes a kernel allocates and frees before it returns."""
    if nbytes:
        s = Storage(nbytes, label)
        del s


def on_cuda() -> bool:
    return current().target.device == "cuda"


def unsupported(cfg: ModelConfig, setup: TrainingSetup, grouped_fp32: bool = True) -> list[str]:
    """What a plain CUDA run of ``cfg`` under ``setup`` does that this module does not model (empty: none).
    ``grouped_fp32``: whether the program hands the fused kernel fp32 inputs with grouped K/V heads (our model
    does, and refuses it on a GPU; transformers repeats K and V there, unless it passes ``enable_gqa``)."""
    if setup.attention != "sdpa":
        return []
    out = []
    if cfg.d_head % 8:
        out.append(
            f"fused attention on cuda with head_dim {cfg.d_head} (flash pads it to a multiple of 8: not modelled)"
        )
    fp32 = setup.precision == "fp32"
    if grouped_fp32 and fp32 and cfg.kv_heads != cfg.num_heads:
        out.append(
            "fused attention in fp32 with grouped KV heads has no CUDA kernel in torch (flash needs bf16/fp16, the "
            "memory-efficient kernel takes no GQA: the math path, not modelled on cuda)"
        )
    return out


def transformers_unsupported(cfg: ModelConfig, setup: TrainingSetup, seq: int) -> list[str]:
    """``unsupported`` for transformers' modeling code on a GPU (``integrations/sdpa_attention.py``: without a mask
    it passes ``is_causal`` and ``enable_gqa``, so fp32 with grouped heads takes the math path; with a mask it
    repeats K and V, and the mask is cuDNN's bias (16-bit) or the memory-efficient kernel's (fp32)).  Latent
    attention whose value head differs from the query/key head (DeepSeek) takes the same two kernels, which accept
    it (``ops.transformers.deepseek.sdpa_attention_forward``)."""
    return unsupported(cfg, setup, grouped_fp32=False)


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, pinned: bool = True):
    """The fused kernel ``F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=...)`` takes on CUDA
    (dropout 0, no mask): ``flash_attention`` for 16-bit inputs, ``efficient_attention`` for fp32 ones (heads
    equal).  ``pinned`` False: no ``sdpa_kernel`` restricts the choice (transformers), so on an sm90 GPU torch
    takes ``cudnn_attention`` for 16-bit inputs (``cuda_kernels.CUDNN_RNG_BYTES``' note).  Returns the op (its
    outputs: a tuple whose first is the attention output), for ``course.sac``'s ``saved_op``: it accepts the
    outputs' ``storages``."""
    if q.dtype == "fp32":
        if k.shape[1] != q.shape[1]:
            raise ValueError("fp32 fused attention with grouped K/V heads has no CUDA kernel (see ``unsupported``)")
        return efficient_attention
    return flash_attention if pinned else cudnn_attention


def _outputs(shapes, storages, label: str) -> list[Tensor]:
    """New outputs of (shape, dtype, perm), or views of ``storages`` (selective checkpointing's cache)."""
    out = []
    for i, (shape, dtype, perm) in enumerate(shapes):
        if storages is None:
            t = empty(shape, dtype, label)
            if perm is not None:
                t.perm = perm
        else:
            t = Tensor(shape, dtype, storages[i], perm)
        out.append(t)
    return out


def flash_attention(q: Tensor, k: Tensor, v: Tensor, storages=None) -> tuple[Tensor, ...]:
    """``aten._scaled_dot_product_flash_attention`` on CUDA (attention.cu, flash_api.cpp ``mha_fwd``): the output
    ``empty_like`` the (B, S, h, d)-transposed query (so laid out as the query is), the logsumexp (B, h, S) fp32,
    ``rng_state`` (2 int64) and ``unused`` (1 int64); autograd saves q, k, v, the output, the logsumexp and the
    two rng tensors.  Backward (attention_backward.cu ``_flash_attention_backward``, ``mha_bwd``): the incoming
    gradient and the output made contiguous in (B, S, h, d) (copies where they are not), dq, dk, dv ``empty_like``
    the inputs, ``softmax_d`` and ``dq_accum`` and, with grouped K/V heads, dK and dV expanded to every query
    head, summed into dk, dv; all but dq, dk, dv freed before it returns."""
    b, h, s, d = q.shape
    shape = q.shape[:-1] + v.shape[-1:]
    shapes = [
        (shape, q.dtype, q.perm if shape == q.shape else None),  # empty_like(q)
        ((b, h, s), "fp32", None),
        ((FLASH_RNG_STATE_BYTES // 8,), "int64", None),
        ((FLASH_UNUSED_BYTES // 8,), "int64", None),
    ]
    out, lse, rng, unused = _outputs(shapes, storages, "flash")
    grouped = k.shape[1] != h
    current().note("attention", "flash", "forward", b, h, s, d, q.dtype)

    def back(ctx, g, sq, sk, sv, so, sl, sr, su):
        current().note("attention", "flash", "backward", b, h, s, d, sq.dtype)
        grad_out = A.contiguous(A.transpose(g[0], 1, 2))  # contiguous_grad_out
        out_t = A.contiguous(A.transpose(so, 1, 2))  # contiguous_out
        dq, dk, dv = (empty(t.shape, t.dtype, "flash_backward", like=t) for t in (sq, sk, sv))
        softmax_d, dq_accum = flash_backward_scratch(b, s, h, d)
        kept = Storage(softmax_d, "flash_softmax_d")
        accum = Storage(dq_accum, "flash_dq_accum")
        expanded = [Storage(numel((b, s, h, d)) * ITEMSIZE[sq.dtype], "flash_dkv_expanded") for _ in "kv" if grouped]
        del expanded, accum, kept, out_t, grad_out
        return dq, dk, dv

    record("ScaledDotProductFlashAttentionBackward0", (q, k, v), (out,), back, (q, k, v, out, lse, rng, unused))
    return out, lse, rng, unused


flash_attention.takes_storages = True


def cudnn_attention(q: Tensor, k: Tensor, v: Tensor, storages=None, bias: Tensor | None = None) -> tuple[Tensor, ...]:
    """``aten._scaled_dot_product_cudnn_attention`` on CUDA (attention.cu ``_cudnn_attention_forward``, measured on
    an H100: reports/cuda-h100/traces/probe.txt): the output (B, h, S, d) laid out as the query is, the fp32
    logsumexp (B, h, S, 1), the philox seed and offset (``CUDNN_RNG_BYTES``) and a workspace freed before it
    returns; autograd saves q, k, v, the output, the logsumexp, the seed and the offset (and ``bias``, an additive
    mask, ``masked_attention``).  Backward (``_cudnn_attention_backward``): dq, dk, dv laid out as the inputs are,
    then ``cudnn_backward_scratch``, freed before it returns."""
    b, h, s, d = q.shape
    shape = q.shape[:-1] + v.shape[-1:]
    shapes = [
        (shape, q.dtype, q.perm if shape == q.shape else None),
        ((b, h, s, 1), "fp32", None),
        *[((), "int64", None)] * (CUDNN_RNG_BYTES // ITEMSIZE["int64"]),  # the seed and the offset, 0-d
    ]
    out, lse, seed, offset = _outputs(shapes, storages, "cudnn")
    transient(CUDNN_WORKSPACE_BYTES, "cudnn_workspace")
    grouped = k.shape[1] != h
    current().note("attention", "cudnn", "forward", b, h, s, d, q.dtype)

    def back(ctx, g, sq, sk, sv, so, sl, ss, sf, *mask):
        current().note("attention", "cudnn", "backward", b, h, s, d, sq.dtype)
        grads = tuple(empty(t.shape, t.dtype, "cudnn_backward", like=t) for t in (sq, sk, sv))
        scratch = [
            Storage(n, "cudnn_backward_scratch")
            for n in cudnn_backward_scratch(b, s, h, d, ITEMSIZE[sq.dtype], grouped)
        ]
        del scratch
        return grads

    saved = (q, k, v, out, lse, seed, offset) + ((bias,) if bias is not None else ())
    record("ScaledDotProductCudnnAttentionBackward0", (q, k, v), (out,), back, saved)
    return out, lse, seed, offset


def masked_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """``F.scaled_dot_product_attention(q, k, v, attn_mask=mask)`` with a bool mask and 16-bit inputs, no backend
    pinned (transformers with a sliding window; K and V already repeated): the mask first becomes an additive one of
    q's dtype (``convert_boolean_attn_mask``: two 0-d scalars and ``where``, as on the CPU), which cuDNN attention
    takes as its bias and saves (the H100 ran cuDNN here: reports/cuda-h100/traces/trace_mistral_sdpa.txt)."""
    zero, low = empty((), q.dtype, "scalar_tensor"), empty((), q.dtype, "scalar_tensor")
    bias = empty(mask.shape, q.dtype, "where")
    del zero, low
    kernel = efficient_attention if q.dtype == "fp32" else cudnn_attention  # cuDNN takes 16-bit inputs only
    return kernel(q, k, v, bias=bias)[0]


cudnn_attention.takes_storages = True


def efficient_attention(
    q: Tensor, k: Tensor, v: Tensor, storages=None, bias: Tensor | None = None
) -> tuple[Tensor, ...]:
    """``aten._scaled_dot_product_efficient_attention`` on CUDA (attention.cu ``_efficient_attention_forward``,
    dropout 0, no bias, ``compute_log_sumexp``): the output (B, h, S, d) laid out (B, S, h, d), the logsumexp
    (B, h, ⌈S/32⌉·32) fp32 (its seed and offset are CPU tensors); autograd saves q, k, v, the output and the
    logsumexp.  Backward (attention_backward.cu ``_efficient_attention_backward``): dq, dk, dv (B, S, h, d)-laid
    out, then ``delta`` from the fp32 product of the incoming gradient and the output (its sum and the contiguous
    transpose), freed before it returns."""
    b, h, s, _ = q.shape
    d_v = v.shape[-1]  # the backward keeps no reference to v itself
    shapes = [(q.shape[:-1] + (d_v,), q.dtype, BSHD), ((b, h, efficient_lse_rows(s)), "fp32", None)]
    out, lse = _outputs(shapes, storages, "efficient")
    current().note("attention", "efficient", "forward", b, h, s, d_v, q.dtype)

    def back(ctx, g, sq, sk, sv, so, sl, *mask):
        current().note("attention", "efficient", "backward", b, h, s, d_v, sq.dtype)
        grads = []
        for t in (sq, sk, sv):
            grad = empty(t.shape, t.dtype, "efficient_backward")
            grad.perm = BSHD
            grads.append(grad)
        product, total, delta = efficient_delta_bytes(b, s, h, d_v)
        parts = [Storage(product, "delta_product"), Storage(total, "delta_sum"), Storage(delta, "delta")]
        del parts
        return tuple(grads)

    saved = (q, k, v, out, lse) + ((bias,) if bias is not None else ())
    record("ScaledDotProductEfficientAttentionBackward0", (q, k, v), (out,), back, saved)
    return out, lse


efficient_attention.takes_storages = True
