"""torch 2.13's context parallel on CPU tensors, so that a CP rank can run on the fake process group (issue 27).

``torch.distributed.tensor.experimental.context_parallel`` shards the sequence of the buffers it is given and, while
active, sends every SDPA kernel through DTensor's dispatcher to its ring attention
(``torch/distributed/tensor/experimental/_context_parallel/_attention.py``: the module-level ``custom_ops`` table,
merged into ``DTensor._op_dispatcher._custom_op_handlers`` by ``_enable_cp_dtensor_dispatcher``).  That table
lists CUDA's flash, memory-efficient and cuDNN kernels only, so on CPU tensors the step fails at the attention
(``aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding strategy registered``).

``install()`` adds the CPU flash kernel and its backward to the table, without editing torch.  Each handler takes
the sequence-sharded (``Shard(2)``) DTensors apart, runs torch's own ring attention
(``_templated_ring_attention`` / ``_templated_ring_attention_backward``) with the CPU kernel, as ``_sdpa_handler``
does with CUDA's, and wraps the results as ``Shard(2)`` DTensors again (the CPU kernel's logsumexp is fp32,
(B, H, S)).  CUDA's handler first runs the sharding propagator, which has no strategy for the CPU kernel: the
shards' placement is the only one CP makes, so it is set here directly.

What runs with it, against one process on gloo (outputs within 1.2e-7, gradients within 1.5e-8): forward and
backward at cp 2 and 4, both rotate methods ("allgather", torch's default, and "alltoall"), grouped-query heads,
under FSDP2 over the flattened (dp, cp) mesh, beside TP with and without sequence and vocab parallel on the tp
mesh (``build_rank``'s ``parallelize_module`` plan: the sequence ``context_parallel`` shards is SP's sequence, split
again over tp between the projections).  The handlers reach torch's private API: a torch other than 2.13 may
move them.  An attention mask is refused, as CP's CUDA path refuses it.
"""

from __future__ import annotations

import torch

from ..config import AccountingError

FLASH_CPU = "_scaled_dot_product_flash_attention_for_cpu"
SEQ_DIM = 2  # (B, H, S, D): CP shards the sequence of q, k and v


def _global_stride(local: torch.Tensor, shape: torch.Size) -> tuple[int, ...]:
    """Contiguous strides of the global ``shape`` in ``local``'s dim order (the CPU kernel returns (B, S, H, D)
    memory viewed as (B, H, S, D))."""
    order = sorted(range(local.dim()), key=lambda d: (local.stride(d), -d), reverse=True)
    stride, acc = [0] * local.dim(), 1
    for d in reversed(order):
        stride[d] = acc
        acc *= shape[d]
    return tuple(stride)


