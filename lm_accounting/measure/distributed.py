"""One rank of an N-rank training job, run in this process on torch's fake process group.

The job is the real torch.distributed code: ``init_process_group("fake", store=FakeStore())``,
device meshes, FSDP2 ``fully_shard`` (with its ``MixedPrecisionPolicy`` under amp-bf16),
``parallelize_module`` with Megatron column/row splits (sequence parallel optional), DDP with an
all-reduce comm hook, ``ZeroRedundancyOptimizer``.  Collectives return at once (the fake backend
moves no data), so every rank sees exactly the allocations it would see in the real job.

Tensors are real CPU tensors (tiny configs): FSDP2 and DDP need a real device, and the storage
tracker needs real storages.  ``RankTracker`` is ``StorageTracker`` plus what the distributed code
needs: ``UntypedStorage.resize_`` (FSDP2 frees and re-allocates its unsharded parameters that way; it
is not an op, so no dispatch mode sees it), DTensor calls passed on to DTensor (the local ops it runs
are what allocate), the copies ``aten.to`` makes inside DTensor's handlers counted (its schema says
alias), and the functional collectives' ``AsyncCollectiveTensor`` wrappers left uncounted (each wraps
its collective's output and holds no memory of its own).  ``CollectiveRecorder`` records
every collective with the bytes of its largest tensor (the unsharded buffer); ``LocalFlops`` counts
matmul FLOPs of local tensors only.

Pipeline parallel is run stage by stage in ``measure.pipeline.measure_stage`` (torch's ``PipelineStage``
+ ``Schedule1F1B``), not here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..config import AccountingError, ModelConfig
from ..layout import ParallelLayout
from ..names import ADAMW_KWARGS
from ..phases import StepMemory
from ..setup import TrainingSetup
from .devices import check_live_run
from .parallelize import all_reduce_hook, build_rank, param_groups
from .tracker import StorageTracker, init_optimizer_state

COLLECTIVES = {  # op name -> collective kind (c10d ops and functional collectives)
    "_allgather_base_": "all_gather",
    "allgather_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "allreduce_": "all_reduce",
    "allreduce_coalesced_": "all_reduce",
    "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "alltoall_": "all_to_all",
    "alltoall_base_": "all_to_all",
    "all_to_all_single": "all_to_all",
    "broadcast_": "broadcast",
    "broadcast": "broadcast",
}


def _is_dtensor_call(types) -> bool:
    from torch.distributed.tensor import DTensor

    return any(issubclass(t, DTensor) for t in types)


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)


class RankTracker(StorageTracker):
    """``StorageTracker`` that sees ``UntypedStorage.resize_`` and lets DTensor run its local ops."""

    def __enter__(self):
        self._resize = orig = torch.UntypedStorage.resize_

        def resize_(st, size):
            orig(st, size)
            self._resized(st)

        torch.UntypedStorage.resize_ = resize_
        return super().__enter__()

    def __exit__(self, *args):
        torch.UntypedStorage.resize_ = self._resize
        return super().__exit__(*args)

    def _resized(self, st) -> None:
        key, nbytes = id(st), st.nbytes()
        entry = self._live.get(key)
        if entry is None:
            if not nbytes:
                return
            dev, delta = st.device, nbytes
            self._live[key] = [weakref.ref(st, lambda r, k=key: self._on_free(k, r)), nbytes, dev]
        else:
            dev, delta = entry[2], nbytes - entry[1]
            entry[1] = nbytes
        cur = self.current.get(dev, 0) + delta
        self.current[dev] = cur
        if cur > self.peak.get(dev, 0):
            self.peak[dev] = cur

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _is_dtensor_call(types):
            return NotImplemented
        if func._overloadpacket.__name__ == "_wrap_tensor_autograd":
            # functional collectives (DTensor's all-reduce, all-gather, reduce-scatter) return their
            # output wrapped in an ``AsyncCollectiveTensor`` (torch/distributed/_functional_collectives.py,
            # ``_maybe_wrap_tensor``): a ``_make_wrapper_subclass`` around the output, whose storage reports
            # the output's nbytes but holds no memory (its data pointer is invalid).  Not an allocation.
            return func(*args, **(kwargs or {}))
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if func._overloadpacket is torch.ops.aten.to:
            self._see_copies(args, out)
        return out

    def _see_copies(self, args, out) -> None:
        """An op whose schema says its output may alias its input (``aten.to``: ``Tensor(a)``) returns a
        new tensor when it converts.  Outside DTensor the dispatcher decomposes ``Tensor.to`` into
        ``_to_copy`` before any mode sees it; DTensor's own handlers (``loss_parallel``'s log-softmax:
        ``x.to(fp32)``, the result's ``.to(bf16)``, the gradient's ``.to(input dtype)``) run below that
        decomposition, so the mode sees ``aten.to`` itself.  Count each output whose storage is none of
        the inputs'."""
        inputs = {id(t.untyped_storage()) for t in _tensors(args)}
        for t in _tensors(out):
            if id(t.untyped_storage()) not in inputs:
                self._see(t)


