"""torch 2.13's ring attention, one CP rank's allocations, on symbolic tensors: the CP hook of the fused attention
(``aten_flash.flash_attention_for_cpu`` calls ``active()``; ``analytic.context_parallel`` installs a ``Ring``).

A line-by-line transliteration of ``torch/distributed/tensor/experimental/_context_parallel/_attention.py``
(``_templated_ring_attention``, ``_templated_ring_attention_backward``, ``_SDPAMerger``, ``_partial_update``,
``_AllGatherRotater``, ``_AllToAllRotater``), with torch's defaults (``_cp_options``: ``convert_to_f32``, load
balancing on) and the CPU flash kernel as ``op``: the same local variables hold the same tensors for as long, so
each storage dies where torch's does (CPython refcounting, as ``tensors`` relies on).  Views (``chunk``, ``slice``,
``reshape`` of a contiguous buffer, ``unsqueeze``) cost nothing; ``contiguous`` and ``to`` copy only when they must;
in-place adds (``+=``) allocate nothing.  Shapes (B, h, s, d) of the rank's s positions, two chunks of s/2
(load-balanced: the rank holds chunks c and 2·cp − 1 − c).  No torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache

from .aten import flash_scratch_backward, flash_scratch_forward
from .engine import Affine
from .tensors import Tensor, empty, numel

BSHD = (0, 2, 1, 3)  # the CPU kernel's gradients: (B, S, heads, d) memory viewed as (B, heads, S, d)
SEQ = 2  # ``seq_dim``: q, k, v are (B, heads, S, d)


@dataclass(frozen=True)
class Ring:
    """One CP rank's ring: ``size`` ranks, this one ``rank``, K and V rotated by ``rotate`` ("allgather": torch's
    default, or "alltoall")."""

    size: int
    rank: int
    rotate: str = "allgather"


_ACTIVE: list[Ring | None] = [None]


@contextmanager
def installed(ring: Ring | None) -> Iterator[None]:
    """Run the fused attention of the programs replayed inside as ``ring``'s (None: the kernel alone)."""
    _ACTIVE.append(ring)
    try:
        yield
    finally:
        _ACTIVE.pop()


def active() -> Ring | None:
    return _ACTIVE[-1]


# -- the ops the ring calls ----------------------------------------------------------------------


def chunk(t: Tensor, idx: int, dim: int = SEQ) -> Tensor:
    """``t.chunk(2, dim)[idx]``: a view, ``t``'s layout."""
    shape = list(t.shape)
    shape[dim] = shape[dim] // 2
    return t.alias(shape, t.perm)


def chunk_is_contiguous(t: Tensor, dim: int) -> bool:
    """Whether a chunk of contiguous ``t`` along ``dim`` is contiguous: every dim outside it has size 1."""
    outer = t.perm[: t.perm.index(dim)]
    return t.is_contiguous() and all(t.shape[d] == 1 for d in outer)


def contiguous(t: Tensor, label: str = "contiguous") -> Tensor:
    return t if t.is_contiguous() else empty(t.shape, t.dtype, label)


def to(t: Tensor, dtype: str) -> Tensor:
    """``t.to(dtype)``: itself, or a copy in ``t``'s layout (``_to_copy``, preserve format)."""
    return t if t.dtype == dtype else empty(t.shape, dtype, "_to_copy", like=t)


def pointwise(like: Tensor, label: str) -> Tensor:
    """An fp32 result of ``like``'s shape and layout (``sub``, ``sigmoid``, ``mul``, ``log_sigmoid``)."""
    return empty(like.shape, "fp32", label, like=like)


def cat(*parts: Tensor, shape=None, label: str = "cat") -> Tensor:
    """``torch.cat``: a new contiguous tensor (flat, or ``shape``)."""
    return empty(shape or (sum(numel(p.shape) for p in parts),), parts[0].dtype, label)


def add_(acc: Tensor, new: Tensor) -> None:
    """``acc += new``: in place, no bytes."""


def partial_update(original: Tensor, new: Tensor, idx: int) -> Tensor:
    """``_partial_update(original, new, dim=seq_dim, n_chunks=2, idx, add)``: chunk ``idx`` replaced by ``new`` or
    added to in place, then the chunks' ``cat``: a new tensor of ``original``'s shape."""
    return cat(original, new, shape=original.shape)


def view(buffer: Tensor, like: Tensor) -> Tensor:
    """``buffer[pointer : pointer + like.numel()].reshape(like.shape)`` (K's part, then V's): a view."""
    return buffer.alias(like.shape)


