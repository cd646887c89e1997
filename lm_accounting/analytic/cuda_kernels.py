"""Scratch that CUDA kernels allocate beside their results, which no CPU or meta run has, as torch 2.11
sizes it on an H100 or H200 (132 multiprocessors of 2,048 threads: ``SMS``, ``THREADS_PER_SM``).

Two kernels the training step meets have scratch that is not a line in the batch B, so the replay adds
them at one batch only (``Sizes.cuda_batch``); both were measured op by op on an H200
(``benchmarks/cuda_validation.py``, section ``kernels``: reports/cuda/kernels.csv, which
tests/test_cuda_kernels.py replays):

1. ``sum_rows_scratch``: a sum over the rows of a contiguous fp32 (rows, width) tensor, as autograd
   makes a norm weight's gradient (Σ over B·S of grad·y).  aten/src/ATen/native/cuda/Reduce.cuh
   ``setReduceConfig``: when each output has many inputs, the rows are split over ``ctas_per_output``
   blocks that meet in a global-memory staging buffer (``global_memory_size``) and a semaphore per
   block column (``semaphore_size``), both freed when the kernel is launched and done.
2. ``index_put_scratch``: the embedding lookup's backward (``weight[ids]``: ``index_put_`` with
   accumulate into zeros), aten/src/ATen/native/cuda/Indexing.cu ``index_put_with_sort_kernel``: the
   token ids made linear (``remainder``, then ``mul``: one int64 copy of T kept), sorted and original
   positions (two more), ``arange`` (a fourth), and cub's radix sort storage.

The fused attention kernels (5-7) save and allocate what the CPU kernel does not (torch 2.11 on an H100 and an
H200, reports/cuda/memory.csv; aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp and
attention.cu, attention_backward.cu):

5. ``FLASH_RNG_BYTES``: flash's ``rng_state`` (2 int64) and ``unused`` (1 int64) outputs, saved for the
   backward (+24 B per layer at the forward's end);
6. ``flash_backward_scratch``: the flash backward's ``softmax_d`` and ``dq_accum`` (and, with grouped K/V
   heads, ``dk_expanded``/``dv_expanded``, which are (B, S, h, d_head) in the model dtype);
7. ``efficient_lse_rows``: the memory-efficient kernel's logsumexp rows, S rounded up to ``kAlignLSE`` = 32;
   its backward's ``delta`` (``efficient_delta_bytes``).
8. ``CUDNN_RNG_BYTES``, ``CUDNN_WORKSPACE_BYTES``, ``cudnn_backward_scratch``: cuDNN attention, which torch
   prefers over flash on sm90 and sm100 GPUs (H100, H200, B200) when nothing pins the backend
   (sdp_utils.cpp ``check_prefer_cudnn_attention``: cuDNN newer than 9.15, as CUDA 13 wheels ship; the variable
   ``TORCH_CUDNN_SDPA_DEPRIORITIZED=1`` turns it off): transformers' sdpa takes it, our model pins flash.

FSDP2's copies (3, 4) depend only on the unit's shapes: aten/src/ATen/native/cuda/TensorShape.cu packs
each kernel's launch metadata into one int64 tensor and copies it to the GPU (``pack_vecs``):

3. ``split_copy_metadata``: the all-gather copy-out (``split_with_sizes_copy`` of the (D, shard) output
   into each parameter), measured in the ZeRO-3 job on an H200 (reports/cuda/parallel.csv: 33,632 B
   at gpt2-small's root unit over 4 ranks, 18,744 B at a block);
4. ``chunk_cat_metadata``: the reduce-scatter copy-in (``_chunk_cat`` of the gradients into the
   reduce-scatter input), from the same file (no measured peak falls on it).
"""

from __future__ import annotations

import math

SMS, THREADS_PER_SM = 132, 2048  # H100 SXM and H200: cudaDeviceProp multiProcessorCount, maxThreadsPerMultiProcessor
MAX_THREADS = 512  # Reduce.cuh ReduceConfig::MAX_NUM_THREADS (4-byte elements)
INT32_MAX = 2**31 - 1


def _last_pow2(n: int) -> int:
    """Reduce.cuh ``last_pow2``: the largest power of two <= n (at least 1)."""
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


