"""``memory``: training memory per phase, predicted (and measured), and capacity; with a parallel layout,
the worst rank's per-GPU memory, FLOPs and collectives.

The budget per GPU is ``gpus.memory_budget``: the GPU's CUDA-reported total less the allowance (CUDA
context, communication buffers, fragmentation), or ``budget`` as given; the same rule with and without
a layout, and in ``infer`` and ``plan``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..analytic.memory_report import MemoryAccount
from ..analytic.program_report import implementation_account, step_unmodelled
from ..analytic.sizes import at_context, check_batch_seq
from ..config import AccountingError, ModelConfig
from ..gpus import DEFAULT_GPU, MemoryBudget, memory_budget
from ..implementations import check_impl, check_measurable
from ..layout import ParallelLayout
from ..names import MEASURE_CHOICES, MEASURE_METHODS
from ..setup import TrainingSetup, check_cuda_fused_attention

if TYPE_CHECKING:  # a layout's modules are imported when a layout is given (the single-GPU path stays light)
    from ..analytic.parallel_report import ParallelMemory


@dataclass(frozen=True)
class Request:
    config: ModelConfig
    context: int | None = None  # None: the config's context_length
    batch: int = 1  # per data-parallel rank under a layout
    setup: TrainingSetup = field(default_factory=TrainingSetup)
    layout: ParallelLayout | None = None  # None: one GPU
    gpu: str = DEFAULT_GPU
    allowance: int | None = None  # default gpus.DEFAULT_ALLOWANCE
    budget: int | None = None  # the usable bytes per GPU, as given (no allowance subtracted)
    rank: int | None = None  # a layout's global rank to predict and measure (default: the worst)
    measure: str = "none"  # none, meta, cpu or cuda
    measure_method: str | None = None  # tracker or allocator (default: tracker; cuda: the caching allocator)
    allow_long: bool = False  # a measurement estimated past measure.devices.MAX_LIVE_SECONDS
    impl: str = "course"  # the model code predicted (implementations.IMPLS; the CLI's default: default_impl)
    find_unused: bool | None = None  # DDP's find_unused_parameters over transformers (None: the HF Trainer's)
    run_config: ModelConfig = field(init=False, repr=False)  # the config at the context
    budget_basis: MemoryBudget = field(init=False, repr=False)
    method: str | None = field(init=False, repr=False)  # MemoryAccount's measurement method, None: none

    def __post_init__(self) -> None:
        run = at_context(self.config, self.context)
        check_batch_seq(self.batch, run.context_length)
        object.__setattr__(self, "run_config", run)
        object.__setattr__(self, "budget_basis", memory_budget(self.gpu, self.allowance, self.budget))
        object.__setattr__(self, "method", measurement_method(self.measure, self.measure_method))
        check_impl(run, self.impl)
        check_measurable(self.impl, self.measure)
        self.check_find_unused()
        lay = self.layout
        gpu_run = self.measure in ("none", "cuda")  # the course model's prediction runs CUDA's kernels
        if self.setup.attention == "sdpa" and gpu_run and self.impl == "course":
            check_cuda_fused_attention(run.kv_heads < run.num_heads, self.setup.precision == "fp32")
        if lay is None:
            if self.rank is not None:
                raise AccountingError("--rank needs a parallel layout (--dp, --tp, --pp, ...): one GPU has one rank")
            missing = step_unmodelled(run, self.setup, self.impl)
            if self.measure != "none" and missing:  # nothing to compare a measurement with
                raise AccountingError(
                    f"--measure needs the {self.impl} program, which does not model {', '.join(missing)}"
                    + ("" if self.impl == "course" else " yet")
                )
            return
        if self.impl != "course":  # rank 0 of FSDP2 over the op library's program (it refuses other layouts)
            from ..analytic.parallel_report import check_implementation_rank

            check_implementation_rank(self.impl, self.rank, "meta" if self.measure == "none" else self.measure)
            if self.method == "allocator":
                raise AccountingError(f"--impl {self.impl} under a layout is measured by the storage tracker")
            return
        lay.check(run, run.context_length)
        if self.rank is not None and self.rank >= lay.world:
            raise AccountingError(f"--rank {self.rank} is outside the world of {lay.world}")
        if self.measure == "cuda":
            raise AccountingError("a parallel layout is measured on the fake process group: use --measure meta")

    def check_find_unused(self) -> None:
        """--[no-]find-unused-parameters: DDP or ZeRO-1 over transformers only; True (given, or the Trainer's
        without checkpointing) is not measured on FakeTensors (``ops.ddp`` rule 5)."""
        ddp = self.impl == "transformers" and self.layout is not None and not self.layout.fsdp and self.layout.tp == 1
        if self.find_unused is not None and not ddp:
            raise AccountingError(
                "--[no-]find-unused-parameters is DDP's option: give it with --impl transformers --dp N --zero 0 or 1"
            )
        if not ddp:
            return
        from ..analytic.ops.ddp import FIND_UNUSED_ON_FAKE, trainer_find_unused

        find_unused = trainer_find_unused(self.setup) if self.find_unused is None else self.find_unused
        if ddp and self.measure == "meta" and find_unused:
            raise AccountingError(FIND_UNUSED_ON_FAKE)

    @property
    def device(self) -> str:
        """Whose kernels the single-GPU prediction is for: a GPU's, or the measured device's."""
        return "cuda" if self.measure == "none" else self.measure


def measurement_method(measure: str, method: str | None) -> str | None:
    """How ``measure`` is taken (``MemoryAccount.with_measurement``'s method), None for no measurement:
    the tracker on meta/cpu (default), the CPU allocator with ``measure="cpu"`` only, the caching
    allocator on cuda.  Any other combination is an ``AccountingError``."""
    if measure not in MEASURE_CHOICES:
        raise AccountingError(f"unknown --measure '{measure}' (valid: {', '.join(MEASURE_CHOICES)})")
    if method is not None and method not in MEASURE_METHODS:
        raise AccountingError(f"unknown --measure-method '{method}' (valid: {', '.join(MEASURE_METHODS)})")
    if measure == "none":
        if method is not None:
            where = "cpu" if method == "allocator" else "meta or --measure cpu"
            raise AccountingError(f"--measure-method {method} needs a measurement: add --measure {where}")
        return None
    if method == "allocator" and measure != "cpu":
        raise AccountingError(
            f"--measure-method allocator reads the CPU allocator (the plain run): it needs --measure cpu, not {measure}"
        )
    if measure == "cuda":
        if method == "tracker":
            raise AccountingError("--measure cuda reads the caching allocator's counters; leave out --measure-method")
        return "cuda"
    return method or "tracker"


def cpu_threads(request: Request) -> int:
    """The threads of a plain CPU run (the CPU flash kernel's scratch is per thread); 1 otherwise, where
    the scratch does not depend on it.  torch is imported only for the plain CPU run."""
    if request.method != "allocator":
        return 1
    import torch

    return torch.get_num_threads()


def run(request: Request) -> MemoryAccount | ParallelMemory:
    """The prediction (analytic; no torch unless a plain CPU run is to be measured)."""
    r, cfg = request, request.run_config
    if r.layout is None:
        return implementation_account(
            cfg, cfg.context_length, r.batch, impl=r.impl, budget=r.budget_basis, setup=r.setup, device=r.device,
            cpu_threads=cpu_threads(r),
        )  # fmt: skip
    # impl other than course: traced on meta, which the fake-PG job on cpu tensors measures too
    from ..analytic.parallel_report import parallel_memory

    lay = r.layout
    result = parallel_memory(
        cfg, cfg.context_length, r.batch, r.setup, lay, budget=r.budget_basis, rank=r.rank, impl=r.impl,
        find_unused=r.find_unused,
    )  # fmt: skip
    return layout_step_time(r, result)


def layout_step_time(request: Request, result: ParallelMemory) -> ParallelMemory:
    """The layout's step by ``plan``'s step-time model (``plan.estimate_step``: the figure ``plan`` prints for it),
    or the reason it has none (a step the model cannot price: memory is still the answer)."""
    from ..plan import estimate_step

    r, cfg = request, request.run_config
    try:
        estimate = estimate_step(cfg, r.gpu, cfg.context_length, r.batch, r.setup, r.layout, impl=r.impl)
    except AccountingError as err:
        return dataclasses.replace(result, step_time_note=str(err))
    return dataclasses.replace(result, step_time=estimate)


def measured_rank(request: Request, result: ParallelMemory) -> int:
    """The global rank measured: ``rank``, else the worst data-parallel rank's first tensor-parallel rank."""
    return result.states.rank * request.layout.tp if request.rank is None else request.rank


def measure_method_name(request: Request) -> str:
    """The ``method`` argument of the single-GPU measurers: the CPU allocator or the storage tracker."""
    return "allocator" if request.method == "allocator" else "tracker"


def measure(request: Request, result: Any) -> Any:
    """``result`` with one live training step measured as ``request.measure`` and ``measure_method`` say
    (refused before anything is built if it cannot fit or, without ``allow_long``, would run too long)."""
    if request.method is None:
        return result
    from ..measure.devices import long_runs_allowed

    with long_runs_allowed(request.allow_long):
        return measured(request, result)


def measured(request: Request, result: Any) -> Any:
    """``measure``'s work: the live step of one GPU, or of the layout's rank or stage."""
    r, cfg = request, request.run_config
    seq = cfg.context_length
    if r.layout is None and r.impl == "transformers":  # transformers' own model class, on meta or cpu
        from ..measure.hf import measure_hf_step

        got = measure_hf_step(cfg, seq, r.batch, r.setup, device=r.measure, method=measure_method_name(r))
        return result.with_measurement(got, device=r.measure, method=r.method)
    if r.layout is None:
        from ..measure.memory import measure_step

        got = measure_step(
            cfg,
            seq,
            r.batch,
            device=r.measure,
            setup=r.setup,
            method=measure_method_name(r),
        )
        return result.with_measurement(got, device=r.measure, method=r.method)
    if r.impl == "transformers":  # rank 0 of FSDP2 over transformers' decoder layers, fake process group
        from ..measure.hf import measure_hf_step

        return result.with_measurement(
            measure_hf_step(cfg, seq, r.batch, r.setup, device=r.measure, layout=r.layout, find_unused=r.find_unused)
        )
    lay, who = r.layout, measured_rank(r, result)
    if lay.cp > 1:  # torch's context_parallel on CPU tensors (meta's wait_tensor would hide the gathered K, V)
        if r.method == "allocator":
            raise AccountingError("a context-parallel rank is measured by the storage tracker only (--measure meta)")
        from ..measure.context_parallel import measure_cp_rank

        return result.with_measurement(measure_cp_rank(cfg, seq, r.batch, r.setup, lay, rank=who))
    if r.method == "allocator":  # the plain run, no dispatch mode, beside its CPU prediction
        from ..analytic.parallel import rank_step
        from ..measure.distributed import measure_rank_plain

        got = measure_rank_plain(cfg, seq, r.batch, r.setup, lay, rank=who)
        want = rank_step(cfg, seq, r.batch, r.setup, lay, "plain", who // lay.tp, "cpu", cpu_threads(r))
        return result.with_plain_measurement(want[0], got)
    if lay.pp > 1:  # one stage of torch's Schedule1F1B: the worst, or the rank's
        from ..measure.pipeline import measure_stage_rank

        return result.with_measurement(
            measure_stage_rank(cfg, seq, r.batch, r.setup, lay, result.stage or 0, result.states.rank)
        )
    from ..measure.distributed import measure_rank

    fake = lay.fsdp and lay.tp == 1  # FakeTensors: exact for FSDP2 alone, at any size
    return result.with_measurement(measure_rank(cfg, seq, r.batch, r.setup, lay, rank=who, fake=fake))
