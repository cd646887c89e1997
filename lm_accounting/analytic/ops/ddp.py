"""One rank of a DDP job (``torch.nn.parallel.DistributedDataParallel``) over transformers' program, as the HF
``Trainer`` runs it: ``torchrun ... train.py`` wraps the model through accelerate's ``prepare_model`` with
``DistributedDataParallelKwargs`` (accelerate ``utils/dataclasses.py``: ``bucket_cap_mb=25``,
``broadcast_buffers=True``, ``gradient_as_bucket_view=False``, ``static_graph=False``; transformers 5.24
``Trainer._build_accelerator_args`` passes ``find_unused_parameters = not gradient_checkpointing`` and the
``ddp_*`` arguments only when set).  Under amp-bf16 the Trainer's autocast runs inside the wrapped forward (no
policy: the single-GPU program's casts).  No torch.

What DDP adds to the single-GPU step (torch 2.13 ``torch/nn/parallel/distributed.py``, the C++ ``Reducer``;
``analytic.parallel`` rule 4, proven for our model by tests/test_parallel_measured.py):

1. At construction the reducer allocates one flat bucket buffer per bucket, the sum of its parameters' elements
   in their dtype (``Reducer::initialize_buckets``: ``at::empty({offset}, options)``); buckets never mix
   dtypes (``compute_bucket_assignment_by_size`` keys them by dtype and device), so the rank holds Σ n·e over
   every parameter that requires grad, in each parameter's dtype, for the whole job: a baseline shift.  The
   first step's buckets are one per dtype (``[sys.maxsize]`` limits, ``analytic.collectives`` rule 2); the
   reducer rebuilds them after it (1 MiB first, 25 MiB after) with the same total bytes.
2. In backward, with ``gradient_as_bucket_view=False``, each gradient autograd accumulates into ``p.grad`` (as
   without DDP) is copied into its bucket's view (``mark_variable_ready_dense``: ``bucket_view.copy_(grad)``
   under a comm hook), each full bucket all-reduced in place, and copied back into ``p.grad``
   (``finalize_bucket_dense``): nothing allocated.  ``zero_grad`` frees ``p.grad``; the buckets stay.
3. ``broadcast_buffers=True`` broadcasts the module buffers (the rotary ``inv_freq``) before each forward
   through a flat copy (``_broadcast_coalesced``) that dies at once, while the live bytes are the baseline: below
   every forward peak, so no phase's figure moves; not replayed.

So one DDP rank's step is the single-GPU step with every figure raised by the buckets' bytes (``Replicate``).

4. ZeRO-1 (``--zero 1``: DDP with torch's ``ZeroRedundancyOptimizer`` around AdamW, as ``measure.distributed``
   builds it for our model): the rank's AdamW holds moments and steps only the tensors the rank owns
   (``Replicate._owned``), then broadcasts every parameter from its owner in place (one broadcast per tensor,
   nothing allocated).  Rank 0 by default, the fake-PG job's: ZeRO-1's ranks differ (``Replicate(layout, rank)``).

5. ``find_unused_parameters`` (``Replicate(..., find_unused=...)``): transformers 5.24
   ``Trainer._build_accelerator_args`` passes ``ddp_find_unused_parameters`` when set, else, for a
   ``PreTrainedModel``, ``not (model.is_activation_checkpointing or args.activation_checkpointing)``: True without
   gradient checkpointing (``trainer_find_unused``).  True adds (torch 2.13, ``reducer.cpp``):

   a. ``Reducer::initialize_local_used_map`` at construction: ``local_used_map_`` (``at::zeros``, int32, one per
      parameter the reducer holds: those that require grad, a tied one once) and ``local_used_map_dev_``
      (``at::empty``, the same, on the parameters' device): 2 · 4 · n bytes for the whole job on the CPU job (on a
      GPU the first is host memory and only 4 · n are the device's);
   b. ``DistributedDataParallel._post_forward``: ``_DDPSink.apply`` passes the forward's output (the loss) through
      ``inp.clone()``; the original dies as ``_post_forward`` returns (the sink's backward passes the gradient on);
   c. after forward, ``prepare_for_backward`` searches the autograd graph for unused parameters (no tensor); in
      backward each hook sets its ``local_used_map_`` slot in place, and once the last bucket is ready
      ``all_reduce_local_used_map`` copies the map into ``local_used_map_dev_`` in place and all-reduces it (4 · n
      bytes, after the buckets).  With every parameter used the map's reduced values are never waited for
      (``finalize_bucket_dense`` reads a used slot as used), so nothing else is allocated;
   d. a parameter no gradient reaches (DSA's indexer, under ``torch.no_grad()``) is marked ready at the first hook
      (``mark_variable_ready_dense``: its bucket view ``zero_()``, in place); the reducer then waits for the
      map's all-reduce and copies it back into ``local_used_map_`` (in place) and leaves the parameter's ``.grad``
      None (``copy_bucket_to_grad`` skips a globally unused one), so AdamW makes no state for it.  With False the
      reducer raises at the next forward: such a program is refused then.

   The reducer reads the map's values (``local_used_map_[i].item()``), which FakeTensors do not have: the fake-PG
   job runs it on real CPU tensors only (tests/test_ops_ddp.py).
"""