def _wrap(local: torch.Tensor, mesh, placements):
    """``local`` as the shard of a DTensor on ``mesh`` with ``placements``."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    shape = list(local.shape)
    for mesh_dim, p in enumerate(placements):
        if isinstance(p, Shard):
            shape[p.dim] *= mesh.size(mesh_dim)
    size = torch.Size(shape)
    meta = TensorMeta(size, _global_stride(local, size), local.dtype)
    return DTensor(local, DTensorSpec(mesh, tuple(placements), tensor_meta=meta), requires_grad=False)


def _locals(args):
    """(mesh, placements, the local shards of ``args``): every DTensor argument sharded on the sequence."""
    from torch.distributed.tensor import DTensor, Shard

    spec = next(a for a in args if isinstance(a, DTensor))
    if not all(isinstance(p, Shard) and p.dim == SEQ_DIM for p in spec.placements):
        raise NotImplementedError(f"context parallel on CPU: q, k, v sharded as {spec.placements}, not Shard(2)")
    return spec.device_mesh, spec.placements, [a._local_tensor if isinstance(a, DTensor) else a for a in args]


def _forward(op_call, args, kwargs):
    """``_scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p=0., is_causal=False, *, attn_mask=None,
    scale=None) -> (out, logsumexp)`` over the ring."""
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp

    if kwargs.get("attn_mask") is not None:
        raise NotImplementedError("context parallel on CPU: an attention mask")
    mesh, placements, local = _locals(args)
    q, k, v = local[:3]
    dropout_p = local[3] if len(local) > 3 else kwargs.get("dropout_p", 0.0)
    is_causal = local[4] if len(local) > 4 else kwargs.get("is_causal", False)
    kernel = getattr(torch.ops.aten, FLASH_CPU)
    out, lse = cp._templated_ring_attention(
        mesh.get_group(), SEQ_DIM, kernel, query=q, key=k, value=v, is_causal=is_causal, dropout_p=dropout_p,
        scale=kwargs.get("scale"),
    )  # fmt: skip
    return _wrap(out, mesh, placements), _wrap(lse, mesh, placements)


def _backward(op_call, args, kwargs):
    """``..._for_cpu_backward(grad_out, q, k, v, out, logsumexp, dropout_p, is_causal, *, attn_mask=None,
    scale=None) -> (grad_q, grad_k, grad_v)`` over the ring."""
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp

    if kwargs.get("attn_mask") is not None:
        raise NotImplementedError("context parallel on CPU: an attention mask")
    mesh, placements, (grad_out, q, k, v, out, lse, dropout_p, is_causal) = _locals(args)
    grads = cp._templated_ring_attention_backward(
        mesh.get_group(), SEQ_DIM, getattr(torch.ops.aten, FLASH_CPU + "_backward").default, grad_out=grad_out,
        grad_out_name="grad_out", query=q, key=k, value=v, out=out, logsumexp=lse, is_causal=is_causal,
        dropout_p=dropout_p, scale=kwargs.get("scale"),
    )  # fmt: skip
    return tuple(_wrap(g, mesh, placements) for g in grads)


def install() -> None:
    """Add the CPU flash kernel and its backward to CP's dispatch table (idempotent)."""
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp

    cp.custom_ops[getattr(torch.ops.aten, FLASH_CPU).default] = _forward
    cp.custom_ops[getattr(torch.ops.aten, FLASH_CPU + "_backward").default] = _backward


def ring_tracker(**kwargs):
    """``measure.distributed.RankTracker`` that sees what torch's ring attention allocates (``RankTracker`` built
    lazily: torch is imported on use).  Two corrections, both inside the CP handlers:

    1. ``aten.contiguous`` reaches the mode below autograd (``key.contiguous()``, ``logsumexp.chunk(...)[1]
       .contiguous()``) and its schema marks the result an alias of ``self``, so ``StorageTracker`` would take a
       copy for a view: a result in another storage than its input is charged.
    2. DTensor's sharding propagator builds the op's global-shape arguments as fake tensors
       (``_op_schema._rebuild_tensor_from_dtensor_meta``: ``torch.empty_strided`` under ``FakeTensorMode``): no
       memory, not charged."""
    from torch._subclasses.fake_tensor import FakeTensor

    from .distributed import RankTracker

    contiguous, empty_strided = torch.ops.aten.contiguous.default, torch.ops.aten.empty_strided.default

    class RingTracker(RankTracker):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is empty_strided:
                out = func(*args, **(kwargs or {}))
                if not isinstance(out, FakeTensor):
                    self._visit(out)
                return out
            out = super().__torch_dispatch__(func, types, args, kwargs)
            if func is contiguous and out.untyped_storage().data_ptr() != args[0].untyped_storage().data_ptr():
                self._visit(out)
            return out

    return RingTracker(**kwargs)