def kernel_forward(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """``_scaled_dot_product_flash_attention_for_cpu``: the output in q's layout, the logsumexp (B, h, S) fp32."""
    b, h, s, _ = q.shape
    out, lse = empty(q.shape[:-1] + v.shape[-1:], q.dtype, "flash", like=q), empty((b, h, s), "fp32", "flash_lse")
    flash_scratch_forward(s, q.shape[-1], q.dtype)
    return out, lse


def kernel_backward(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, ...]:
    """``..._for_cpu_backward``: dq, dk, dv of the given q, k, v, laid out (B, S, heads, d)."""
    grads = []
    for t in (q, k, v):
        grad = empty(t.shape, t.dtype, "flash_backward")
        grad.perm = BSHD
        grads.append(grad)
    flash_scratch_backward(q.shape[2], q.dtype)
    return tuple(grads)


class AllGatherRotater:
    """``_AllGatherRotater``: K and V all-gathered once (cp·KV), each step's chunk a view."""

    def __init__(self, ring: Ring):
        self.ring, self.buffer, self.idx = ring, None, 0

    def exchange_buffers(self, curr: Tensor) -> None:
        self.idx += 1
        if self.buffer is None:
            self.buffer = empty((self.ring.size * curr.shape[0],), curr.dtype, "all_gather_into_tensor")

    def next_buffer(self) -> Tensor:
        return self.buffer.alias((self.buffer.shape[0] // self.ring.size,))


class AllToAllRotater:
    """``_AllToAllRotater``: the buffer sent to the next rank (``permute_tensor``: an ``all_to_all_single``)."""

    def __init__(self, ring: Ring):
        self.buffer = None

    def exchange_buffers(self, curr: Tensor) -> None:
        self.buffer = empty(curr.shape, curr.dtype, "all_to_all_single")

    def next_buffer(self) -> Tensor:
        return self.buffer


def rotater(ring: Ring, method: str | None = None):
    return AllToAllRotater(ring) if (method or ring.rotate) == "alltoall" else AllGatherRotater(ring)


class Merger:
    """``_SDPAMerger`` (convert_to_f32): the fp32 output and logsumexp merged step by step."""

    def __init__(self):
        self.out: Tensor | None = None
        self.lse: Tensor | None = None
        self.out_dtype = "fp32"

    def merge_one(self, block_out: Tensor, block_lse: Tensor, partial: bool) -> None:
        if self.lse is None:
            self.lse, self.out = block_lse, block_out
            return
        lse = chunk(self.lse, 1) if partial else self.lse
        out = chunk(self.out, 1) if partial else self.out
        # out = out - F.sigmoid(block_lse - lse) * (out - block_out), in Python's order
        diff = pointwise(block_lse, "sub")
        gate = pointwise(diff, "sigmoid")
        del diff
        delta = pointwise(out, "sub")
        scaled = pointwise(out, "mul")
        del gate, delta
        out = pointwise(out, "sub")
        del scaled
        # lse = lse - F.logsigmoid(lse - block_lse)
        diff = pointwise(block_lse, "sub")
        logs = pointwise(diff, "log_sigmoid")
        del diff
        lse = pointwise(block_lse, "sub")
        del logs
        if partial:
            self.lse = partial_update(self.lse, lse, 1)
            self.out = partial_update(self.out, out, 1)
        else:
            self.lse, self.out = lse, out

    def step(self, out: Tensor, lse: Tensor, partial: bool) -> None:
        self.out_dtype = out.dtype
        out = to(out, "fp32")
        self.merge_one(out, lse, partial)

    def results(self) -> tuple[Tensor, Tensor]:
        return to(self.out, self.out_dtype), self.lse


def ring_forward(ring: Ring, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
    """``_templated_ring_attention`` (is_causal, load-balanced): the merged output and logsumexp."""
    rank, size = ring.rank, ring.size
    next_kv = None
    key = contiguous(key)
    value = contiguous(value)
    merger = Merger()
    rot = rotater(ring)
    out = logsumexp = None
    for i in range(size):
        if i > 0:
            next_kv = rot.next_buffer()
            key = view(next_kv, key)
            value = view(next_kv, value)
        if i < size - 1:
            next_kv = cat(key, value)
            next_kv = rot.exchange_buffers(next_kv)
        if i == 0:
            q, k, v, partial = query, key, value, False
        elif i <= rank:
            q, k, v, partial = query, chunk(key, 0), chunk(value, 0), False
        else:
            q, k, v, partial = chunk(query, 1), key, value, True
        out, logsumexp = kernel_forward(q, k, v)
        merger.step(out, logsumexp, partial)
    return merger.results()


def ring_backward(
    ring: Ring, grad_out: Tensor, query: Tensor, key: Tensor, value: Tensor, out: Tensor, logsumexp: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """``_templated_ring_attention_backward``: dq in q's dtype, dk and dv views of one buffer in k's."""
    rank, size = ring.rank, ring.size
    next_kv = None
    next_grad_kv = None
    grad_query_ = grad_key_ = grad_value_ = None
    grad_query = empty(query.shape, "fp32", "zeros_like", like=query)
    grad_key = empty(key.shape, "fp32", "zeros_like", like=key)
    grad_value = empty(value.shape, "fp32", "zeros_like", like=value)
    key = contiguous(key)
    value = contiguous(value)
    kv_rotater = rotater(ring)
    dkv_rotater = rotater(ring, "alltoall")
    for i in range(size):
        if i > 0:
            buffer = kv_rotater.next_buffer()
            key = view(buffer, key)
            value = view(buffer, value)
        if i != size - 1:
            next_kv = cat(key, value)
            kv_rotater.exchange_buffers(next_kv)
        if i == 0:
            q, k, v, lse = query, key, value, logsumexp
        elif i <= rank:
            q, k, v, lse = query, chunk(key, 0), chunk(value, 0), logsumexp
        else:  # logsumexp.chunk(2, dim=seq_dim)[1].contiguous(), alive until the next step's
            lse = chunk(logsumexp, 1)
            lse = lse if chunk_is_contiguous(logsumexp, SEQ) else empty(lse.shape, "fp32", "contiguous")
            q, k, v = chunk(query, 1), key, value
        grad_query_, grad_key_, grad_value_ = kernel_backward(q, k, v)
        if i == 0:
            add_(grad_key, grad_key_)
            add_(grad_value, grad_value_)
        else:
            next_grad_kv = dkv_rotater.next_buffer()
            grad_key = view(next_grad_kv, grad_key)
            grad_value = view(next_grad_kv, grad_value)
            if i <= rank:
                grad_key = partial_update(grad_key, grad_key_, 0)
                grad_value = partial_update(grad_value, grad_value_, 0)
            else:
                add_(grad_key, grad_key_)
                add_(grad_value, grad_value_)
        next_grad_kv = cat(grad_key, grad_value)
        dkv_rotater.exchange_buffers(next_grad_kv)
        if i <= rank:
            add_(grad_query, grad_query_)
        else:
            grad_query = partial_update(grad_query, grad_query_, 1)
    grad_query = to(grad_query, query.dtype)
    next_grad_kv = to(dkv_rotater.next_buffer(), key.dtype)
    grad_key = view(next_grad_kv, grad_key)
    grad_value = view(next_grad_kv, grad_value)
    return grad_query, grad_key, grad_value


# -- the ring as deltas, for the hand-written replay (``analytic.replay``) ---------------------------------------


@dataclass(frozen=True)
class RingDeltas:
    """What one ring attention allocates and frees, in order, for ``analytic.replay``'s blocks (its CP hook: the
    sequence-parallel rank's program is written there, not in the op library).  ``forward``: ``ring_forward``'s
    (net: the output and the logsumexp, as the kernel's); ``backward``: ``ring_backward``'s (net: dq, and dk, dv in
    one buffer); ``merge_copy``: 1 when merging the heads of the output copies it; ``dv_copy``: 1 when v_proj's
    backward copies dv (a (B, h, s, d)-ordered view of the dk, dv buffer) to (B, s, kv·d)."""

    forward: tuple
    backward: tuple
    merge_copy: int
    dv_copy: int


def ring_deltas(ring: Ring, batch, heads: int, kv_heads: int, seq: int, d_head: int, dtype: str) -> RingDeltas:
    """``ring``'s ``RingDeltas`` for the model's q, k (RoPE's outputs: contiguous (B, h, s, d)) and v (a transposed
    view of v_proj's (B, s, kv, d) output), ``batch`` an int or a line in B (cached: every block asks)."""
    key = (batch.a, batch.b) if isinstance(batch, Affine) else batch
    return _ring_deltas(ring, key, heads, kv_heads, seq, d_head, dtype)


@lru_cache(maxsize=256)
def _ring_deltas(ring: Ring, key, heads: int, kv_heads: int, seq: int, d_head: int, dtype: str) -> RingDeltas:
    from . import aten as A
    from .tensors import Run

    class Recorder(Run):
        deltas: list | None = None

        def charge(self, nbytes, label, kernel=True, dtype=None, width=None):
            super().charge(nbytes, label, kernel, dtype, width)
            if self.deltas is not None:
                self.deltas.append(nbytes)

    batch = Affine(*key) if isinstance(key, tuple) else key
    with Recorder(traced=True) as run:
        q = empty((batch, heads, seq, d_head), dtype, "rope")
        k = empty((batch, kv_heads, seq, d_head), dtype, "rope")
        v = A.transpose(empty((batch, seq, kv_heads, d_head), dtype, "v_proj"), 1, 2)
        run.deltas = []
        out, lse = ring_forward(ring, q, k, v)
        forward, run.deltas = tuple(run.deltas), None
        grad = empty(out.shape, dtype, "grad_out")
        run.deltas = []
        _dq, _dk, dv = ring_backward(ring, grad, q, k, v, out, lse)
        backward, run.deltas = tuple(run.deltas), None
        merge_copy = int(not A.transpose(out, 1, 2).is_contiguous())
        dv_copy = int(not A.transpose(dv, 1, 2).is_contiguous())
    return RingDeltas(forward, backward, merge_copy, dv_copy)