@dataclass
class CollectiveRecorder(TorchDispatchMode):
    """Each collective op: (kind, bytes of its largest tensor, phase), in call order, and in ``groups`` the
    global ranks of the process group it ran over (HSDP's shard and replicate groups told apart)."""

    calls: list = field(default_factory=list)
    phase: str = "forward"
    groups: list = field(default_factory=list)

    def __post_init__(self):
        super().__init__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _is_dtensor_call(types):
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        kind = COLLECTIVES.get(func._overloadpacket.__name__)
        if kind is not None and func.namespace in ("c10d", "_c10d_functional", "c10d_functional"):
            tensors = [*_tensors(args), *_tensors(list((kwargs or {}).values())), *_tensors(out)]
            self.calls.append((kind, max(t.numel() * t.element_size() for t in tensors), self.phase))
            self.groups.append(_group_ranks(args))
        return out

    def totals(self) -> dict[str, tuple[int, int]]:
        """kind -> (count, bytes)."""
        out: dict[str, list[int]] = {}
        for kind, nbytes, _ in self.calls:
            entry = out.setdefault(kind, [0, 0])
            entry[0] += 1
            entry[1] += nbytes
        return {k: (c, b) for k, (c, b) in out.items()}


def _group_ranks(args) -> tuple[int, ...]:
    """The global ranks of a collective's process group: a c10d op's boxed ``ProcessGroup`` argument, or a
    functional collective's group name (its last string argument: ``all_reduce(input, reduce_op, group_name)``,
    torch/csrc/distributed/c10d/Functional.cpp); () where neither is found."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group

    for a in args:
        if isinstance(a, torch.ScriptObject):
            return tuple(dist.get_process_group_ranks(dist.ProcessGroup.unbox(a)))
    names = [a for a in args if isinstance(a, str)]
    return tuple(dist.get_process_group_ranks(_resolve_process_group(names[-1]))) if names else ()


class LocalFlops(TorchDispatchMode):
    """Matmul FLOPs (torch's ``flop_registry`` formulas) of ops on plain local tensors only: DTensor
    calls are passed on (their local ops are counted) and ops on meta tensors (the sharding
    propagator's global-shape re-runs) are skipped."""

    def __init__(self, fake_mode=None):
        super().__init__()
        from torch.utils.flop_counter import flop_registry

        self.registry = flop_registry
        self.total = 0
        self.fake_mode = fake_mode  # the run's own FakeTensorMode: its tensors are local work

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _is_dtensor_call(types):
            return NotImplemented
        from torch._subclasses.fake_tensor import is_fake

        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = self.registry.get(func._overloadpacket)
        if formula is not None and not any(
            t.is_meta or (is_fake(t) and t.fake_mode is not self.fake_mode) for t in _tensors(args)
        ):
            self.total += formula(*args, **kwargs, out_val=out)
        return out


@dataclass(frozen=True)
class RankMeasurement:
    """What one rank of the job held and did during one training step."""

    rank: int
    params: int  # bytes of the rank's parameter storages (padded FSDP2 shards)
    gradients: int  # bytes of the rank's .grad storages after backward
    optimizer: int  # bytes of the AdamW state it keeps (exp_avg, exp_avg_sq, step)
    step: StepMemory
    collectives: dict[str, tuple[int, int]]  # kind -> (count, bytes)
    local_flops: int | None  # forward + backward matmul FLOPs of its local ops (a pipeline stage: its m micro-batches)
    calls: tuple = ()  # (kind, bytes, phase) of every collective, in order
    comm_debug_counts: dict | None = None  # torch's CommDebugMode: op name -> count (comm_debug=True)
    groups: tuple = ()  # the global ranks of each call's process group, in the order of ``calls``


def _storage_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        st = local.untyped_storage()
        if id(st) not in seen:
            seen.add(id(st))
            total += st.nbytes()
    return total


def init_fake_group(world: int, rank: int) -> None:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    _clear_dtensor_caches()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)


def _clear_dtensor_caches() -> None:
    """DTensor caches redistribution plans and sharding decisions keyed by specs that compare equal
    across process groups of the same shape: a second job in this process would reuse the first's
    (destroyed) group names.  Clear them before each job."""
    from torch.distributed.tensor import DTensor, _collective_utils, _redistribute

    for fn in (
        getattr(_redistribute, "_gen_transform_infos", None),
        getattr(getattr(_collective_utils, "MeshTopoInfo", None), "build_from_mesh", None),
        getattr(DTensor._op_dispatcher.sharding_propagator, "_propagate_tensor_meta_cached", None),
        getattr(getattr(DTensor._op_dispatcher.sharding_propagator, "propagate_op_sharding", None), "cache", None),
    ):
        if hasattr(fn, "cache_clear"):
            fn.cache_clear()


REAL_RUN_PARAMS = 200_000_000  # a real-tensor run holds ~16 bytes per parameter on this CPU


def parameter_count(cfg: ModelConfig) -> int:
    from ..analytic.params import parameter_breakdown

    return parameter_breakdown(cfg).total


def measure_rank(
    cfg: ModelConfig,
    seq: int,
    batch: int,
    setup: TrainingSetup,
    layout: ParallelLayout,
    rank: int = 0,
    comm_debug: bool = False,
    fake: bool = False,
) -> RankMeasurement:
    """Build rank ``rank`` of the job on the fake process group, run one training step (the first:
    FSDP2's lazy initialisation and DDP's buckets are part of it) under ``RankTracker``, and report
    its model states, per-phase memory, collectives and local matmul FLOPs.  ``batch`` is the
    rank's micro-batch.  ``fake``: the tensors are FakeTensors (no data; their storages are on meta),
    materialised by ``to_empty`` under ``FakeTensorMode(allow_non_fake_inputs=True)`` after the
    sharding (FSDP2 + TP fails inside the mode): large shapes in seconds.  DDP needs real tensors."""

    layout.check(cfg, seq)
    if layout.pp > 1:
        raise AccountingError("a pipeline stage is measured by measure.pipeline.measure_stage_rank")
    if layout.tp > 1 and layout.dp > 1 and not layout.fsdp:
        raise AccountingError(
            "DDP and ZeRO-1 with tensor parallel are analytic only: torch 2.13's DDP does not take the DTensor "
            "parameters of parallelize_module (measure FSDP2 x TP, --zero 2 or 3)"
        )
    if not 0 <= rank < layout.world:
        raise AccountingError(f"rank {rank} is outside the world of {layout.world}")
    if fake and not layout.fsdp and layout.dp > 1:
        raise AccountingError("DDP and ZeRO-1 run on real tensors only (DDP's reducer needs data): drop fake")
    check_rank_fits(cfg, seq, batch, setup, layout, rank, fake)
    init_fake_group(layout.world, rank)
    torch.manual_seed(0)
    model, meshes = build_rank(cfg, setup, layout)
    dp_mesh = meshes.dp
    tracker, dev = RankTracker(), torch.device("meta" if fake else "cpu")
    mode = contextlib.nullcontext()
    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode

        mode = FakeTensorMode(allow_non_fake_inputs=True)
    with contextlib.ExitStack() as stack:
        stack.enter_context(mode)
        return run_rank(cfg, seq, batch, setup, layout, rank, comm_debug, model, dp_mesh, tracker, dev, mode)


def check_rank_fits(
    cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup, layout: ParallelLayout, rank: int, fake: bool
) -> None:
    """Refuse, before anything is built, a rank that cannot run here (``devices.check_live_run``): tensors past
    torch's limit, too many live layers, a run estimated past the time bound; and without ``fake`` (real
    CPU tensors: DDP, ZeRO-1, TP) more than ``REAL_RUN_PARAMS`` parameters, or the rank's predicted peak
    (``analytic.parallel.rank_step``, the tracker's run) over what the CPU allows, the single-GPU step's
    rule (80 % of the least of MemAvailable, the rlimits and the cgroups)."""
    what = "this rank's step"
    if fake:  # FakeTensors: no storage, whatever the shapes
        check_live_run(cfg, seq, batch, "meta", what, training=True, dtype=setup.param_dtype)
        return
    if parameter_count(cfg) > REAL_RUN_PARAMS:
        raise AccountingError(
            f"{cfg.name} has {parameter_count(cfg):,} parameters: a real-tensor run of this layout is limited to "
            f"{REAL_RUN_PARAMS:,} (FakeTensors serve FSDP2 without TP)"
        )
    from ..analytic.parallel import rank_step

    check_live_run(cfg, seq, batch, "meta", what, training=True, dtype=setup.param_dtype)  # before the replay
    try:
        need = rank_step(cfg, seq, batch, setup, layout, "traced", rank // layout.tp, "cpu")[0].peak
    except AccountingError:  # an architecture (MLA) or op layout the replay does not model: its course twin's bound
        need = twin_bound(cfg, seq, batch, setup, layout, rank)
    what += " (real CPU tensors)"
    check_live_run(cfg, seq, batch, "cpu", what, training=True, dtype=setup.param_dtype, need=need)


def twin_bound(cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup, layout: ParallelLayout, rank: int) -> int:
    """A bound on the traced peak of a rank whose architecture the replay does not model: (1) the course
    twin's rank peak (dense, so without expert parallel: nothing to split there) × 3/2, plus (2) 16 bytes
    (fp32 weight, gradient, AdamW m and v) for every parameter of the real model, unsharded, for the
    states (experts, latent projections) that the twin does not have.  Under ``op`` where no replay models it
    (beside TP, PP, ...), the twin's step without checkpointing, which saves more."""
    from ..analytic.parallel import rank_step

    run = dataclasses.replace(setup, checkpoint="none") if setup.checkpoint == "op" else setup
    twin = rank_step(cfg.course_twin(), seq, batch, run, dataclasses.replace(layout, ep=1), "traced",
                     rank // layout.tp, "cpu")[0].peak  # fmt: skip
    return twin * 3 // 2 + 16 * parameter_count(cfg)


def _materialise(model, cfg: ModelConfig, layout: ParallelLayout, device: str = "cpu") -> None:
    """Allocate the rank's (sharded) parameters on ``device``."""
    model.to_empty(device=device)
    tied = cfg.tie_embeddings and model.lm_head is not None and model.token_embeddings is not None  # (a stage: one)
    if tied and not layout.fsdp:  # to_empty makes a new Parameter per module: tie again
        model.lm_head.weight = model.token_embeddings.weight
    if model.rope is not None:  # non-persistent buffers: recompute the tables on the device
        model.rope = type(model.rope)(cfg.rope_theta, cfg.rope_dim, cfg.context_length, device=device)


def measure_rank_plain(
    cfg: ModelConfig,
    seq: int,
    batch: int,
    setup: TrainingSetup,
    layout: ParallelLayout,
    rank: int = 0,
    device: str = "cpu",
) -> StepMemory:
    """The *plain* run of rank ``rank`` of an FSDP2 job (zero 2 or 3) or a tensor-parallel one (with or
    without sequence and vocab parallel, alone or under FSDP2): no dispatch mode at all.
    On ``cpu`` the step is read from the CPU allocator's own events (``measure.allocator``); on
    ``cuda`` from the caching allocator's counters after one warm-up step (FSDP2's lazy
    initialisation and the cuBLAS workspaces land there).  Compare with
    ``analytic.parallel.rank_step(..., mode="plain", device=device, cpu_threads=torch.get_num_threads())``."""
    from ..model import cross_entropy, random_tokens
    from .allocator import measure_training_step_plain
    from .tracker import measure_training_step_cuda

    layout.check(cfg, seq)
    fsdp, tp = layout.fsdp and layout.dp > 1, layout.tp > 1 and layout.dp == 1
    if not (fsdp or tp) or layout.pp > 1:
        raise AccountingError(
            "the allocator measurement of a layout covers FSDP2 (--zero 2 or 3, dp > 1) and tensor parallel (with or "
            "without --sp and --vocab-parallel, alone or under FSDP2): not DDP, ZeRO-1 or pipeline parallel"
        )
    if not 0 <= rank < layout.world:
        raise AccountingError(f"rank {rank} is outside the world of {layout.world}")
    if parameter_count(cfg) > REAL_RUN_PARAMS:
        raise AccountingError(f"a real-tensor run is limited to {REAL_RUN_PARAMS:,} parameters")
    from ..analytic.parallel import rank_step

    threads = torch.get_num_threads() if device == "cpu" else 1
    need = rank_step(cfg, seq, batch, setup, layout, "plain", rank // layout.tp, device, threads)[0].peak
    check_live_run(cfg, seq, batch, device, "this rank's step", training=True, dtype=setup.param_dtype, need=need)
    init_fake_group(layout.world, rank)
    torch.manual_seed(0)
    model, _ = build_rank(cfg, setup, layout, device)
    _materialise(model, cfg, layout, device)
    opt = torch.optim.AdamW(param_groups(model), **ADAMW_KWARGS[setup.optimizer])
    init_optimizer_state(opt)
    inputs = random_tokens(cfg, batch, seq, device=device, seed=0)
    targets = random_tokens(cfg, batch, seq, device=device, seed=1)
    loss_fn = vocab_parallel_cross_entropy if layout.vocab_parallel else cross_entropy
    with _loss_parallel(layout):
        if device == "cuda":
            return measure_training_step_cuda(model, inputs, targets, loss_fn, optimizer=opt)
        return measure_training_step_plain(model, inputs, targets, loss_fn, opt)


def _loss_parallel(layout: ParallelLayout):
    """Vocab parallel: the loss and its backward under ``loss_parallel()`` (the sharded logits' own
    cross-entropy); a null context otherwise."""
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel() if layout.vocab_parallel else contextlib.nullcontext()


def run_rank(cfg, seq, batch, setup, layout, rank, comm_debug, model, dp_mesh, tracker, dev, mode, tokens=None):
    """``tokens``: the rank's (inputs, targets) where given (a context-parallel rank's sequence shards, copied
    inside the tracker), else random (B, S) ids made there."""
    from torch.distributed.tensor.parallel import loss_parallel

    from ..model import cross_entropy, random_tokens

    with tracker:
        _materialise(model, cfg, layout)
        train, opt = data_parallel(model, layout, dp_mesh, setup)
        if tokens is None:
            inputs = random_tokens(cfg, batch, seq, device="cpu", seed=0)
            targets = random_tokens(cfg, batch, seq, device="cpu", seed=1)
        else:
            inputs, targets = (t.clone() for t in tokens)
    params = _storage_bytes(model.parameters())
    optimizer = optimizer_state_bytes(opt)
    baseline = tracker.live_bytes(dev)
    from .attention_flops import install

    install()  # FLOP formulas for the CPU flash kernels (FlopCounterMode's registry counts them as 0)
    comms, flops = CollectiveRecorder(), LocalFlops(mode if not isinstance(mode, contextlib.nullcontext) else None)
    debug = comm_debug_mode() if comm_debug else contextlib.nullcontext()
    grads = 0
    with tracker, comms, flops, debug:
        vp = layout.vocab_parallel
        loss_fn = vocab_parallel_cross_entropy if vp else cross_entropy
        with tracker.phase("forward"), loss_parallel() if vp else contextlib.nullcontext():
            loss = loss_fn(train(inputs), targets)
        comms.phase = "backward"
        with tracker.phase("backward"), loss_parallel() if vp else contextlib.nullcontext():
            loss.backward()
            del loss
            grads = _storage_bytes(p.grad for p in model.parameters())
        comms.phase = "optimizer_step"
        with flops_off(flops), tracker.phase("optimizer_step"):
            opt.step()
            opt.zero_grad(set_to_none=True)
    step = StepMemory(baseline, **tracker.phase_table(dev))
    counts = dict(Counter({str(k): v for k, v in debug.comm_counts.items()})) if comm_debug else None
    return RankMeasurement(
        rank, params, grads, optimizer, step, comms.totals(), flops.total, tuple(comms.calls), counts,
        tuple(comms.groups),
    )  # fmt: skip


def data_parallel(model, layout: ParallelLayout, dp_mesh, setup: TrainingSetup):
    """(the module to train, its optimizer with initialised state): DDP with the fake group's comm hook
    (zero 0 and 1, dp > 1), ``ZeroRedundancyOptimizer`` over AdamW (zero 1), else AdamW; FSDP2 was applied
    at build time (``build_rank``)."""
    kwargs, train = ADAMW_KWARGS[setup.optimizer], model
    if not layout.fsdp and layout.dp > 1:
        from torch.nn.parallel import DistributedDataParallel

        train = DistributedDataParallel(model, process_group=dp_mesh.get_group())
        train.register_comm_hook(dp_mesh.get_group(), all_reduce_hook)
    if layout.zero == 1 and layout.dp > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        opt = ZeroRedundancyOptimizer(
            param_groups(model), optimizer_class=torch.optim.AdamW, process_group=dp_mesh.get_group(), **kwargs
        )
    else:
        opt = torch.optim.AdamW(param_groups(model), **kwargs)
    init_optimizer_state(opt)
    return train, opt


def optimizer_state_bytes(opt) -> int:
    """Bytes of the AdamW moments ``opt`` keeps (a ``ZeroRedundancyOptimizer``'s own shard's)."""
    state = opt.optim.state if hasattr(opt, "optim") else opt.state
    return _storage_bytes(v for s in state.values() for k, v in s.items() if k != "step")


def vocab_parallel_cross_entropy(logits, targets):
    """The vocab-parallel job's loss, as torchtitan computes it (``torchtitan/components/loss.py``):
    ``F.cross_entropy`` (mean) over the (B·S, V) logits, here sharded on V, inside torch's
    ``loss_parallel()`` (``torch/distributed/tensor/parallel/loss.py``: a log-softmax and an NLL whose
    max, sum of exponentials and target logit are all-reduced over the TP ranks; no logits gathered).
    It replaces the course's ``cross_entropy``, which DTensor cannot run on vocabulary shards without
    gathering them."""
    import torch.nn.functional as F

    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(0, 1))


@contextlib.contextmanager
def flops_off(counter: LocalFlops):
    """The optimizer step has no matmuls; keep its elementwise ops out of the count anyway."""
    before = counter.total
    yield
    counter.total = before


def comm_debug_mode():
    """torch's ``CommDebugMode`` without its module tracker, which fails on a module called twice in
    one parent (the shared RoPE is): it still counts every collective op (``comm_counts``)."""
    from torch.distributed.tensor.debug import CommDebugMode

    class Counting(CommDebugMode):
        def __enter__(self):
            self.comm_counts.clear()
            self.advanced_module_tracker.module_parents_dict[""] = []
            TorchDispatchMode.__enter__(self)
            return self

        def __exit__(self, *args):
            TorchDispatchMode.__exit__(self, *args)

    return Counting()
