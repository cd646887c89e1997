"""``memory`` with a parallel layout: the worst rank's per-GPU memory, FLOPs and collectives.  No torch.

``parallel_memory(cfg, seq, batch, setup, layout)`` returns a ``ParallelMemory`` (schema
``lm-accounting/parallel-memory/3``).  Where the step replay does not model the architecture (latent
attention), the model states and the collectives are
exact and the activations, phases and peaks are None, named in ``not_modelled`` (as the single-GPU
``memory`` does).  ``batch`` is the micro-batch of one data-parallel rank.  The peak is compared with
the budget per GPU (``gpus.memory_budget``: the GPU's CUDA total less the allowance for the CUDA
context, NCCL buffers and fragmentation, ``DEFAULT_ALLOWANCE`` by default, or a budget given as is),
the same rule as single-GPU ``memory``, ``infer`` and ``plan``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

from ..config import AccountingError, ModelConfig
from ..gpus import MemoryBudget, as_budget
from ..implementations import implementation_dict
from ..layout import ParallelLayout
from ..parallelisms import group_ranks
from ..phases import PHASES, StepMemory
from ..result import Result
from ..setup import TrainingSetup
from .collectives import Collective, step_collectives, wire_bytes
from .hardware_flops import StepFlops
from .parallel import ModelStates, expert_rows, model_states, peaks_exact, rank_flops, rank_step
from .pipeline import pipeline_stages
from .replay import replay_unsupported


@dataclass(frozen=True)
class ParallelMemory(Result):
    SCHEMA: ClassVar[str] = "lm-accounting/parallel-memory/7"

    config: ModelConfig
    seq: int
    batch: int  # micro-batch per data-parallel rank
    setup: TrainingSetup
    layout: ParallelLayout
    states: ModelStates
    activations: int | None  # None: not modelled (``not_modelled``)
    step: StepMemory | None  # plain run (what a GPU user gets); None: not modelled (also for impl other than course)
    step_traced: StepMemory | None  # what a dispatch-mode tracker sees (the fake-PG measurement)
    flops: StepFlops
    collectives: tuple[Collective, ...]
    budget_basis: MemoryBudget  # the budget per GPU and how it was derived
    peaks_exact: bool  # False where ``analytic.parallel.peaks_exact`` says so (the ends are exact)
    stage: int | None = None  # pipeline stage of the worst rank (pp > 1)
    measured: Any = None  # measure.distributed.RankMeasurement
    plain_cpu: tuple[StepMemory, StepMemory] | None = None  # (predicted, measured): the plain run, CPU allocator
    not_modelled: tuple[str, ...] = ()  # what the replay leaves out: then only states and collectives
    impl: str = "course"  # the model code predicted; "transformers": rank 0's traced step (``implementation_rank``)
    device: str = "cuda"  # whose kernels ``step`` runs: cuda (course), or meta/cpu (transformers: CUDA not ported)
    step_time: Any = None  # ``plan.StepEstimate``: the layout's step time, MFU and HFU (``commands.memory``)
    step_time_note: str = ""  # why there is none

    @property
    def peak(self) -> int | None:
        return None if self.step is None else self.step.peak

    @property
    def budget(self) -> int:
        """The bytes per GPU the peak must fit in (``budget_basis``)."""
        return self.budget_basis.usable

    @property
    def allowance(self) -> int | None:
        """What was kept back from the GPU's CUDA total; None for a budget given as is."""
        return self.budget_basis.allowance

    @property
    def fits(self) -> bool | None:
        return None if self.peak is None else self.peak <= self.budget

    def with_measurement(self, measured) -> ParallelMemory:
        return replace(self, measured=measured)

    def with_plain_measurement(self, predicted: StepMemory, measured: StepMemory) -> ParallelMemory:
        """The plain run (no dispatch mode) on CPU tensors read from the CPU allocator, beside its
        prediction for a CPU run (``rank_step(mode="plain", device="cpu")``)."""
        return replace(self, plain_cpu=(predicted, measured))

    def experts(self) -> dict[str, int] | None:
        """The routed experts on the worst rank (``analytic.parallel`` rule 7); None for a dense model."""
        cfg = self.config
        if not cfg.moe:
            return None
        return {
            "local_experts": cfg.num_experts // self.layout.ep,
            "slots_per_moe_layer": self.batch * self.seq * cfg.experts_per_token,
            "rows_per_moe_layer": expert_rows(cfg, self.seq, self.batch, self.layout, self.states.rank),
        }

    def group_size(self, group: str) -> int:
        """Ranks of process group ``group``, from the parallelism that runs it (``parallelisms.group_ranks``)."""
        return group_ranks(self.layout, group)[0]

    def to_dict(self) -> dict[str, Any]:
        st = self.states
        out: dict[str, Any] = {
            "schema": self.SCHEMA,
            "model": self.config.name,
            "config": self.config.resolved(),
            "context": self.seq,
            "micro_batch": self.batch,
            "setup": self.setup.to_dict(),
            "implementation": implementation_dict(self.config, self.impl, self.setup),
            "layout": self.layout.to_dict(),
            "worst_rank": {"data_parallel_rank": st.rank, "pipeline_stage": self.stage},
            "per_gpu": {k: None for k in PER_GPU_KEYS}
            if self.impl != "course"  # our model's sharding rules, not checked for another implementation's
            else {
                "parameters": st.parameters,
                "gradients": st.gradients,
                "optimizer_state": st.optimizer,
                "ddp_buckets": st.ddp_buckets,
                "fsdp_unsharded_all_units": st.unsharded_all,
                "fsdp_largest_unit_unsharded": st.unsharded_unit_max,
                "saved_activations": self.activations,
            },
            "step": None if self.step is None else self.step.to_dict(),
            "step_time": None if self.step_time is None else self.step_time.to_dict(),
            "step_time_note": self.step_time_note or None,
            "step_traced": None if self.step_traced is None else self.step_traced.to_dict(),
            "not_modelled": list(self.not_modelled),
            "experts": self.experts(),
            "peaks_exact": self.peaks_exact,
            "peak": self.peak,
            "allowance": self.allowance,
            "budget": self.budget,
            "budget_basis": self.budget_basis.to_dict(),
            "fits": self.fits,
            "flops": {
                "forward": self.flops.forward,
                "model": self.flops.model,
                "hardware": self.flops.hardware,
            },
            "collectives": [
                {
                    "kind": c.kind,
                    "phase": c.phase,
                    "group": c.group,
                    "count": c.count,
                    "payload_bytes": c.payload,
                    "wire_bytes": wire_bytes(c, self.group_size(c.group)),
                    "formula": c.formula,
                }
                for c in self.collectives
            ],
            "measured": None,
            "plain_cpu": None
            if self.plain_cpu is None
            else {"predicted": self.plain_cpu[0].to_dict(), "measured": self.plain_cpu[1].to_dict()},
        }
        m = self.measured
        if isinstance(m, StepMemory):  # transformers: the fake-PG tracker's step of rank 0, states not read apart
            out["measured"] = {"rank": 0, "step": m.to_dict()}
        elif m is not None:
            out["measured"] = {
                "rank": m.rank,
                "parameters": m.params,
                "gradients": m.gradients,
                "optimizer_state": m.optimizer,
                "step": m.step.to_dict(),
                "collectives": {k: {"count": c, "payload_bytes": b} for k, (c, b) in m.collectives.items()},
                "local_matmul_flops": m.local_flops,
            }
        return out

    def records(self) -> list[dict[str, Any]]:
        rows = [{"quantity": k, "phase": "", "bytes": v} for k, v in self.to_dict()["per_gpu"].items()]
        step, kind = (self.step, "") if self.impl == "course" else (self.step_traced, f" (traced on {self.device})")
        for name in PHASES if step is not None else ():
            ph = step.phase(name)
            rows += [
                {"quantity": "peak" + kind, "phase": name, "bytes": ph.peak},
                {"quantity": "end" + kind, "phase": name, "bytes": ph.end},
            ]
        rows.append({"quantity": "allowance", "phase": "", "bytes": self.allowance})
        rows.append({"quantity": "budget", "phase": "", "bytes": self.budget})
        rows += [{"quantity": f"{c.kind} ({c.group})", "phase": c.phase, "bytes": c.payload} for c in self.collectives]
        return rows