def _ring_attention(cp_mesh):
    """``FusedAttention.forward`` for a CP rank: q, k, v as ``Shard(2)`` DTensors on the cp mesh (as
    ``_context_parallel/_attention.py``'s ``sdpa_input_fn`` makes them, ``DTensor.from_local(..., run_check=False)``:
    no copy), the CPU flash kernel dispatched to the ring (``install``), the local output back."""
    from torch.distributed.tensor import DTensor, Shard

    def forward(q, k, v, causal: bool = True):
        q, k, v = (DTensor.from_local(t, cp_mesh, [Shard(SEQ_DIM)], run_check=False) for t in (q, k, v))
        out, _lse = getattr(torch.ops.aten, FLASH_CPU)(q, k, v, 0.0, causal)
        return out.to_local()

    return forward


def measure_cp_rank(cfg, seq: int, batch: int, setup, layout, rank: int = 0, rotate: str = "allgather"):
    """One training step of global rank ``rank`` of a context-parallel job (``layout.cp`` > 1) on the fake process
    group, on CPU tensors (on meta ``wait_tensor`` makes a new storage: the gathered K and V would not be
    charged): the model built and FSDP2-sharded (or DDP-wrapped) over the flattened dp × cp ranks
    (``ParallelLayout.flat_cp``, torchtitan's ``dp_shard_cp``), the token ids and targets sharded by torch's
    ``context_parallel`` (load-balanced), each fused attention run as its ring attention over the cp ranks
    (tp apart on the (dp, cp, tp) mesh; TP, if any, built by ``build_rank`` over the flattened ranks).  Beside HSDP
    (``replicate`` r) ``build_rank``'s HSDP mesh of the flattened layout is torchtitan's (dp_replicate, dp_shard_cp):
    dp rank k, cp rank c (flattened rank k·cp + c) is replica k // (dp/r), shard rank (k mod dp/r)·cp + c: the
    (dp_replicate, dp_shard, cp, tp) mesh's order.  Returns ``measure.distributed.RankMeasurement``.

    One difference from a real job, memory-neutral: the model numbers the rank's s positions 0..s−1 for RoPE
    (an int64 (s,) tensor either way) where the job passes the rank's load-balanced positions."""
    import contextlib

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import set_rotate_method

    from ..analytic.context_parallel import check
    from ..model import random_tokens
    from ..model.layers import FusedAttention
    from .distributed import check_rank_fits, init_fake_group, run_rank
    from .parallelize import build_rank

    flat, s = layout.flat_cp(), check(cfg, seq, setup, layout, rotate)
    if not 0 <= rank < layout.world:
        raise AccountingError(f"rank {rank} is outside the world of {layout.world}")
    check_rank_fits(cfg, s, batch, setup, flat, rank, False)  # real CPU tensors: the flattened rank's size bound
    install()
    set_rotate_method(rotate)
    init_fake_group(layout.world, rank)
    torch.manual_seed(0)
    # torchtitan's (dp, cp, tp) mesh: the cp ranks tp apart
    mesh = init_device_mesh(
        "cpu", (layout.dp, layout.cp, layout.tp), mesh_dim_names=(f"dp_of_cp{rank}", f"cp{rank}", f"tp_of_cp{rank}")
    )
    cp_mesh = mesh[f"cp{rank}"]
    model, meshes = build_rank(cfg, setup, flat)
    saved = FusedAttention.forward
    ring = _ring_attention(cp_mesh)
    FusedAttention.forward = lambda self, q, k, v, causal=True: ring(q, k, v, causal)
    inputs = random_tokens(cfg, batch, seq, device="cpu", seed=0)
    targets = random_tokens(cfg, batch, seq, device="cpu", seed=1)
    try:
        with context_parallel(cp_mesh, buffers=[inputs, targets], buffer_seq_dims=[1, 1]):
            return run_rank(
                cfg, seq // layout.cp, batch, setup, flat, rank, False, model, meshes.dp, ring_tracker(),
                torch.device("cpu"), contextlib.nullcontext(), tokens=(inputs, targets),
            )  # fmt: skip
    finally:
        FusedAttention.forward = saved
        set_rotate_method("allgather")