from __future__ import annotations

from ...config import ModelConfig
from ...layout import ParallelLayout
from ...setup import TrainingSetup
from ..collectives import ddp_bucket_sizes
from ..parallel import zero1_owners
from .aten import clone
from .engine import Affine, StepInBatch
from .fsdp import DATA_PARALLEL_ONLY, fake_pg_program
from .step import training_step
from .tensors import Tensor, empty, numel


def check_ddp_layout(layout: ParallelLayout) -> None:
    """Refuse (``ValueError``) a layout ``Replicate`` does not replay."""
    other = layout.tp > 1 or layout.pp > 1 or layout.ep > 1 or layout.replicate > 1 or layout.cp > 1
    if layout.zero > 1 or layout.dp < 2 or other:
        raise ValueError(DATA_PARALLEL_ONLY)


FIND_UNUSED_ON_FAKE = (
    "DDP with find_unused_parameters=True (the HF Trainer's without gradient checkpointing) reads its used-parameter "
    "map's values, which FakeTensors do not have: measure it with --measure cpu (small shapes), or pass "
    "--no-find-unused-parameters"
)


ZERO1_MIXED_DTYPES = (
    "torch's ZeroRedundancyOptimizer refuses parameters of mixed dtypes (_verify_same_dense_param_type: DeepSeek's "
    "fp32 router beside bf16 weights): ZeRO-1 over this model cannot run"
)


def trainer_find_unused(setup: TrainingSetup) -> bool:
    """The HF Trainer's ``find_unused_parameters`` when ``ddp_find_unused_parameters`` is not set (rule 5): True
    without gradient checkpointing."""
    return setup.checkpoint == "none"


def dtype_numels(params: list[Tensor]) -> dict[str, int]:
    """Elements of the parameters that require grad, per dtype in first-seen order: the first step's buckets
    (rule 1)."""
    out: dict[str, int] = {}
    for p in params:
        if p.requires_grad:
            out[p.dtype] = out.get(p.dtype, 0) + numel(p.shape)
    return out