def parallel_memory(
    cfg: ModelConfig,
    seq: int,
    batch: int,
    setup: TrainingSetup,
    layout: ParallelLayout,
    *,
    allowance: int | None = None,
    budget: int | MemoryBudget | None = None,
    rank: int | None = None,
    impl: str = "course",
    device: str = "meta",
    find_unused: bool | None = None,
) -> ParallelMemory:
    """``budget``: a ``gpus.MemoryBudget``, or bytes as given; by default the default GPU's CUDA total less
    ``allowance`` (``DEFAULT_ALLOWANCE``).  The worst rank of ``layout`` (see ``analytic.parallel``; pipeline stages: ``pipeline_stages``),
    or global rank ``rank`` (its data-parallel rank is rank // tp; under pipeline parallel, on a (pp, dp,
    tp) mesh with the stages outermost as torchtitan lays them out, its stage is rank // (dp·tp) and its
    data-parallel rank (rank // tp) mod dp).  ``impl`` other than course: ``implementation_rank`` (``device``
    the traced run's, meta or cpu; ``find_unused``: DDP's ``find_unused_parameters``, None the HF Trainer's)."""
    if impl != "course":  # the op library's own refusals (it models other architectures than the course's)
        budget = as_budget(budget, allowance)
        return implementation_rank(cfg, seq, batch, setup, layout, impl, budget, rank, device, find_unused)
    layout.check(cfg, seq)
    stage, missing = None, not_modelled(cfg, seq, setup, layout)
    if missing:
        st = model_states(cfg, setup, layout, rank=None if rank is None else rank // layout.tp)
        step = traced = act = None
    elif layout.pp > 1:
        at = None if rank is None else rank // (layout.dp * layout.tp)
        dp_rank = None if rank is None else rank // layout.tp % layout.dp
        stage, step, traced, st, act = pipeline_stages(cfg, seq, batch, setup, layout, at, rank=dp_rank)
    elif layout.cp > 1:  # its dp·cp rank (the mesh is (dp, cp)): analytic.context_parallel
        from .context_parallel import cp_rank_step  # the ring: only under CP

        step, st, act = cp_rank_step(cfg, seq, batch, setup, layout, mode="plain", rank=rank)
        traced = cp_rank_step(cfg, seq, batch, setup, layout, mode="traced", rank=rank)[0]
    else:
        dp_rank = None if rank is None else rank // layout.tp
        step, st, act = rank_step(cfg, seq, batch, setup, layout, mode="plain", rank=dp_rank)
        traced = rank_step(cfg, seq, batch, setup, layout, mode="traced", rank=dp_rank)[0]
    if layout.cp > 1:  # (also where the replay models no step: the CP refusals, ``context_parallel.check``)
        from .context_parallel import cp_rank_flops, rank_collectives

        flops = cp_rank_flops(cfg, seq, batch, setup, layout, st.rank)
        collectives = rank_collectives(cfg, seq, batch, setup, layout, st.rank)
    else:
        flops = rank_flops(cfg, seq, batch, setup, layout, st.rank, stage)
        collectives = step_collectives(cfg, seq, batch, setup, layout, rank=st.rank, stage=stage or 0)
    return ParallelMemory(
        cfg,
        seq,
        batch,
        setup,
        layout,
        st,
        act,
        step,
        traced,
        flops,
        tuple(collectives),
        as_budget(budget, allowance),
        not missing and peaks_exact(setup, layout.flat_cp(), cfg),  # CP: its flattened rank's, the ring replayed
        stage,
        not_modelled=tuple(missing),
    )


def not_modelled(cfg: ModelConfig, seq: int, setup: TrainingSetup, layout: ParallelLayout | None = None) -> list[str]:
    """What the per-rank step replay leaves out: the single-GPU replay's gaps (``replay_unsupported``,
    as ``memory`` reports them); every layout the replay runs is modelled.  (A mixture of experts under
    FSDP2's bf16 MixedPrecisionPolicy is replayed, expert parallel included: the bf16 model with the
    routing and the weighted sum in fp32 and the sum cast back to the bf16 residual stream,
    ``replay._moe_mixed``; the EP rank's dispatch and combine, ``replay._ep_routed_forward``, carry the
    bf16 rows.)  torchtitan's per-op checkpointing (``--checkpoint op``) is the op library's course program's
    (``ops.data_parallel``): its gaps, and under ``layout`` any parallelism but data parallel."""
    if setup.checkpoint != "op":
        return replay_unsupported(cfg, setup)  # without seq: one micro-batch needs no lines in B (any MoE split)
    from .ops import unsupported
    from .ops.data_parallel import op_layout_unmodelled

    why = None if layout is None else op_layout_unmodelled(layout)
    return ([why] if why else []) + unsupported(cfg, setup, "course")


PER_GPU_KEYS = (
    "parameters", "gradients", "optimizer_state", "ddp_buckets", "fsdp_unsharded_all_units",
    "fsdp_largest_unit_unsharded", "saved_activations",
)  # fmt: skip
"""The JSON ``per_gpu`` object's keys (None under an implementation other than course)."""
IMPL_RANK_DEVICES = ("meta", "cpu")


def implementation_rank(
    cfg: ModelConfig,
    seq: int,
    batch: int,
    setup: TrainingSetup,
    layout: ParallelLayout,
    impl: str,
    budget: MemoryBudget,
    rank: int | None = None,
    device: str = "meta",
    find_unused: bool | None = None,
) -> ParallelMemory:
    """Rank 0 (the worst: every FSDP2 chunk full) of an FSDP2 or DDP data-parallel job over ``impl``'s model
    (``ops.predict_step(..., layout=layout)``): the step the storage tracker sees on ``device`` (meta: the
    fake-PG job's FakeTensors, CPU kernel facts), the plain CUDA run not being ported under a layout.  The
    model states are our model's rules, not checked for this model: left out (None); the collectives are DDP's
    bucket all-reduces (``ops.ddp.Replicate.all_reduces``: the rebuilt buckets of every step after the first) and
    ZeRO-1's broadcasts of the updated parameters, none listed under FSDP2; ``find_unused``: DDP's
    ``find_unused_parameters`` (None: the HF Trainer's, ``ops.ddp.trainer_find_unused``), whose used-parameter map
    is all-reduced too.  Any layout or setup the op library refuses is one ``AccountingError`` line."""
    from .ops import predict_step
    from .ops.ddp import Replicate, trainer_find_unused

    check_implementation_rank(impl, rank, device)
    find_unused = trainer_find_unused(setup) if find_unused is None else find_unused
    try:
        rep = None if layout.fsdp or layout.tp > 1 else Replicate(layout, find_unused=find_unused)
        step = predict_step(
            cfg, seq, setup, impl=impl, batch=batch, layout=layout, mode="traced", device=device, replicate=rep
        )
    except ValueError as e:
        raise AccountingError(f"--impl {impl} under {layout.label}: {e}") from None
    st = model_states(cfg, setup, layout, rank=0)  # for rank_flops and the worst rank's index only
    flops = rank_flops(cfg, seq, batch, setup, layout, 0, None)
    comms: tuple[Collective, ...] = tp_collectives(cfg, seq, batch, setup, layout) if layout.tp > 1 else ()
    if rep is not None:
        maps = rep.map_all_reduces()
        buckets = rep.all_reduces(first_step=False)[: -len(maps) or None]
        rule = "gradient buckets (1 MiB, then 25 MiB; the first step: one per dtype), Σ n·e"
        comms = (Collective("all_reduce", "backward", "dp", len(buckets), sum(buckets), rule),)
        if maps:  # find_unused_parameters: local_used_map_dev_, an int32 per parameter tensor
            rule = "used-parameter map (find_unused_parameters), 4 bytes a parameter tensor"
            comms += (Collective("all_reduce", "backward", "dp", len(maps), sum(maps), rule),)
        if layout.zero == 1:  # ZeroRedundancyOptimizer: every tensor from its owner, in place
            sizes = rep.param_bytes
            comms += (Collective("broadcast", "optimizer_step", "dp", len(sizes), sum(sizes), "updated parameters"),)
    return ParallelMemory(
        cfg, seq, batch, setup, layout, st, None, None, step.at(batch), flops, comms, budget, True, impl=impl,
        device=device,
    )  # fmt: skip


def tp_collectives(
    cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup, layout: ParallelLayout
) -> tuple[Collective, ...]:
    """transformers' TP plan's collectives (``ops.tp.collectives``), summed per kind and phase."""
    from .ops.tp import collectives

    totals: dict[tuple[str, str], list[int]] = {}
    for kind, nbytes, phase in collectives(cfg, seq, batch, setup, layout):
        entry = totals.setdefault((kind, phase), [0, 0])
        entry[0], entry[1] = entry[0] + 1, entry[1] + nbytes
    rule = "transformers' TP plan (ops.tp rules 2, 3)"
    return tuple(Collective(k, ph, "tp", n, b, rule) for (k, ph), (n, b) in totals.items())


def check_implementation_rank(impl: str, rank: int | None, device: str) -> None:
    """Refuse (one line) what ``implementation_rank`` cannot answer whatever the layout: a rank other than 0,
    a device other than meta or cpu (the op library's own layout refusals come with its prediction)."""
    if rank not in (None, 0):
        raise AccountingError(f"--impl {impl} under a layout predicts rank 0 (the worst) only, not --rank {rank}")
    if device not in IMPL_RANK_DEVICES:
        raise AccountingError(f"--impl {impl} under a layout is traced and measured on meta or cpu, not {device}")
