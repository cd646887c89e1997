"""The shapes of one run (config, batch, sequence length, dtype), in elements and bytes.

Every per-component formula takes a ``Sizes``: parameter formulas read only ``cfg``, FLOP
formulas add B and S, activation formulas add the element size ``e``.  Notation: T = B·S tokens.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..config import ModelConfig, check_positive_int
from ..names import DTYPE_BYTES
from ..setup import TrainingSetup
from .cuda_kernels import (
    FLASH_RNG_BYTES,
    efficient_delta_bytes,
    efficient_lse_rows,
    flash_backward_scratch,
    index_put_scratch,
    sum_rows_scratch,
)

DEFAULT_SETUP = TrainingSetup()


def check_batch_seq(batch: int, seq: int) -> None:
    check_positive_int("batch", batch)
    check_positive_int("context", seq)


def at_context(cfg: ModelConfig, seq: int | None) -> ModelConfig:
    """The one rule for the sequence length: the model analysed is built for the context it runs at.

    ``seq=None`` keeps ``cfg.context_length``; any other value becomes the config's context length
    (it sizes the live model's RoPE tables, so ``account(cfg, seq=S)`` and
    ``account(cfg.with_context(S))`` are the same question and give the same answer)."""
    if seq is None:
        return cfg
    check_positive_int("context", seq)
    return cfg if seq == cfg.context_length else cfg.with_context(seq)


@dataclass(frozen=True)
class Sizes:
    """Bytes of every tensor shape the live model creates, for one (cfg, B, S, dtype)."""

    cfg: ModelConfig
    batch: int = 1
    seq: int = 1
    e: int = 4  # bytes per element of the model dtype (the parameters' dtype)
    setup: TrainingSetup = DEFAULT_SETUP  # attention kernel, checkpointing, precision
    plain: bool = False  # a run with no dispatch mode on cpu/cuda (``replay._Copy``)
    cpu: bool = False  # a plain run on the CPU: the CPU allocator's own extras count (``wrap``)
    cpu_threads: int = 1  # at::get_num_threads() of that run: the CPU flash kernel's scratch scales with it
    softmax32: bool = False  # bf16 scores under autocast (FSDP2's bf16 parameters): exp and Σ run in fp32
    cuda: bool = False  # on a CUDA GPU: the fused attention is CUDA's flash or memory-efficient kernel
    sp: int = 1  # a sequence-parallel rank of M = sp: the residual stream and the norms hold T/M rows
    # sequence parallel at B > 1: an all-gather along the sequence ends in a cat of its M chunks (torch 2.13's
    # ``_maybe_view_chunk_cat`` takes a view only when the gathered dim 0 is M, i.e. B = 1)
    gather_cat: bool = False
    # a tensor-parallel rank without sequence parallel: each row-parallel output and each column-parallel input's
    # gradient is a partial sum all-reduced out of place (``replay._tp_all_reduce``)
    all_reduce: bool = False
    # on CUDA, the one batch B at which to add the kernels' scratch that is no line in B (``cuda_kernels``);
    # None: left out (the capacity lines, which must hold for every B)
    cuda_batch: int | None = None

    @classmethod
    def of(
        cls, cfg: ModelConfig, seq: int, batch: int = 1, dtype: str = "fp32", setup: TrainingSetup | None = None
    ) -> Sizes:
        """Sizes of one run; with ``setup`` the element size is the setup's parameter dtype."""
        check_batch_seq(batch, seq)
        if setup is not None:
            dtype = setup.param_dtype
        else:
            setup = TrainingSetup(precision="bf16" if DTYPE_BYTES[dtype] == 2 else "fp32")
        return cls(cfg, batch, seq, DTYPE_BYTES[dtype], setup)

    def wrap(self, e: int = 4) -> tuple[int, int]:
        """CPU only: an op with a Python-number operand (``x + eps``, ``x * 2``, ``mean``'s ``/ n``)
        wraps it in a 0-dim float64 CPU tensor (8 bytes, ``scalar_to_tensor``) and TensorIterator
        copies that to the op's dtype (``e`` bytes), both freed when the op returns.  On CUDA both
        live in host memory, so a GPU prediction has (0, 0)."""
        return (8, e) if self.cpu else (0, 0)

    def _flash_splits(self) -> tuple[int, int]:
        """The CPU flash kernels' block sizes (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp,
        ``flash_attention_kernel_impl`` and its backward): q blocks of 256 from S = 768 on, 64 from 192,
        else 32; kv blocks of 512; each at most S."""
        q = 256 if self.seq >= 768 else 64 if self.seq >= 192 else 32
        return min(q, self.seq), min(512, self.seq)

    def flash_scratch_forward(self, e: int) -> tuple[int, int]:
        """CPU only: ``cpu_flash_attention``'s per-thread buffers, made after its outputs and freed
        before it returns: fp32 ``buf`` of n·(qs·ks + 2·qs + qs·d_head) and, for a 16-bit input
        (``e`` = 2), ``buf_reduced`` of n·qs·ks elements (n threads, qs/ks the block sizes).  Exact
        while the kernel does not pack K/V with oneDNN (head_dim a multiple of 64, >= 4 heads and
        S >= 64 on a CPU whose oneDNN packs bf16): packing pads qs·ks and d_head to 64."""
        if not self.cpu:
            return 0, 0
        qs, ks, n = *self._flash_splits(), self.cpu_threads
        return n * (qs * ks + 2 * qs + qs * self.cfg.d_head) * 4, (n * qs * ks * 2 if e == 2 else 0)

    def flash_scratch_backward(self, e: int) -> tuple[int, int, int]:
        """The flash backward's buffers after dQ, dK, dV, freed before it returns.

        1. CPU (``cpu_flash_attention_backward``): fp32 ``buf`` of n·2·qs·ks (attn and grad_attn),
           ``buf_reduced`` of n·2·qs·ks 16-bit elements for a 16-bit input, and the calling thread's
           ``dsum`` of qs fp32 (worker threads' copies are made on threads the profiler does not record).
        2. CUDA flash (attention_backward.cu ``_flash_attention_backward``, flash_api.cpp ``mha_bwd``):
           ``out.contiguous()``, a copy of the kernel's (B, h, S, d_head)-ordered output (T·h·d_head in
           ``e`` bytes) unless merging the heads was a view (``merge_copy`` 0); ``softmax_d`` (B, h, S₁₂₈)
           fp32 and ``dq_accum`` (B, S₁₂₈, h, d₃₂) fp32 (S rounded up to 128, d_head to 32); with grouped
           K/V heads ``dk_expanded`` and ``dv_expanded`` (B, S, h, d_head) in ``e`` bytes, summed into dK,
           dV.  Measured on an H200 (torch 2.11, reports/cuda): where the attention backward sets the
           peak (16 heads of 128 on d_model 256) each of these was an allocator event of that size.
        3. CUDA memory-efficient (fp32): its ``delta``, the fp32 product of d(out) and the output, its sum and
           the contiguous transpose (``cuda_kernels.efficient_delta_bytes``), all alive until the kernel returns
           (measured on an H200: 136,314,880 B at B 2, S 8,192, 16 heads of 128, reports/cuda/memory.csv)."""
        if self.efficient:
            return efficient_delta_bytes(self.batch, self.seq, self.cfg.num_heads, self.cfg.d_head)
        if self.cuda and self.sdpa and not self.efficient:
            c = self.cfg
            q = self.T * c.num_heads * c.d_head * e  # the query, the output, dQ: (B, S, h, d_head)
            softmax_d, dq_accum = flash_backward_scratch(self.batch, self.seq, c.num_heads, c.d_head)
            grouped = 2 * q if c.kv_heads != c.num_heads else 0
            return q * self.merge_copy + softmax_d, dq_accum, grouped
        if not self.cpu:
            return 0, 0, 0
        qs, ks, n = *self._flash_splits(), self.cpu_threads
        return n * 2 * qs * ks * 4, (n * 2 * qs * ks * 2 if e == 2 else 0), qs * 4

    def norm_grad_scratch(self, rows, width: int) -> int:
        """CUDA at ``cuda_batch`` only: the staging buffer of Σ over ``rows`` (a line in B, or an int) of
        the fp32 grad·y, a norm weight's gradient (``cuda_kernels.sum_rows_scratch``)."""
        if not (self.cuda and self.cuda_batch):
            return 0
        return sum_rows_scratch(rows.at(self.cuda_batch) if hasattr(rows, "at") else rows, width)

    def embedding_grad_scratch(self) -> int:
        """CUDA at ``cuda_batch`` only: the embedding backward's id copies and sort storage for its
        B·S ids (``cuda_kernels.index_put_scratch``): the course model's ``weight[ids]``.  Vocab parallel's
        ``F.embedding`` backs through ``embedding_dense_backward``, whose CUDA scratch is not modelled."""
        return index_put_scratch(self.cuda_batch * self.seq) if self.cuda and self.cuda_batch else 0

    def mixed_add_temp(self, width: int) -> int:
        """CPU only: fp32 + bf16 (amp's residual adds): the CPU TensorIterator copies the bf16 operand
        to fp32 (rows·width·4 bytes: T, or T/M on a sequence-parallel rank) for the op; CUDA casts inside
        the kernel."""
        return self.rows * width * 4 if self.cpu else 0

    @property
    def amp(self) -> bool:
        """amp-bf16: fp32 parameters (``e`` = 4), matmuls and what follows them in bf16."""
        return self.setup.precision == "amp-bf16"

    @property
    def bf16(self) -> Sizes:
        """The same run with 2-byte elements: the sizes of autocast's bf16 activations."""
        return dataclasses.replace(self, e=2)

    @property
    def sdpa(self) -> bool:
        return self.setup.attention == "sdpa"

    @property
    def efficient(self) -> bool:
        """CUDA's memory-efficient kernel runs the fused attention: fp32 inputs (flash needs 16-bit)."""
        return self.cuda and self.sdpa and self.e == 4 and not self.amp

    @property
    def merge_copy(self) -> int:
        """1 when merging the heads copies the fused kernel's output, 0 when it is a view.  The CPU flash
        kernel and CUDA's flash (its output is ``empty_like`` the (B, h, S, d)-ordered query) give a
        (B, h, S, d)-ordered output, so the transpose to (B, S, h·d) copies; the memory-efficient kernel
        allocates its output (B, S, h, d)-ordered, so the merge is a view (measured on an H100).  With
        one head (a TP rank's h/M = 1) both orders are the same memory: a view (measured on the fake
        process group: T·d_head·e per layer less without checkpointing)."""
        return 0 if self.efficient or (self.sdpa and self.cfg.num_heads == 1) else 1

    @property
    def lse(self) -> int:
        """The fused kernel's logsumexp, fp32 whatever the model dtype, with what it saves beside:

        1. CPU flash: (B, h, S);
        2. CUDA flash: (B, h, S), plus its ``rng_state`` (2 uint64) and ``unused`` (1 uint64) outputs,
           saved for the backward: 24 bytes per call (flash_api.cpp ``mha_fwd``; measured: +24 B per
           layer at the forward's end on an H100);
        3. CUDA memory-efficient: (B, h, ⌈S/32⌉·32) (``kAlignLSE`` = 32, attention.cu
           ``_efficient_attention_forward``); its seed and offset are empty when dropout is 0."""
        rows = efficient_lse_rows(self.seq) if self.efficient else self.seq
        rng = FLASH_RNG_BYTES if self.cuda and self.sdpa and not self.efficient else 0
        return self.batch * self.cfg.num_heads * rows * 4 + rng

    @property
    def T(self) -> int:
        """Tokens in the batch, B·S."""
        return self.batch * self.seq

    @property
    def rows(self) -> int:
        """Rows of the residual stream and of the norms: T, or T/M on a sequence-parallel rank
        (``Shard(1)``: S/M positions of each sequence)."""
        return self.T if self.sp == 1 else self.T // self.sp

    @property
    def residual(self) -> int:
        """Bytes of one residual-stream tensor, (rows x d_model) in the model dtype."""
        return self.act(self.cfg.d_model, self.rows)

    def act(self, width: int, rows: int | None = None) -> int:
        """A (rows x width) activation in the model dtype; rows default to T."""
        return (self.T if rows is None else rows) * width * self.e

    @property
    def score_count(self) -> int:
        """Elements of one (B, h, S, S) attention tensor."""
        return self.batch * self.cfg.num_heads * self.seq * self.seq

    @property
    def scores(self) -> int:
        """Bytes of one (B, h, S, S) attention tensor."""
        return self.score_count * self.e

    @property
    def score_rows(self) -> int:
        """One (B, h, S, 1) softmax row statistic."""
        return self.batch * self.cfg.num_heads * self.seq * self.e

    @property
    def rope_table(self) -> int:
        """cos or sin rows gathered for the S positions: S x rotary_dim/2 (d_head/2), cast to the model dtype."""
        return self.seq * (self.cfg.rope_dim // 2) * self.e