def _div_up(a: int, b: int) -> int:
    return -(-a // b)


def sum_rows_scratch(rows: int, width: int, sms: int = SMS, threads_per_sm: int = THREADS_PER_SM) -> int:
    """Bytes of the staging buffer and semaphores of a CUDA sum over ``rows`` of a contiguous fp32
    (rows, width) tensor (0 when it needs none), following ``setReduceConfig`` step by step:

    1. TensorIterator splits the rows in halves while the input's last byte offset, 4·rows·width − 4,
       is past 2³¹ − 2 (``can_use_32bit_indexing``: 1 + Σ (size − 1)·stride <= 2³¹ − 1); the halves
       reduce one after the other, so the larger one's scratch is the peak.  The rows are the dimension
       split (``get_dim_to_split``: the largest (size − 1)·stride, (rows − 1)·4·width >= 4·(width − 1)
       while rows >= 2); a single row past the limit (width > 2²⁹) is split along the width, and a sum
       over one row has nothing to reduce across blocks: 0 (at most log₂ rows halvings, never a loop);
    2. the reduction is not along the fastest dimension, so the outputs are vectorised: ``vec`` = 4, 2
       or 1 outputs per thread as ``width`` divides (``get_output_vec_size``), dim0 = width / vec
       outputs, dim1 = rows inputs;
    3. ``set_block_dimension``: with n = 512 / vec threads at most, p0 and p1 the powers of two below
       dim0 and dim1 (n when that is larger), block width w = min(p0, 32), height h = min(p1, n / w),
       then w = min(p0, n / h); each block covers w output columns;
    4. h warps split the rows when a thread would sum at least 16·h or 256 values, else more outputs;
    5. a global reduction when a thread still sums 256 values or more and the grid of
       g = ceil(dim0 / w) blocks is at most the target T = SMs · (threads per SM / (w·h)):
       ctas = max(min(ceil(T / g), ceil(v / 16)), ceil(v / 256)) with v = ceil(rows / h);
    6. buffer = 4 · width · ctas · w · vec bytes (``global_memory_size``) and 4 · g (``semaphore_size``)."""
    while rows > 1 and 1 + (rows * width - 1) * 4 > INT32_MAX:  # 1. 32-bit indexing: halves along the rows
        rows = _div_up(rows, 2)
    if rows == 1:  # one row (or a row alone past 2³¹ bytes, then split along the width): nothing to reduce
        return 0
    vec = 4 if width % 4 == 0 else 2 if width % 2 == 0 else 1  # 2.
    most = MAX_THREADS // vec
    dim0 = width // vec
    p0 = _last_pow2(dim0) if dim0 < most else most  # 3.
    p1 = _last_pow2(rows) if rows < most else most
    w = min(p0, 32)
    h = min(p1, most // w)
    w = min(p0, most // h)
    split = rows >= 16 * h or rows >= 256  # 4.
    per_thread = _div_up(rows, h) if split else rows
    grid = _div_up(dim0, w if split else w * h)
    target = sms * (threads_per_sm // (w * h))
    if not (split and per_thread >= 256 and grid <= target):  # 5.
        return 0
    ctas = max(min(_div_up(target, grid), _div_up(per_thread, 16)), _div_up(per_thread, 256))
    if ctas <= 1:
        return 0
    return 4 * width * ctas * w * vec + 4 * grid  # 6.


SINGLE_TILE_TOKENS = 2048
"""At most this many ids, cub sorts them in one tile with no storage of its own (it is asked for one
byte): measured at 512 and 2,048 ids; 4,096 took the multi-tile path."""


def index_put_scratch(tokens: int) -> int:
    """Bytes ``index_put_`` with accumulate (the embedding's backward) allocates beside the gradient for
    ``tokens`` int64 ids: four int64 copies of the ids (linear index, sorted, original positions,
    ``arange``) and cub's radix sort storage, one byte up to ``SINGLE_TILE_TOKENS``.  Beyond, cub keeps
    alternate key and value buffers (2 · 8 · T) and 255 bytes of alignment slack, which this counts, and
    per-tile tables, which it does not: measured 5,376 B at 4,096 ids (2.7% of the scratch) to 62,720 B
    at 262,144 (0.5%; reports/cuda/kernels.csv), so above 2,048 ids the figure is that much low."""
    ids = 4 * 8 * tokens
    return ids + (1 if tokens <= SINGLE_TILE_TOKENS else 2 * 8 * tokens + 255)


BLOCK_SIZE, BYTES_PER_THREAD = 128, 16  # TensorShape.cu detail::BLOCK_SIZE, detail::BYTES_PER_THREAD
BYTES_PER_BLOCK = BLOCK_SIZE * BYTES_PER_THREAD


def split_copy_metadata(
    shard_bytes: list[int], ranks: int, sms: int = SMS, threads_per_sm: int = THREADS_PER_SM
) -> int:
    """Bytes of ``split_with_sizes_copy``'s launch metadata for a unit whose parameters' padded shards
    are ``shard_bytes`` over ``ranks`` ranks (``split_with_sizes_copy_out_cuda_contiguous_no_cast``):

    1. first = Σ ceil(shard / (128·16)) blocks for one rank's chunk; at most 2 · SMs · threads / 128
       blocks are launched, so each thread copies ``iters`` times more: factor = ceil(first · D / that),
       k = min(ceil(√factor), D) ranks' chunks per block, iters = ceil(factor / k);
    2. blocks = Σ ceil(shard / (128·16·iters));
    3. packed: the n destination and n source addresses, n chunk sizes, a split index per block and the
       n + 1 block offsets: 8 · (4n + 1 + blocks) bytes."""
    n = len(shard_bytes)
    first = sum(_div_up(b, BYTES_PER_BLOCK) for b in shard_bytes)
    factor = _div_up(first * ranks, sms * threads_per_sm // BLOCK_SIZE * 2)  # 1.
    per_block = min(math.isqrt(factor - 1) + 1, ranks)  # ceil(sqrt(factor)) for factor >= 1
    iters = _div_up(factor, per_block)
    blocks = sum(_div_up(b, BYTES_PER_BLOCK * iters) for b in shard_bytes)  # 2.
    return 8 * (4 * n + 1 + blocks)  # 3.


def chunk_cat_metadata(chunk_bytes: list[int]) -> int:
    """Bytes of ``_chunk_cat``'s launch metadata (``_chunk_cat_out_cuda_contiguous``) for tensors whose
    padded per-rank chunks are ``chunk_bytes`` in the output dtype: n source addresses, a tensor index per
    block of 128·16 bytes, n + 1 start offsets, n + 1 start blocks, and n actual sizes, padded sizes and
    block counts: 8 · (5n + 2 + Σ ceil(chunk / 2048)) bytes."""
    n = len(chunk_bytes)
    return 8 * (5 * n + 2 + sum(_div_up(b, BYTES_PER_BLOCK) for b in chunk_bytes))


FLASH_RNG_STATE_BYTES, FLASH_UNUSED_BYTES = 16, 8
"""flash_api.cpp ``mha_fwd``: the ``rng_state`` (2 int64) and ``unused`` (1 int64) outputs, saved for the backward
(measured: +24 B per layer at the forward's end on an H100)."""
FLASH_RNG_BYTES = FLASH_RNG_STATE_BYTES + FLASH_UNUSED_BYTES


CUDNN_RNG_BYTES = 16
"""cuDNN attention's ``philox_seed`` and ``philox_offset`` outputs (attention.cu ``_cudnn_attention_forward``: two
0-d int64 tensors on the GPU, dropout or not), saved for the backward: the forward's end less the output and the
logsumexp, 16 B at each of 16 shapes on an H100 (reports/cuda-h100/traces/probe.txt)."""
CUDNN_WORKSPACE_BYTES = 256
"""The workspace cuDNN's forward and backward each allocate from the caching allocator and free before returning:
256 B at every shape measured on an H100 (S 1,024 to 8,192, d_head 64 and 128, 32 and 8 K/V heads; probe.txt)."""


def cudnn_backward_scratch(batch, seq: int, heads: int, d_head: int, itemsize: int, grouped: bool) -> tuple:
    """Bytes the cuDNN attention backward holds beside dQ, dK, dV and frees before it returns, as measured on an H100
    at 16 shapes (probe.txt: backward peak − the three gradients): an fp32 (B, h, S) row term, an fp32 (B, S, h, d)
    one (what flash calls ``softmax_d`` and ``dq_accum``, without flash's rounding of S and d), and with grouped K/V
    heads two (B, S, h, d) ones in the input dtype (dK and dV over every query head), then the workspace.  The names
    are flash's; the bytes are cuDNN's, equal at every measured shape."""
    rows = batch * (seq * heads)
    expanded = [rows * (d_head * itemsize)] * 2 if grouped else []
    return (rows * 4, rows * (d_head * 4), *expanded, CUDNN_WORKSPACE_BYTES)


def _round_up(x, m: int):
    return -(-x // m) * m


def efficient_lse_rows(seq: int) -> int:
    """Rows per head of the memory-efficient kernel's logsumexp (B, h, ⌈S/32⌉·32) fp32 (``kAlignLSE`` = 32,
    attention.cu ``_efficient_attention_forward``); flash's is (B, h, S)."""
    return _round_up(seq, 32)


def flash_backward_scratch(batch, seq: int, heads: int, d_head: int) -> tuple:
    """Bytes of the flash backward's fp32 ``softmax_d`` (B, h, S₁₂₈) and ``dq_accum`` (B, S₁₂₈, h, d₃₂)
    (flash_api.cpp ``mha_bwd``: S rounded up to 128, d_head to 32), made beside dQ, dK, dV and freed before
    the backward returns; measured on an H200 where the attention backward sets the peak (reports/cuda).
    ``batch`` may be a line in B (``Affine``)."""
    rows = batch * (_round_up(seq, 128) * heads)
    return rows * 4, rows * (_round_up(d_head, 32) * 4)


def efficient_delta_bytes(batch: int, seq: int, heads: int, d_v: int) -> tuple[int, int, int]:
    """The memory-efficient backward's ``delta`` for fp32 inputs (attention_backward.cu
    ``_efficient_attention_backward``: ``kKernelComputesDelta`` is false for the fp32 kernels, so
    ``(grad_out.to(float) * out.to(float)).sum(-1).transpose(-2, -1).contiguous()``): the product (B, S, h, d_v),
    its sum (B, S, h) and the contiguous (B, h, S), all fp32, alive together until the expression ends, the last
    until the kernel returns.  Measured on an H200: qwen3-0.6b (2 layers, d_model 256, 16 heads of 128, no
    grouping) at S 8,192, B 2 in fp32 peaked 136,314,880 B = (2·8,192·16·128 + 2·2·8,192·16)·4 above a
    prediction without it (reports/cuda/memory.csv)."""
    rows = batch * seq * heads
    return rows * d_v * 4, rows * 4, rows * 4