class Replicate:
    """DDP on rank ``rank`` (the module docstring): ``shard`` allocates the bucket buffers (and with
    ``find_unused`` the used-parameter maps, rule 5) and returns the parameters AdamW steps: every one, or under
    ZeRO-1 the ones the rank owns; the backward's copies allocate nothing; ``zero_grad`` frees the other ranks'
    tensors' gradients (ZeRO-1) and leaves the buckets."""

    def __init__(self, layout: ParallelLayout, rank: int = 0, find_unused: bool = False):
        check_ddp_layout(layout)
        self.layout, self.rank, self.find_unused = layout, rank, find_unused
        self.used_maps: list[Tensor] = []
        self.buckets: list[Tensor] = []
        self.grad_bytes: dict[str, list[int]] = {}  # dtype -> each gradient's bytes, in parameters() order
        self.param_bytes: list[int] = []  # every parameter's bytes (ZeRO-1's broadcasts after the step)
        self.others: list[Tensor] = []  # ZeRO-1: the parameters other ranks step

    def shard(self, program) -> list[Tensor]:
        untrained = {id(p) for p in program.untrained()} if hasattr(program, "untrained") else set()
        if untrained and not self.find_unused:
            raise ValueError(
                "DDP over a program with parameters no gradient reaches (DSA's indexer) needs "
                "find_unused_parameters=True: with False the reducer fails there"
            )
        params = program.parameters()
        if self.layout.zero == 1 and len({p.dtype for p in params}) > 1:
            raise ValueError(ZERO1_MIXED_DTYPES)
        for p in params:
            if p.requires_grad:
                self.grad_bytes.setdefault(p.dtype, []).append(p.nbytes)
        self.buckets = [empty((n,), dtype, "DDP bucket") for dtype, n in dtype_numels(params).items()]
        if self.find_unused:  # rule 5a: local_used_map_ and local_used_map_dev_, an int32 per reducer parameter
            n = sum(p.requires_grad for p in params)
            self.used_maps = [empty((n,), "int32", "local_used_map_"), empty((n,), "int32", "local_used_map_dev_")]
        self.param_bytes = [p.nbytes for p in params]
        stepped = params if self.layout.zero != 1 else self._owned(params)
        # rule 5d: AdamW makes no state for a parameter without a gradient (its bucket slots stay, zeroed in place)
        return [p for p in stepped if id(p) not in untrained]

    def _owned(self, params: list[Tensor]) -> list[Tensor]:
        """ZeRO-1 (rule 4; torch 2.13 ``ZeroRedundancyOptimizer._partition_parameters``, one parameter group):
        the tensors sorted by numel, largest first (stable), each to the least-loaded rank
        (``analytic.parallel.zero1_owners``); the rank's AdamW steps its own in that order, and the optimizer's
        ``zero_grad`` (``Optimizer.zero_grad`` over every parameter) frees the others' gradients too."""
        owners = zero1_owners([numel(p.shape) for p in params], self.layout.dp)
        order = sorted(range(len(params)), key=lambda i: -numel(params[i].shape))
        self.others = [p for p, o in zip(params, owners, strict=True) if o != self.rank]
        return [params[i] for i in order if owners[i] == self.rank]

    def forward_end(self, loss: Tensor) -> Tensor:
        """``_post_forward``: with ``find_unused`` the ``_DDPSink`` clone of the loss (rule 5b)."""
        return clone(loss) if self.find_unused else loss

    def backward_end(self) -> None:
        """``finalize_backward``: the buckets' all-reduced values copied back into ``p.grad``, in place."""

    def zero_grad(self) -> None:
        """``zero_grad(set_to_none=True)``: ``training_step`` frees the gradients of what AdamW stepped; under
        ZeRO-1 the other ranks' tensors' gradients die too.  The buckets live on."""
        for p in self.others:
            p.grad = None

    def all_reduces(self, first_step: bool = True) -> list[int]:
        """The payload bytes of each bucket's all-reduce in backward: the first step's one bucket per dtype (the
        reducer launches them in bucket order: sorted by their first parameter's index, then reversed,
        ``DistributedDataParallel._ddp_init_helper``'s ``list(reversed(bucket_indices))``: the dtype seen last
        goes first), or the rebuilt buckets (``analytic.collectives.ddp_bucket_sizes``: parameters in reverse
        order, 1 MiB then 25 MiB, per dtype in turn); with ``find_unused``, the used-parameter map's after them
        (rule 5c)."""
        if first_step:
            buckets = [sum(sizes) for sizes in self.grad_bytes.values()][::-1]
        else:
            buckets = [b for sizes in self.grad_bytes.values() for b in ddp_bucket_sizes(sizes)]
        return buckets + self.map_all_reduces()

    def map_all_reduces(self) -> list[int]:
        """With ``find_unused``: the payload of the used-parameter map's all-reduce (``local_used_map_dev_``), else
        none (rule 5c)."""
        return [m.nbytes for m in self.used_maps[1:]]


def predict_rank(
    cfg: ModelConfig,
    seq: int,
    setup: TrainingSetup,
    layout: ParallelLayout,
    *,
    impl: str,
    batch: int = 1,
    mode: str = "traced",
    device: str = "meta",
    cpu_threads: int = 1,
    replicate: Replicate | None = None,
    find_unused: bool | None = None,
) -> StepInBatch:
    """Rank 0 of the DDP or ZeRO-1 job ``layout`` over ``impl``'s program (``ops.predict_step(..., layout=...)``):
    the single-GPU program under ``replicate`` (a fresh ``Replicate`` of rank 0 unless given: pass one for another
    ZeRO-1 rank, or to read its ``all_reduces`` after; ``find_unused``: its ``find_unused_parameters``, None the
    Trainer's, ``trainer_find_unused``).  DDP's ranks are alike (the buckets hold every gradient)."""
    if impl == "course":  # our model's job (``measure.distributed.data_parallel``): DDP's defaults
        from .course.model import TransformerLM

        b = 1 if batch == 1 else Affine(1)
        make = lambda: TransformerLM(cfg, seq, setup, b)
        replicate = replicate or Replicate(layout, find_unused=False)
    elif impl == "transformers":
        if device == "cuda":
            raise ValueError("DDP over transformers on a CUDA target is not replayed yet (traced on meta or cpu)")
        if replicate is None:
            find_unused = trainer_find_unused(setup) if find_unused is None else find_unused
            replicate = Replicate(layout, find_unused=find_unused)
        # the job runs on cpu tensors (FakeTensors on meta): the CPU's kernel facts, as FSDP2's (``ops.fsdp``)
        make = fake_pg_program(cfg, seq, setup, 1 if batch == 1 else Affine(1))
    else:
        raise ValueError(f"DDP over --impl {impl}'s program is not replayed by the op library")
    return training_step(
        make,
        optimizer=setup.optimizer,
        device=device,
        traced=mode == "traced",
        cpu_threads=cpu_threads,
        cuda_batch=batch,
        sharding=replicate,
    )
