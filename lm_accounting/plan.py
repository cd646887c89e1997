"""``plan``: which parallel layout trains this model on N GPUs, and how long it takes.  No torch.

Candidates: every GPU count W in the range that is a power of two (and the range's ends), every
tp in {1, 2, 4, 8} (within one 8-GPU node, dividing the heads, kv heads and d_ff), pp a power of
two up to 16 and the layers (Llama 3 405B's 16 stages), under pp virtual stages v (interleaved 1F1B)
1 or a power of two whose pp·v stages divide the layers or, up to v = 4, have a block each (uneven: the first L mod pp·v
one block more), dp = W / (tp·pp), ZeRO stage 0–3, sequence parallel with tp, vocab parallel
with tp (an untied model; torchtitan's loss-parallel head), checkpointing none/full/selective,
micro-batch b a power of two dividing the sequences per data-parallel rank; and HSDP (ZeRO 2 or 3 over a
replicate × shard mesh, ``layout``; torchtitan's dp_replicate × dp_shard) with its shard group inside one node
(shard a power of two, 2 <= shard, shard·tp <= 8) and at least two replicas, without pp, beside ep when ep divides
the shard (torchtitan's MoE mesh: the ep ranks and the expert units' shard group inside the node); and context
parallel from ``MIN_CP_CONTEXT`` positions up: cp a power of two up to ``MAX_CP`` that ``parallelisms.cp`` takes (S a
multiple of 2·cp; a dense model without MLA), dp = W / (tp·pp·cp), ZeRO over the dp·cp ranks, beside the degrees CP
takes (``parallelisms.cp.BESIDE`` names those it does not; HSDP too, torchtitan's dp_replicate × dp_shard × cp:
dp_shard 1 as well, FSDP2 over its dp_shard·cp ranks) and with no or full checkpointing (``_families``,
``_context_setups``: what CP refuses is not enumerated).
Setup: fused attention (sdpa), amp-bf16, foreach AdamW.  Memory per GPU is ``analytic.parallel``
(the worst rank, plain run); a candidate fits when it is within the budget per GPU, the GPU's CUDA-reported
total less the allowance (``gpus.memory_budget``, the rule of ``memory`` and ``infer`` too): peak + allowance
<= CUDA total.

Order of work: every candidate's step time (below) is computed first, without its peak, and the
candidates are ranked by GPU-hours (then step time, then enumeration order); the ranking is read lazily
(``_by_gpu_hours``): every candidate's compute (step 1) is priced, and compute · GPUs, a lower bound of
its GPU-hours, orders the pricing of the communication (steps 2-4), which stops once the candidates
read are known to come first (Llama-3.1-70B over 8..1024 GPUs: 11,499 of 50,976 priced whole; the
order is the full sort's, tests/test_plan_speed.py).  They are then checked
against the GPU in that order until ``top`` fit: the result is the first ``top`` of the ranking of
every fitting candidate, the same as checking them all (``top`` at least their number checks all,
and only then is their number known).  A check: a candidate whose floor (``rank_floor``,
``stage_floor``: its model states, receive buffers and saved activations, lower bounds of the peak)
already exceeds the GPU is not replayed, nor is a larger micro-batch of a layout and checkpointing
whose smaller one does not fit (the peak grows with b; not under interleaved 1F1B, whose peak can fall as
b grows: fewer micro-batches, another order); the rest are replayed, a pipeline's stages or ranks (rank 0
first) only until one is above the GPU (its peak a lower bound of the worst, a floor too).  Where nothing fits,
the floored candidates that might hold the smallest need are replayed whole for the message.

Step time (one optimizer step, k = sequences per dp rank / b micro-batches):

1. compute = k · the calibrated time of one micro-batch on the busiest GPU, + its AdamW step.  A micro-batch:
   the TP-local model's forward and backward at micro-batch b and the checkpointing, priced op by op on the
   GPU's table (``analytic.step_time``: GEMMs at their measured rates, so deep TP's small GEMMs are slower;
   fused attention; memory-bound kernels; a GPU without a table of its own: the H100's, scaled by the two
   GPUs' dense peaks and HBM bandwidths, and said so), scaled by the busiest rank's share of that model's
   hardware FLOPs (under sequence parallel the d_model-wide activations' memory-bound bytes at S/tp:
   ``analytic.step_time`` (6); ``rank_flops``: the LM head's Vl rows under vocab parallel, the busiest expert-parallel
   rank's experts; under pp the busiest stage, stage 0 with the most blocks or the last with the LM head;
   1 otherwise); the 1F1B bubble multiplies it by (k + pp − 1) / k; with v virtual stages (interleaved
   1F1B) the busiest pipeline rank's v chunks, and (k·v + pp − 1) / (k·v) (``analytic.pipeline.pipeline_slots``;
   Narayanan et al. 2021, §2.2.2), its point-to-point transfers v times a 1F1B rank's (collectives rule 11).  AdamW: (4) of ``analytic.step_time``
   over the TP-local model's parameters, a pp-th of them under pp and a dp-th under ZeRO 1-3 (HSDP: a
   shard-th; the states taken as split evenly).  The program is recorded once per (TP degree, checkpointing), its records lines
   in b, and priced at every b (``step_time.program``): a plan of thousands of candidates walks a dozen
   programs (about 25 ms each).  ``--efficiency`` e divides this compute (the calibrated part; not the
   collectives, priced at the datasheet's links);
2. TP/SP collectives (per micro-batch, on the critical path, NOT overlapped): wire bytes / the
   GPU's NVLink bandwidth one way;
3. data-parallel collectives: FSDP2 all-gathers per micro-batch, gradient reduction (reduce-scatter
   or all-reduce) once per step (accumulation without sync), wire bytes / the group's ring bus bandwidth
   (``ring_bandwidth``: NVLink within one node; across nodes NCCL's rings, one per NIC, give the
   group's ranks on a node times ``--interconnect-bw`` (default 50 GB/s per GPU, one 400 Gb/s InfiniBand NIC
   per GPU), at most NVLink; pipeline point-to-point: NVLink within one node, W <= 8, else one NIC).
   HSDP (collectives rule 12): the shard group's all-gathers and reduce-scatters (its shard·tp ranks are
   consecutive) and each unit's all-reduce across the replicas (ranks shard·tp apart), each over its own ring,
   one after the other.  ASSUMED fully overlapped with compute: step = max(compute, dp comm) + tp comm + ep comm + pp point-to-point.  Under pp a stage's data-parallel collectives and
   point-to-point transfers are counted per step (collectives rules 8 and 9: FSDP2 gathers as often as
   the 1F1B order finds the units sharded), each the busiest stage's (0, a middle one, the last);
4. expert parallel's all-to-alls (dispatch and combine per MoE layer, per micro-batch, on the
   critical path like TP's): wire bytes / NVLink when the ep group fits one node (its ranks are
   consecutive), else ``--interconnect-bw``; the expert units' FSDP2 collectives run over the dp/ep
   ranks (rule 3); under HSDP over the shard group's s/ep ranks holding the same experts, then all-reduced
   across the replicas (``parallelisms.group_ranks``: "dp_shard/ep", "dp_replicate").
5. context parallel (``_cp_estimate``): the flattened dp·cp layout's step at S/cp positions by 1-3, its attention
   cp times, plus the cp ring's collectives (rule 13) in the tensor-parallel slot, not overlapped.

Training: steps = tokens / global batch tokens; tokens/s, days, GPU-hours = W · hours, cost.

A mixture of experts is planned over data- and expert-parallel layouts (tp = pp = 1,
``layout.check``; ep a power of two dividing dp and E, under FSDP2); its FSDP2 steps under amp-bf16
are replayed as they run (the bf16 model, the routing and the weighted sum in fp32, the sum cast back
to bf16: ``analytic.replay._moe_mixed``), expert parallel included (the EP rank's dispatch and
combine, ``analytic.replay._ep_routed_forward``): every such peak is exact.  Latent attention (MLA) is
refused: the replay does not model it.
"""

from __future__ import annotations

import functools
import gc
import heapq
from dataclasses import dataclass
from typing import Any, ClassVar

from .analytic.collectives import (
    data_parallel_collectives,
    pipeline_collectives,
    sharded_passes,
    tensor_parallel_parts,
    wire_bytes,
)
from .analytic.hardware_flops import step_flops
from .analytic.ops.data_parallel import op_layout_unmodelled
from .analytic.parallel import local_config, peaks_exact, rank_floor, rank_flops, rank_step
from .analytic.parallel_report import not_modelled
from .analytic.params import parameter_breakdown
from .analytic.pipeline import pipeline_slots, pipeline_stages, stage_floor
from .analytic.step_time import check_precision, load, optimizer_seconds, program
from .config import AccountingError, ModelConfig
from .gpus import DEFAULT_ALLOWANCE, GPU, MemoryBudget, gpu, memory_budget
from .layout import ParallelLayout
from .parallelisms import group_ranks
from .result import Result
from .setup import CHECKPOINTS, TrainingSetup
from .units import fmt_bytes

PLANNED_CHECKPOINTS = CHECKPOINTS
"""The checkpointings plan searches; ``op`` (torchtitan's per-op SAC) only under data parallel alone, where the op
library's course program prices it (``analytic.ops.data_parallel``)."""

GPUS_PER_NODE = 8
MAX_PP = 16  # pipeline stages tried: 1, 2, 4, 8, 16
DEFAULT_INTERNODE = 50 * 10**9  # bytes/s per GPU: one 400 Gb/s NIC per GPU (DGX H100: 8 × ConnectX-7)
SECONDS_PER_HOUR = 3600


@dataclass(frozen=True)
class Candidate:
    layout: ParallelLayout
    checkpoint: str
    micro_batch: int
    accumulation: int  # micro-batches per optimizer step per data-parallel rank
    per_gpu: int  # peak bytes + allowance (fits when <= the GPU's CUDA total)
    compute_s: float
    dp_comm_s: float
    tp_comm_s: float
    pp_comm_s: float
    ep_comm_s: float
    peak_exact: bool  # the per-GPU peak is byte-exact against the fake-PG job (else an estimate)
    estimate: StepEstimate | None = None  # the step's breakdown, MFU and HFU (``_Pricing.estimate``)

    @property
    def step_s(self) -> float:
        return step_seconds(self.compute_s, self.dp_comm_s, self.tp_comm_s, self.pp_comm_s, self.ep_comm_s)


def step_seconds(compute: float, dp: float, tp: float, pp: float, ep: float) -> float:
    """One step (module docstring): data-parallel collectives overlapped with compute, the rest not."""
    return max(compute, dp) + tp + ep + pp


@dataclass(frozen=True)
class StepEstimate:
    """One job's step by the module docstring's rules 1-4: the one step-time model ``plan``, ``train-time`` and
    ``memory`` (with a layout) print.  MFU: the job's model FLOPs (3 × the forward's matmuls over the global batch)
    / (step × GPUs × dense peak); HFU: the busiest GPU's hardware FLOPs (recompute included) / (step × peak)."""

    calibration: str  # the GPU and where its prices come from (``step_time.Calibration.label``)
    efficiency: float
    times: tuple[float, float, float, float, float]  # compute, data-parallel, tensor-parallel, pipeline, expert
    parts: tuple[float, float, float, float]  # the compute's GEMM, attention, other (memory-bound, AdamW), bubble
    model_flops: int  # of the whole job's step
    hardware_flops: int  # of the busiest GPU's step
    gpus: int
    peak_flops: int  # the dense peak of the compute dtype

    @property
    def step_seconds(self) -> float:
        return step_seconds(*self.times)

    @property
    def exposed_communication(self) -> float:
        return self.step_seconds - self.times[0]

    @property
    def mfu(self) -> float:
        return self.model_flops / (self.step_seconds * self.gpus * self.peak_flops)

    @property
    def hfu(self) -> float:
        return self.hardware_flops / (self.step_seconds * self.peak_flops)

    def to_dict(self) -> dict[str, Any]:
        compute, dp, tp, pp, ep = self.times
        gemm, attention, other, bubble = self.parts
        return {
            "step_seconds": self.step_seconds,
            "model_flops_per_step": self.model_flops,
            "hardware_flops_per_step": self.hardware_flops,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "efficiency": self.efficiency,
            "calibration": self.calibration,
            "breakdown": {
                "compute": {"seconds": compute, "gemm": gemm, "attention": attention, "other": other},
                "exposed_communication": self.exposed_communication,
                "bubble": bubble,
                "collectives": {"data_parallel": dp, "tensor_parallel": tp, "pipeline": pp, "expert_parallel": ep},
            },
        }


def estimate_step(
    cfg: ModelConfig,
    gpu_name: str,
    seq: int,
    micro_batch: int,
    setup: TrainingSetup,
    layout: ParallelLayout,
    *,
    efficiency: float = 1.0,
    internode_bw: int = DEFAULT_INTERNODE,
    impl: str = "course",
) -> StepEstimate:
    """One step of ``layout`` (its ``micro_batches`` of ``micro_batch`` sequences per data-parallel rank; one GPU:
    ``ParallelLayout()``) priced as ``plan`` prices every candidate, with ``impl``'s program (``plan``: course)."""
    check_efficiency(efficiency)
    check_precision(load(gpu(gpu_name).name), setup)
    if layout.cp > 1:
        return _cp_estimate(cfg, gpu(gpu_name), seq, micro_batch, setup, layout, efficiency, internode_bw, impl)
    pricing = _Pricing(cfg, seq, gpu(gpu_name), efficiency, internode_bw, impl)
    return pricing.estimate(micro_batch, setup, layout, pricing.step_times(micro_batch, setup, layout))


def _cp_estimate(cfg, g, seq, b, setup, layout, efficiency, internode_bw, impl, pricing=None) -> StepEstimate:
    """A context-parallel step (``analytic.context_parallel``): the flattened dp·cp layout's step at s = S/cp
    positions, its attention cp times (the ring runs the causal kernel on s queries against S keys, cp times the
    s-position kernel's work), plus the cp ring's collectives (rule 13), not overlapped, over the cp ranks' ring
    (``ring_bandwidth``: tp apart); they take the tensor-parallel slot of ``times``, added to TP's own collectives.
    MFU's model FLOPs are the job's at S; HFU's the rank's (``cp_rank_flops``).  ``pricing``: a ``_Pricing`` at s
    to reuse (``plan``'s search shares one per cp degree), else a new one."""
    from .analytic.collectives import wire_bytes
    from .analytic.context_parallel import check, cp_collectives, cp_rank_flops

    s, cp, flat = check(cfg, seq, setup, layout), layout.cp, layout.flat_cp()
    pricing, k = pricing or _Pricing(cfg, s, g, efficiency, internode_bw, impl), flat.micro_batches
    compute, dp, tp, pp, ep = pricing.step_times(b, setup, flat)
    gemm, attention, bound = (k * x for x in pricing.micro_batch(b, setup, flat))
    compute += (cp - 1) * attention
    ring = sum(wire_bytes(c, cp) for c in cp_collectives(cfg, seq, b, setup, layout)) * k
    tp += _seconds(ring, ring_bandwidth(cp, layout.tp, g.interconnect_one_way, internode_bw))
    opt = pricing.optimizer(setup, flat)
    parts = (gemm, cp * attention, bound + opt, max(0.0, compute - gemm - cp * attention - bound - opt))
    model = step_flops(cfg, seq).model * b * k * layout.dp
    hardware = cp_rank_flops(cfg, seq, b, setup, layout).hardware * k
    peak = g.peak_flops("fp32" if setup.precision == "fp32" else "bf16")
    return StepEstimate(
        pricing.cal.label, efficiency, (compute, dp, tp, pp, ep), parts, model, hardware, layout.world, peak
    )


MIN_EFFICIENCY = 0.001
"""Below it a step is over 1,000 times slower than calibrated: refused (a denormal one overflowed to nan)."""


def check_efficiency(efficiency: float) -> None:
    """``--efficiency``: in (0, 1.5], and at least ``MIN_EFFICIENCY``; else one line."""
    if not 0 < efficiency <= 1.5:
        raise AccountingError(f"--efficiency must be in (0, 1.5], got {efficiency}")
    if efficiency < MIN_EFFICIENCY:
        raise AccountingError(f"--efficiency must be in (0, 1.5] and at least {MIN_EFFICIENCY}, got {efficiency}")


def price_layout(
    cfg: ModelConfig,
    gpu_name: str,
    seq: int,
    micro_batch: int,
    setup: TrainingSetup,
    layout: ParallelLayout,
    *,
    efficiency: float = 1.0,
    internode_bw: int = DEFAULT_INTERNODE,
) -> tuple[float, float, float, float, float]:
    """(compute, data-parallel, tensor-parallel, pipeline, expert-parallel) seconds of one step of ``layout``
    (its ``micro_batches`` of ``micro_batch`` sequences per data-parallel rank) by the module docstring's rules
    1–4, as ``plan`` prices every candidate; no memory check (a published run that ran is priced as it ran).
    Context parallel: ``_cp_estimate``'s."""
    if layout.cp > 1:
        return _cp_estimate(
            cfg, gpu(gpu_name), seq, micro_batch, setup, layout, efficiency, internode_bw, "course"
        ).times
    return _Pricing(cfg, seq, gpu(gpu_name), efficiency, internode_bw).step_times(micro_batch, setup, layout)


@dataclass(frozen=True)
class Plan(Result):
    SCHEMA: ClassVar[str] = "lm-accounting/plan/7"

    config: ModelConfig
    gpu: GPU
    seq: int
    global_batch_tokens: int
    tokens: int
    efficiency: float
    internode_bw: int
    budget_basis: MemoryBudget  # the GPU's CUDA total less the allowance
    price_per_gpu_hour: float | None
    evaluated: int  # candidate layouts, each with its step time
    checked: int  # candidates checked against the GPU, best first, until ``top`` fit
    ranked: tuple[Candidate, ...]  # the best ``top`` fitting candidates (fewest GPU-hours first)
    top: int = 10
    own: str | None = None  # the user's own layout, priced alone (``OwnLayout.describe``); None: every candidate
    fastest: tuple[Candidate, ...] = ()  # the fastest fitting candidate at each GPU count (none with ``own``)

    @property
    def calibration(self) -> str:
        return load(self.gpu.name).label

    @property
    def allowance(self) -> int:
        return self.budget_basis.allowance

    @property
    def complete(self) -> bool:
        """Whether every candidate was checked: then ``ranked`` holds every one that fits."""
        return self.checked == self.evaluated

    def steps(self) -> int:
        return -(-self.tokens // self.global_batch_tokens)

    def row(self, c: Candidate) -> dict[str, Any]:
        hours = self.steps() * c.step_s / SECONDS_PER_HOUR
        gpu_hours = hours * c.layout.world
        return {
            "layout": c.layout.label,
            "gpus": c.layout.world,
            "checkpoint": c.checkpoint,
            "micro_batch": c.micro_batch,
            "accumulation": c.accumulation,
            "per_gpu_bytes": c.per_gpu,
            "peak_exact": c.peak_exact,
            **c.estimate.to_dict(),
            "compute_seconds": c.compute_s,
            "dp_comm_seconds": c.dp_comm_s,
            "tp_comm_seconds": c.tp_comm_s,
            "ep_comm_seconds": c.ep_comm_s,
            "tokens_per_s": self.global_batch_tokens / c.step_s,
            "days": hours / 24,
            "gpu_hours": gpu_hours,
            "cost": None if self.price_per_gpu_hour is None else gpu_hours * self.price_per_gpu_hour,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.SCHEMA,
            "model": self.config.name,
            "config": self.config.resolved(),
            "gpu": self.gpu.name,
            "context": self.seq,
            "global_batch_tokens": self.global_batch_tokens,
            "tokens": self.tokens,
            "steps": self.steps(),
            "efficiency": self.efficiency,
            "calibration": self.calibration,
            "internode_bytes_per_s": self.internode_bw,
            "nvlink_bytes_per_s_one_way": self.gpu.interconnect_one_way,
            "allowance": self.allowance,
            "budget_basis": self.budget_basis.to_dict(),
            "price_per_gpu_hour": self.price_per_gpu_hour,
            "candidates_evaluated": self.evaluated,
            "candidates_checked": self.checked,
            "candidates_fitting": len(self.ranked) if self.complete else None,
            "own_layout": self.own,
            "best": [self.row(c) for c in self.ranked],
            "fastest_per_gpu_count": [
                {**self.row(c), "frontier": on} for c, on in zip(self.fastest, frontier(self.fastest), strict=True)
            ],
            "assumptions": __doc__.split("Step time", 1)[1].strip(),
        }

    def records(self) -> list[dict[str, Any]]:
        """CSV rows: the ranked layouts, each naming the model, GPU and context (CSVs concatenate)."""
        point = {"model": self.config.name, "gpu": self.gpu.name, "context": self.seq}
        return [{**point, **self.row(c)} for c in self.ranked]


def _powers(lo: int, hi: int) -> list[int]:
    out, p = {lo, hi}, 1
    while p <= hi:
        if p >= lo:
            out.add(p)
        p *= 2
    return sorted(out)


def ring_bandwidth(ranks: int, stride: int, nvlink: float, nic: float) -> float:
    """Step 3's bus bandwidth (bytes/s) of a ring collective (NCCL's all-gather, reduce-scatter and all-reduce)
    over ``ranks`` ranks ``stride`` global ranks apart, on nodes of ``GPUS_PER_NODE`` GPUs with one ``nic`` each
    (rail-optimised, DGX H100):

    1. within one node (ranks · stride <= the node): ``nvlink`` one way;
    2. across nodes NCCL runs one ring per NIC; each ring's link between two nodes carries (n − 1)/n of that
       ring's share, so the collective takes wire bytes / (the NICs the group has on a node · ``nic``): the
       group's min(ranks, node / stride) ranks on a node each bring their own; NVLink caps it.
       Measured: 4 nodes × 8 H100 with 8 × 400 Gb/s NICs, all-reduce bus bandwidth 365.84 GB/s
       (https://github.com/NVIDIA/nccl-tests/issues/309), against NVIDIA's 46-48 GB/s per 400 Gb/s NIC
       (https://github.com/NVIDIA/nccl-tests/issues/290).  A group with one rank per node (dp beside tp 8)
       has one NIC: ``nic``."""
    if ranks * stride <= GPUS_PER_NODE:
        return nvlink
    return min(nvlink, max(1, min(ranks, GPUS_PER_NODE // stride)) * nic)


def _seconds(bytes_: int, bw: int) -> float:
    return bytes_ / bw if bytes_ else 0.0


def _peak(cfg, seq, b, setup, lay, stop_above: int | None = None) -> int:
    """The worst rank's plain peak; under pp, where ``stop_above`` is given, the first stage's or pipeline rank's
    peak above it instead, when one is (``pipeline_stages``: then a lower bound of the worst)."""
    if lay.cp > 1:  # the worst cp rank, its ring replayed (analytic.context_parallel)
        from .analytic.context_parallel import cp_rank_step

        return cp_rank_step(cfg, seq, b, setup, lay, mode="plain")[0].peak
    if lay.pp > 1:
        return pipeline_stages(cfg, seq, b, setup, lay, with_traced=False, stop_above=stop_above)[1].peak
    return rank_step(cfg, seq, b, setup, lay, mode="plain")[0].peak


class _Pricing:
    """One plan's step times (module docstring, steps 1–4), none needing the per-GPU peak.  Its model,
    context, attention kernel and optimizer are fixed, so each part is cached on the few fields it reads:
    thousands of candidates share them (a micro-batch's compute across dp, ZeRO and the micro-batch count; TP's
    collectives across dp, ZeRO and the micro-batch count; dp's across SP, checkpointing and, without pp, the
    micro-batch count; a micro-batch's FLOPs share across b but under expert parallel: FLOPs are linear in b).  The
    keys name every field a part reads (tests/test_plan_speed.py perturbs each layout field)."""

    def __init__(self, cfg: ModelConfig, seq: int, g: GPU, efficiency: float, internode: int, impl: str = "course"):
        self.cfg, self.seq, self.g, self.efficiency, self.internode = cfg, seq, g, efficiency, internode
        self.impl, self.cal, self.cache = impl, load(g.name), {}
        self.kernels: dict = {}  # ``Program.at``'s memo: each GEMM's and attention call's pricing at its sizes
        self.nvlink = g.interconnect_one_way

    def _get(self, key, build, *args):
        got = self.cache.get(key)
        if got is None:
            got = self.cache[key] = build(*args)
        return got

    def step_times(self, b, setup, lay) -> tuple[float, float, float, float, float]:
        """(compute, data-parallel, tensor-parallel, pipeline, expert-parallel) seconds of one step."""
        return (self.compute(b, setup, lay), *self.communication(b, setup, lay))

    def compute(self, b, setup, lay) -> float:
        """Step 1: the busiest GPU's micro-batches, the bubble's slots, and its AdamW step.  One micro-batch's
        seconds and the whole AdamW step are cached on the fields they read (thousands of candidates differ only in
        dp, ZeRO or the micro-batch count, which the slots and AdamW's share read: two operations per candidate)."""
        key = (
            "compute", b, setup, lay.tp, lay.vocab_parallel, lay.pp, lay.ep, lay.virtual_stages,
            lay.sequence_parallel,  # SP's norms and residual adds at S/tp (step_time 6)
        )  # fmt: skip
        if (got := self.cache.get(key)) is None:
            got = self.cache[key] = (sum(self.micro_batch(b, setup, lay)), self._adamw(setup, lay))
        slots = pipeline_slots(lay.micro_batches, lay.pp, lay.virtual_stages)  # the bubble
        return got[0] * slots + self._adamw_share(got[1], lay)

    def communication(self, b, setup, lay) -> tuple[float, float, float, float]:
        """Steps 2-4: (data-parallel, tensor-parallel, pipeline, expert-parallel) seconds of one step."""
        dp, tp, pp, ep = self._wire(b, setup, lay)
        nvlink, internode = self.nvlink, self.internode
        p2p = nvlink if lay.world <= GPUS_PER_NODE else internode  # one GPU's NIC (step 3)
        ep_link = nvlink if lay.ep <= GPUS_PER_NODE else internode  # an ep group: consecutive ranks
        # ``_seconds`` of each, inline (one call per candidate priced)
        return dp, tp / nvlink if tp else 0.0, pp / p2p if pp else 0.0, ep / ep_link if ep else 0.0

    def estimate(self, b, setup, lay, times) -> StepEstimate:
        """The ``StepEstimate`` of a candidate whose ``step_times`` are ``times``."""
        k, opt = lay.micro_batches, self.optimizer(setup, lay)
        gemm, attention, bound = (k * x for x in self.micro_batch(b, setup, lay))
        parts = (gemm, attention, bound + opt, max(0.0, times[0] - gemm - attention - bound - opt))
        model = step_flops(self.cfg, self.seq).model * b * k * lay.dp
        peak = self.g.peak_flops("fp32" if setup.precision == "fp32" else "bf16")
        hardware = self.gpu_flops(b, setup, lay)
        return StepEstimate(self.cal.label, self.efficiency, times, parts, model, hardware, lay.world, peak)

    def gpu_flops(self, b, setup, lay) -> int:
        """Hardware FLOPs of one step on the busiest GPU: its k micro-batches (the bubble idles, runs nothing)."""
        key = ("flops", b, setup.precision, setup.checkpoint, lay.tp, lay.vocab_parallel, lay.pp, lay.ep)
        key += (lay.virtual_stages,)
        return self._get(key, self._micro_batch_flops, b, setup, lay) * lay.micro_batches

    def micro_batch(self, b, setup, lay) -> tuple[float, float, float]:
        """Step 1: (GEMM, attention, memory-bound) seconds of one micro-batch on the busiest GPU, / efficiency."""
        key = ("time", b, setup.precision, setup.checkpoint, lay.tp, lay.vocab_parallel, lay.pp, lay.ep)
        key += (lay.virtual_stages,)
        full = key + (lay.sequence_parallel,)  # SP prices the hidden-wide activations at S/tp (step_time 6)
        if (got := self.cache.get(full)) is None:
            got = self.cache[full] = self._micro_batch_time(key, b, setup, lay)
        return got

    def _micro_batch_time(self, key, b, setup, lay) -> tuple[float, float, float]:
        local = local_config(self.cfg, lay)
        prog = self._program(local, setup)
        shards = lay.tp if lay.sequence_parallel else 1  # step_time (6): the hidden-wide activations at S/tp
        phases = self._get(("priced", b, setup, lay.tp, shards), lambda: prog.at(b, self.cal, shards, self.kernels)[0])
        whole = self._get(("local flops", setup, lay.tp), lambda: step_flops(local, self.seq, 1, setup).hardware)
        # FLOPs are linear in b (tests/test_plan_speed.py), so the share is b = 1's, the same float: b·f / (b·w) and
        # f / w are one real number, correctly rounded; but expert parallel's busiest rank (ceil of split rows)
        one = b if lay.ep > 1 else 1
        share = self._get(("flops", one, *key[2:]), self._micro_batch_flops, one, setup, lay) / (whole * one)
        scale = share / self.efficiency
        return tuple(
            scale * (getattr(phases[1], f) + getattr(phases[2], f)) for f in ("gemm", "attention", "memory_bound")
        )

    def _program(self, local, setup):
        """``step_time.program`` (cached there), refused in one line where the op library cannot run it."""
        try:
            return program(local, self.seq, setup, self.impl)
        except ValueError as err:
            raise AccountingError(f"the step-time model cannot price {self.cfg.name}'s step: {err}") from None

    def optimizer(self, setup, lay) -> float:
        """Step 1's AdamW step on the busiest GPU, / efficiency: over the TP-local model's parameters (its program's
        ``exp_avg`` bytes), a pp-th of them under pp and a dp-th under ZeRO 1-3 (HSDP: a shard-th; the states split
        evenly)."""
        return self._adamw_share(self._adamw(setup, lay), lay)

    def _adamw(self, setup, lay) -> float:
        """The TP-local model's whole AdamW step (calibrated seconds)."""
        key = ("adamw", setup, lay.tp)
        if (whole := self.cache.get(key)) is None:
            param_bytes = self._program(local_config(self.cfg, lay), setup).param_bytes
            whole = self.cache[key] = optimizer_seconds(param_bytes, setup, self.cal)
        return whole

    def _adamw_share(self, whole: float, lay) -> float:
        """The busiest GPU's share of the ``whole`` AdamW step, / efficiency."""
        return whole / (lay.pp * (lay.shard if lay.zero else 1)) / self.efficiency

    def _micro_batch_flops(self, b, setup, lay) -> int:
        """Step 1's FLOPs of one micro-batch (``rank_flops``: the TP-local model's, the head's Vl rows under
        vocab parallel; the busiest rank's experts under expert parallel); under pp the busiest stage's (with
        virtual stages the busiest pipeline rank's chunks'), whose k micro-batches take ``pipeline_slots``
        micro-batch slots (k + pp − 1 under 1F1B: its bubble; k without pp), the step's compute that many
        times it.  The same for every data-parallel degree."""
        v = lay.virtual_stages  # interleaved: the pipeline rank's chunks
        one = ParallelLayout(
            tp=lay.tp, vocab_parallel=lay.vocab_parallel, pp=lay.pp, micro_batches=lay.pp, virtual_stages=v
        )
        if lay.ep > 1:  # expert parallel borrows its ranks from dp, under FSDP2
            one = ParallelLayout(dp=lay.ep, zero=3, ep=lay.ep)
        stages = (0, lay.pp - 1) if lay.pp > 1 else (None,)
        ranks = range(lay.ep)  # expert parallel: the rank whose experts receive the most rows
        f = max(rank_flops(self.cfg, self.seq, b, setup, one, r, s).hardware for s in stages for r in ranks)
        return f // lay.pp

    def _wire(self, b, setup, lay) -> tuple[float, int, int, int]:
        """One step's data-parallel seconds (each group's wire bytes over its ``ring_bandwidth``) and tp, pp and ep
        wire bytes: TP and EP per micro-batch, k times; without pp
        the FSDP2 all-gathers k times and the reduction once; under pp a stage's collectives are counted
        per step (collectives rules 8–10), each group's the busiest stage's; with virtual stages the
        pipeline rank's transfers (rule 11), its dp and tp groups' those of its 1F1B stage (every v alike)."""
        k, pp, cache = lay.micro_batches, lay.pp, self.cache  # each part looked up once per candidate
        t, ep_, precision, fsdp = lay.tp, lay.ep, setup.precision, lay.zero >= 2  # ``ParallelLayout.fsdp``
        dp, tp, sent, ep = 0.0, 0, 0, 0
        if lay.dp > 1:  # they read neither sequence parallel nor the checkpointing; k (under pp m) does
            moe = (b, setup.checkpoint) if ep_ > 1 else None  # the all-to-alls read the micro-batch and the ck
            key = ("dp groups", precision, lay.dp, lay.zero, t, lay.vocab_parallel, pp, k, ep_, lay.replicate, moe)
            if (got := cache.get(key)) is None:
                got = cache[key] = self._data_parallel_groups(b, setup, lay, moe)
            dp, ep = got
        if t > 1:  # they read whether FSDP2 runs, not dp or its ZeRO stage; m scales each micro-batch's
            m = k if pp > 1 else 1  # the collectives read m under pp only
            key = ("tp groups", b, precision, setup.checkpoint, t, lay.sequence_parallel, lay.vocab_parallel, pp)
            key += (fsdp, m)
            if (tp := cache.get(key)) is None:
                tp = cache[key] = self._tensor_parallel_groups(b, setup, lay, m)
            tp *= 1 if pp > 1 else k  # TP per micro-batch; under pp the step's already
        if pp > 1:  # the busiest stage's (pipeline rank's) transfers
            key = ("pp", b, precision, t, lay.sequence_parallel, fsdp, pp, k, lay.virtual_stages)
            if (sent := cache.get(key)) is None:
                sent = cache[key] = self._pipeline_wire(b, setup, lay)
        return dp, tp, sent, ep

    def _data_parallel_groups(self, b, setup, lay, moe) -> tuple[float, int]:
        """(dp seconds, ep wire bytes) of ``_wire``: the busiest stage's, each stage's cached on the fields it
        reads (under pp m only through FSDP2's passes)."""
        k, dp, ep = lay.micro_batches, 0.0, 0
        for s in _busiest_stages(lay.pp):
            passes = sharded_passes(lay, s) if lay.pp > 1 and lay.fsdp else None  # as FSDP2's passes (rule 9)
            key = ("dp", setup.precision, lay.dp, lay.zero, lay.tp, lay.vocab_parallel, lay.pp, passes, lay.ep)
            key += (lay.replicate,)
            gathers, rest, each = self._get(key + (moe, s), self._data_parallel_wire, b, setup, lay, s)
            # without pp FSDP2 gathers at every micro-batch, and the all-to-alls run at each
            dp, ep = max(dp, (k if lay.pp == 1 else 1) * gathers + rest), max(ep, k * each)
        return dp, ep

    def _tensor_parallel_groups(self, b, setup, lay, m) -> int:
        """TP wire bytes of ``_wire`` (per micro-batch without pp, the step's under pp): the busiest stage's."""
        tp = 0
        for s in _busiest_stages(lay.pp):
            key = ("tp", b, setup.precision, setup.checkpoint, lay.tp, lay.sequence_parallel, lay.vocab_parallel)
            key += (lay.pp, lay.fsdp, s)
            tp = max(tp, self._get(key + (m,), self._tensor_parallel_wire, key, b, setup, lay, s, m))
        return tp

    def _tensor_parallel_wire(self, key, b, setup, lay, s, m) -> int:
        """Stage ``s``'s TP wire bytes: one micro-batch's collectives m times, the norms' once."""
        each, once = self._get(key, tensor_parallel_parts, self.cfg, self.seq, b, setup, lay, s)
        return sum(wire_bytes(c, lay.tp, m) for c in each) + sum(wire_bytes(c, lay.tp) for c in once)

    def _pipeline_wire(self, b, setup, lay) -> int:
        sent = lambda s: sum(wire_bytes(c, 2) for c in pipeline_collectives(self.cfg, self.seq, b, setup, lay, s))
        return max(map(sent, _busiest_stages(lay.pp)))

    def _data_parallel_wire(self, b, setup, lay, s) -> tuple[float, float, int]:
        """(all-gathers' seconds, the rest's seconds, all-to-alls' wire bytes) of stage ``s``'s data-parallel
        collectives in one step (``_group_wire`` repeats the all-gathers k times without pp, the all-to-alls k
        times).  Each group's ranks and their stride on the (pp, dp, tp) mesh come from the parallelism that runs
        it (``parallelisms.group_ranks``: a dp group's ranks tp apart, the expert units' ep·tp apart, ...)."""
        gathers = rest = 0.0
        ep, rings = 0, {}  # group -> (its ranks, its ring's bandwidth)
        for c in data_parallel_collectives(self.cfg, self.seq, b, setup, lay, False, 0, s):
            if c.group == "ep":
                ep += wire_bytes(c, lay.ep)
                continue
            if (ring := rings.get(c.group)) is None:
                ranks, stride = group_ranks(lay, c.group)  # from the parallelism that runs the group
                ring = rings[c.group] = (ranks, ring_bandwidth(ranks, stride, self.nvlink, self.internode))
            seconds = wire_bytes(c, ring[0]) / ring[1]
            if c.kind == "all_gather":
                gathers += seconds
            else:
                rest += seconds
        return gathers, rest, ep


class _CpPricing:
    """``plan``'s pricing where context parallel is searched (from ``MIN_CP_CONTEXT`` positions) or the user's own
    layout: ``_Pricing``'s for a layout without context parallel, ``_cp_estimate``'s
    step for a CP one (cached per (micro-batch, setup, layout)), one ``_Pricing`` at S/cp per cp degree shared by its
    candidates, behind ``_Pricing``'s methods that ``plan`` calls (``_Pricing``'s caches do not read cp)."""

    def __init__(self, cfg: ModelConfig, seq: int, g: GPU, efficiency: float, internode: int):
        self.args, self.cache = (cfg, g, seq), {}
        self.efficiency, self.internode = efficiency, internode
        self.base, self.at = _Pricing(cfg, seq, g, efficiency, internode), {}  # cp -> its _Pricing at S/cp

    def _estimate(self, b, setup, lay) -> StepEstimate:
        key = (b, setup, lay)
        if key not in self.cache:
            cfg, g, seq = self.args
            if lay.cp not in self.at:
                self.at[lay.cp] = _Pricing(cfg, seq // lay.cp, g, self.efficiency, self.internode)
            at = self.at[lay.cp]
            self.cache[key] = _cp_estimate(cfg, g, seq, b, setup, lay, self.efficiency, self.internode, "course", at)
        return self.cache[key]

    def compute(self, b, setup, lay) -> float:
        return self.base.compute(b, setup, lay) if lay.cp == 1 else self._estimate(b, setup, lay).times[0]

    def communication(self, b, setup, lay) -> tuple[float, float, float, float]:
        return self.base.communication(b, setup, lay) if lay.cp == 1 else self._estimate(b, setup, lay).times[1:]

    def estimate(self, b, setup, lay, times) -> StepEstimate:
        return self.base.estimate(b, setup, lay, times) if lay.cp == 1 else self._estimate(b, setup, lay)


def _busiest_stages(pp: int) -> list[int]:
    """The stages whose collectives ``_Pricing._wire`` compares: the first, a middle one (two pipeline
    neighbours) and the last."""
    return sorted({0, min(1, pp - 1), pp - 1})


def _by_gpu_hours(pending: list, pricing: _Pricing | _CpPricing):
    """``plan``'s candidates, each ``pending`` as (compute · GPUs, enumeration index, b, setup, layout, compute),
    yielded as (GPU-hours, step, index, b, setup, layout, step times) in the order of (GPU-hours, step time,
    enumeration order), the communication (steps 2-4) priced only as far as that order is read.  Compute · GPUs
    is a lower bound of the GPU-hours (per step: step = max(compute, dp) + tp + ep + pp >= compute, all >= 0),
    so once the best priced candidate is below the next bound no candidate left can come before it."""
    pending.sort()  # by the bound, then the index (unique: nothing after it is compared)
    priced: list = []  # a heap, by (GPU-hours, step, index)
    for bound, i, b, setup, lay, compute in pending:
        while priced and priced[0][0] < bound:
            yield heapq.heappop(priced)
        times = (compute, *pricing.communication(b, setup, lay))
        step = step_seconds(*times)
        heapq.heappush(priced, (step * lay.world, step, i, b, setup, lay, times))
    while priced:
        yield heapq.heappop(priced)


def _need(cfg, seq, b, setup, lay, g: GPU, allowance, exact: bool = False) -> tuple[int, bool]:
    """(the per-GPU need, peak + allowance, whether it is exact).  A layout whose floor (``stage_floor``,
    ``rank_floor``: lower bounds of the peak) already exceeds the GPU is not replayed unless ``exact``:
    its need is then that floor (interleaved: the first pipeline rank's alone where it exceeds the GPU).  Nor,
    unless ``exact``, are a pipeline's stages or ranks after the first whose peak exceeds the GPU (``_peak``'s
    ``stop_above``): its need is then that one's, a lower bound too."""
    if exact:
        return _peak(cfg, seq, b, setup, lay) + allowance, True
    # CP: the flattened rank's floor at S/cp (its peak is at most the CP rank's: tests/test_cp.py)
    flat, s = lay.flat_cp(), seq // lay.cp
    budget = g.cuda_total - allowance
    floor = stage_floor(cfg, s, b, setup, flat, budget) if flat.pp > 1 else rank_floor(cfg, s, b, setup, flat)
    if floor > budget:
        return floor + allowance, False
    need = _peak(cfg, seq, b, setup, lay, stop_above=budget) + allowance
    return need, need <= g.cuda_total or lay.pp == 1 or lay.cp > 1


def check_plan(
    cfg: ModelConfig,
    gpu_name: str,
    seq: int,
    global_batch_tokens: int,
    *,
    efficiency: float = 1.0,
    allowance: int | None = None,
    top: int = 10,
) -> MemoryBudget:
    """Every refusal of ``plan``, before any work; returns the budget per GPU (``gpus.memory_budget``)."""
    basis = memory_budget(gpu_name, allowance)
    _check_plannable(cfg)
    if top < 1:
        raise AccountingError(f"top must be at least 1, got {top}")
    check_efficiency(efficiency)
    # a GPU lacking a figure the step-time model needs, or bf16 (plan trains in amp-bf16): one line
    check_precision(load(basis.gpu.name), TrainingSetup(precision="amp-bf16"))
    if global_batch_tokens % seq:
        lower = global_batch_tokens // seq * seq
        near = f"{lower:,} or {lower + seq:,}" if lower else f"{seq:,}"
        raise AccountingError(
            f"the global batch of {global_batch_tokens:,} tokens is not a whole number of {seq:,}-token sequences: "
            f"give --global-batch-tokens {near}, or a --context that divides it"
        )
    return basis


def without_cycle_collector(fn):
    """``fn`` run with Python's cyclic garbage collector off (restored after): a plan keeps ~10^5 acyclic objects
    alive (its candidates, their layouts, the pricing caches' keys), which each of the collector's full passes
    walked (0.2-0.3 s of plan-70b's ~2.2 s CPU, ``benchmarks/bench_cli.py``; its output is the same: the replays
    free by reference counts).  Whatever cyclic garbage it leaves (about 4 MB on plan-70b) is collected later."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        if not gc.isenabled():
            return fn(*args, **kwargs)
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            gc.enable()

    return run


@without_cycle_collector
def plan(
    cfg: ModelConfig,
    gpu_name: str,
    gpus: tuple[int, int],
    seq: int,
    global_batch_tokens: int,
    tokens: int,
    *,
    efficiency: float = 1.0,
    internode_bw: int = DEFAULT_INTERNODE,
    allowance: int | None = None,
    price_per_gpu_hour: float | None = None,
    top: int = 10,
    own: OwnLayout | None = None,
    prune: bool = True,
) -> Plan:
    """Every candidate layout (module docstring), the fitting ones ranked by GPU-hours.  ``allowance``:
    kept back from the GPU's CUDA total (default ``gpus.DEFAULT_ALLOWANCE``).  ``own``: price the user's own
    layout only (its GPU count is its world; ``gpus`` is not used), with the checkpointing and micro-batch it
    pins, every other one tried.  ``prune`` False: every candidate is replayed (no floor, no micro-batch chain
    skipped), the brute force the pruned search must agree with."""
    basis = check_plan(cfg, gpu_name, seq, global_batch_tokens, efficiency=efficiency, allowance=allowance, top=top)
    g, allowance = basis.gpu, basis.allowance
    sequences = global_batch_tokens // seq
    pending, evaluated_ep = [], False  # every candidate, with its step times: ranked before any replay
    cp = own.layout.cp > 1 if own is not None else seq >= MIN_CP_CONTEXT  # context parallel priced: ``_CpPricing``
    pricing = (_CpPricing if cp else _Pricing)(cfg, seq, g, efficiency, internode_bw)
    checkpoints = PLANNED_CHECKPOINTS if own is None or own.checkpoint is None else (own.checkpoint,)
    setups = [TrainingSetup(attention="sdpa", checkpoint=ck, precision="amp-bf16") for ck in checkpoints]
    if own is not None:
        gpus = (own.layout.world, own.layout.world)
    for family in _families(cfg, seq, gpus, sequences) if own is None else own.families(cfg, seq, sequences):
        per_rank = sequences // family["dp"]
        micro = _micro_batches(per_rank, family["pp"], family["virtual_stages"])
        for b in micro if own is None or own.micro_batch is None else own.micro_batches(micro, per_rank):
            lay = ParallelLayout(**family, micro_batches=per_rank // b)
            for setup in setups if lay.cp == 1 else _context_setups(cfg, seq, setups, lay):
                if (lay.ep > 1 or setup.checkpoint == "op") and not_modelled(cfg, seq, setup, lay):
                    continue  # expert parallel, and op, are planned where the replay models them
                evaluated_ep = evaluated_ep or lay.ep > 1
                compute = pricing.compute(b, setup, lay)
                pending.append((compute * lay.world, len(pending), b, setup, lay, compute))
    if not pending:
        raise AccountingError(
            f"no layout of {gpus[0]}..{gpus[1]} GPUs splits {sequences:,} sequences evenly over its data-parallel ranks"
        )
    fitting, failed, smallest, floors, seen = [], {}, None, [], {}

    def check(b, setup, lay, times) -> Candidate | None:
        """The candidate if it fits the GPU, else None (each candidate checked once: the frontier's search
        reads the ranking's)."""
        nonlocal smallest
        key = (b, setup, lay)
        if key in seen:
            return seen[key]
        seen[key] = None
        chain = (lay.dp, lay.zero, lay.tp, lay.sequence_parallel, lay.vocab_parallel, lay.pp, lay.ep, setup.checkpoint)
        chain += (lay.virtual_stages, lay.replicate, lay.cp)
        if prune and b >= failed.get(chain, b + 1):
            return None  # a smaller micro-batch of the same layout does not fit: the peak grows with b (1F1B; not
            # under interleaving, whose order changes with m = sequences / b: no chain is recorded there)
        try:
            need, exact = _need(cfg, seq, b, setup, lay, g, allowance, exact=not prune)
        except AccountingError:
            if setup.checkpoint != "op":
                raise
            return None  # op's rank program refuses this micro-batch (``ops.data_parallel``): no candidate
        if need <= g.cuda_total:
            peak_exact = peaks_exact(setup, lay.flat_cp(), cfg) and not not_modelled(cfg, seq, setup, lay)
            estimate = pricing.estimate(b, setup, lay, times)
            seen[key] = Candidate(lay, setup.checkpoint, b, lay.micro_batches, need, *times, peak_exact, estimate)
            return seen[key]
        if lay.virtual_stages == 1:
            failed[chain] = min(b, failed.get(chain, b))
        if exact and (smallest is None or need < smallest[0]):
            smallest = (need, lay.label, setup.checkpoint, b)
        elif not exact:
            floors.append((need, b, setup, lay))
        return None

    for _, _, _, b, setup, lay, times in _by_gpu_hours(pending, pricing):
        if len(fitting) == top:
            break
        if (c := check(b, setup, lay, times)) is not None:
            fitting.append(c)
    checked = len(seen)
    if not fitting:  # the smallest need, exact: replay the floored candidates that might have it, lowest first
        for floor, b, setup, lay in sorted(floors, key=lambda f: f[0]):
            if smallest is not None and floor >= smallest[0]:
                break
            try:
                need = _need(cfg, seq, b, setup, lay, g, allowance, True)[0]
            except AccountingError:
                if setup.checkpoint != "op":
                    raise
                continue  # op's rank program refuses this micro-batch, as in ``check``
            if smallest is None or need < smallest[0]:
                smallest = (need, lay.label, setup.checkpoint, b)
        need, label, ck, b = smallest
        if own is not None:
            raise AccountingError(
                f"{cfg.name} at context {seq:,} does not fit the layout {own.describe()} on {g.name} "
                f"(CUDA total {fmt_bytes(g.cuda_total)}): the smallest need is {fmt_bytes(need)} per GPU "
                f"(checkpoint {ck}, micro-batch {b}, allowance {fmt_bytes(allowance)} included)"
            )
        raise AccountingError(
            f"{cfg.name} at context {seq:,} fits no layout on {gpus[0]}..{gpus[1]} {g.name} "
            f"(CUDA total {fmt_bytes(g.cuda_total)}): the smallest need is {fmt_bytes(need)} per GPU "
            f"({label}, checkpoint {ck}, micro-batch {b}, allowance {fmt_bytes(allowance)} included); "
            + (
                f"FSDP2's dim-0 shards of the {cfg.num_experts}-expert stacks stop shrinking past dp = "
                f"{cfg.num_experts} (their padded all-gathers grow with dp)"
                + (
                    ""
                    if evaluated_ep
                    else "; expert parallel (memory --ep) is not planned for it: its replay does not model it"
                )
                if cfg.moe
                else "use more GPUs or a larger GPU"
            )
        )
    fastest = ()
    if own is None:
        fastest = _fastest_per_gpu_count(
            cfg, pending, pricing, check, g.cuda_total - allowance, fitting[0].layout.world
        )
    return Plan(
        cfg, g, seq, global_batch_tokens, tokens, efficiency, internode_bw, basis, price_per_gpu_hour,
        len(pending), checked, tuple(fitting), top, None if own is None else own.describe(), fastest,
    )  # fmt: skip


def _fastest_per_gpu_count(
    cfg: ModelConfig, pending: list, pricing: _Pricing | _CpPricing, check, budget: int, cheapest: int
):
    """The fastest fitting candidate at each GPU count W of ``pending`` from ``cheapest`` (the GPU count of the
    fewest GPU-hours) up (``check``: the ranking's fit check, shared): W's candidates in their order (at one W,
    GPU-hours order is step-time order) until one fits.  Skipped unchecked, because no candidate there can be on
    the frontier (``frontier``) or fit:
    1. W below ``cheapest``: a candidate there has at least the cheapest's GPU-hours h, so at least h / W / 24
       days, more than the cheapest's h / cheapest / 24: dominated;
    2. a W whose every layout holds more than the budget: amp-bf16 keeps 16 bytes of model states per parameter
       (the fp32 parameter, its gradient and AdamW's two moments) on some rank, so the busiest of W ranks holds
       at least 16·P/W, a lower bound of its peak whatever the layout."""
    worlds: dict[int, list] = {}
    for p in pending:
        worlds.setdefault(p[4].world, []).append(p)
    states = AMP_STATE_BYTES * parameter_breakdown(cfg).total
    out = []
    for w in sorted(worlds):
        if w < cheapest or -(-states // w) > budget:
            continue
        for _, _, _, b, setup, lay, times in _by_gpu_hours(worlds[w], pricing):
            if (c := check(b, setup, lay, times)) is not None:
                out.append(c)
                break
    return tuple(out)


AMP_STATE_BYTES = 16
"""Model-state bytes per parameter under amp-bf16 with fp32 parameters and AdamW: parameter 4 + gradient 4 +
exp_avg 4 + exp_avg_sq 4 (``analytic.memory``'s model states)."""


def frontier(candidates: tuple[Candidate, ...]) -> list[bool]:
    """Whether each candidate is on the frontier of time against GPU-hours: no other one takes at most its step
    time and at most its GPU-seconds per step (step · W), one of them less (the steps to train are the same for
    every candidate, so days and GPU-hours are these times a constant); equal within rounding (1e-9) is equal."""
    cost = [(c.step_s, c.step_s * c.layout.world) for c in candidates]
    le = lambda x, y: x <= y * (1 + 1e-9)  # equal up to rounding: dp 32 and dp 256 of one layout cost the same
    return [not any(le(t, s) and le(h, g) and not (le(s, t) and le(g, h)) for t, h in cost) for s, g in cost]


@dataclass(frozen=True)
class OwnLayout:
    """The user's own layout for ``plan`` (``--dp/--zero/--tp/--sp/--vocab-parallel/--pp/--ep``), with the
    checkpointing (``--checkpoint``) and the sequences per micro-batch (``--micro-batch``) it pins; None:
    every one is tried.  Priced by the same rules as every candidate (module docstring)."""

    layout: ParallelLayout
    checkpoint: str | None = None
    micro_batch: int | None = None

    def describe(self) -> str:
        pins = [f"checkpoint {self.checkpoint}"] if self.checkpoint else []
        pins += [f"micro-batch {self.micro_batch}"] if self.micro_batch else []
        return self.layout.label + (f" ({', '.join(pins)})" if pins else "")

    def families(self, cfg: ModelConfig, seq: int, sequences: int):
        """The one family of ``_families``' fields this layout is, refused in one line where ``plan`` cannot
        price it."""
        lay = self.layout
        lay.check(cfg, seq)
        if sequences % lay.dp:
            raise AccountingError(
                f"{lay.label}: dp={lay.dp} does not split a step's {sequences:,} sequences (global batch / context) "
                "evenly; change --global-batch-tokens or --dp"
            )
        if lay.ep > 1 and lay.zero < 2:
            raise AccountingError(f"{lay.label}: expert parallel is planned under FSDP2 (--zero 2 or 3)")
        if lay.tp > GPUS_PER_NODE:
            raise AccountingError(f"{lay.label}: tp={lay.tp} spans nodes; plan keeps a TP group within one node")
        why = op_layout_unmodelled(lay) if self.checkpoint == "op" else None
        if why:  # torchtitan's per-op checkpointing: the op library's course program, data parallel alone
            raise AccountingError(f"{lay.label}: plan has no per-rank memory here: {why}")
        if lay.cp > 1 and self.checkpoint == "selective":
            raise AccountingError(f"{lay.label}: context parallel with selective checkpointing is not measured")
        fields = ("dp", "zero", "tp", "sequence_parallel", "vocab_parallel", "pp", "ep", "virtual_stages", "replicate")
        yield {f: getattr(lay, f) for f in fields} | {"cp": lay.cp}

    def micro_batches(self, sizes: list[int], per_rank: int) -> list[int]:
        """``[micro_batch]``, refused where it does not split the rank's sequences into enough micro-batches."""
        if self.micro_batch not in sizes:
            raise AccountingError(
                f"--micro-batch {self.micro_batch}: the {self.layout.label} layout gives each data-parallel rank "
                f"{per_rank:,} sequences a step; a micro-batch must divide them"
                + (f" into at least pp={self.layout.pp} micro-batches (1F1B)" if self.layout.pp > 1 else "")
                + (f" (possible: {', '.join(map(str, sizes))})" if sizes else " (none does)")
            )
        return [self.micro_batch]


def _families(cfg: ModelConfig, seq: int, gpus: tuple[int, int], sequences: int):
    """The ``ParallelLayout`` fields of every candidate of the module docstring but its micro-batch count:
    for each GPU count W, tp, pp, cp (``_context_degrees``), dp = W / (tp·pp·cp) splitting the sequences evenly, ZeRO
    stage (over the dp·cp ranks), sequence parallel, ep and HSDP's replicate degree (``_replicate_degrees``); a cp > 1
    only beside the degrees context parallel runs beside (``_beside_context``)."""
    dense = not (cfg.moe or cfg.mla)  # a mixture of experts or MLA: data (and expert) parallel only
    for w in _powers(*gpus):
        for tp in (1, 2, 4, 8) if dense else (1,):
            if w % tp or tp > GPUS_PER_NODE or cfg.num_heads % tp or cfg.kv_heads % tp or cfg.d_ff % tp:
                continue
            pp = 1
            while pp <= min(MAX_PP if dense else 1, cfg.num_layers) and w % (tp * pp) == 0:
                for cp in _context_degrees(cfg, seq, w // (tp * pp)):
                    dp = w // (tp * pp * cp)
                    for zero in ((0, 1, 2, 3) if dp * cp > 1 else (0,)) if sequences % dp == 0 else ():
                        for sp in (False, True) if tp > 1 and seq % tp == 0 else (False,):
                            for vp in (False, True) if tp > 1 and not cfg.tie_embeddings else (False,):
                                for ep in _expert_degrees(cfg, dp, zero):
                                    for v in _virtual_stages(cfg, pp):
                                        for r in _replicate_degrees(dp, zero, tp, pp, ep, cp):
                                            family = {
                                                "dp": dp, "zero": zero, "tp": tp, "sequence_parallel": sp,
                                                "vocab_parallel": vp, "pp": pp, "ep": ep, "virtual_stages": v,
                                                "replicate": r, "cp": cp,
                                            }  # fmt: skip
                                            if cp == 1 or _beside_context(family):
                                                yield family
                pp *= 2


MIN_CP_CONTEXT = 16384
MAX_CP = 16
"""Caps on ``plan``'s search, not on the layout (``--cp`` prices any): context parallel is enumerated from a
16,384-position context up, cp up to 16 (Llama 3 405B's 128K stage: CP 16; Dubey et al. 2024, Table 4).  Each cp
degree is a context s = S/cp whose step programs ``plan`` records (one per tp and checkpointing, ~65 ms each):
every cp up to the GPUs at the 8,192 default doubled plan-70b's CPU time (2.3 s to 4.7 s), and none ranked."""


def _context_degrees(cfg: ModelConfig, seq: int, ranks: int) -> tuple[int, ...]:
    """cp = 1, and every power of two 2 <= cp <= ``MAX_CP`` dividing ``ranks`` (W / (tp·pp)) that context parallel
    takes on ``cfg`` at ``seq`` (``parallelisms.cp``'s check, the one rule: a dense model without MLA, S a multiple
    of 2·cp; refused at one cp, refused at every larger one), from ``MIN_CP_CONTEXT`` positions up."""
    out, cp = [1], 2
    while seq >= MIN_CP_CONTEXT and cp <= MAX_CP and ranks % cp == 0:
        try:
            ParallelLayout(dp=ranks // cp, cp=cp).check(cfg, seq)
        except AccountingError:
            break
        out.append(cp)
        cp *= 2
    return tuple(out)


def context_parallel_words(seq: int) -> str:
    """What ``plan``'s search enumerates of context parallel at ``seq`` positions, and what it never puts CP beside
    (``parallelisms.cp``'s refusals), for its notes."""
    from .parallelisms.cp import BESIDE

    searched = (
        f"cp 2..{MAX_CP}, powers of two with S a multiple of 2·cp"
        if seq >= MIN_CP_CONTEXT
        else f"none (searched from {MIN_CP_CONTEXT:,} positions; plan --cp C prices any degree)"
    )
    return (
        f"Context parallel searched: {searched}; never beside "
        + ", ".join(what for _, what in BESIDE)
        + ", a mixture of experts or latent attention, nor with selective or op checkpointing (context parallel refuses"
        " them): ring attention of the fused kernel over the cp ranks (tp apart), its collectives not overlapped."
    )


@functools.lru_cache(maxsize=4096)
def _context_beside(fields: tuple) -> bool:
    try:
        ParallelLayout(**dict(fields))  # ``parallelisms.cp``'s validate: the degrees refused beside CP
    except AccountingError:
        return False
    return True


def _beside_context(family: dict) -> bool:
    """Whether context parallel runs beside ``family``'s other degrees: ``ParallelLayout``'s own validation
    (``parallelisms.cp``: not beside the degrees of its ``BESIDE``), cached on the family's fields."""
    return _context_beside(tuple(family.items()))


def _context_setups(cfg: ModelConfig, seq: int, setups: list, lay: ParallelLayout) -> list:
    """The setups a context-parallel ``lay`` runs under (``analytic.context_parallel.check``: the fused attention, no
    selective checkpointing)."""
    from .analytic.context_parallel import check

    out = []
    for setup in setups:
        try:
            check(cfg, seq, setup, lay)
        except AccountingError:
            continue
        out.append(setup)
    return out


def _replicate_degrees(dp: int, zero: int, tp: int, pp: int, ep: int, cp: int = 1) -> list[int]:
    """replicate = 1, and under FSDP2 without pp, HSDP's dp / shard for every shard group that fits one node:
    shard a power of two, 2 <= shard, shard·tp <= 8, leaving at least two replicas, and beside expert parallel
    holding the ep ranks (torchtitan's dp_shard_in_ep: ep divides shard; ``ParallelLayout``).  Beside context
    parallel the shard is torchtitan's dp_shard, FSDP2's group its dp_shard × cp ranks: dp_shard 1 too (a shard
    group of the cp ranks), dp_shard·tp <= 8 as without CP (the cp ranks beside it, tp apart, may cross nodes)."""
    if zero < 2 or pp > 1:
        return [1]
    sizes = (1, 2, 4, 8) if cp > 1 else (2, 4, 8)
    shards = [s for s in sizes if s * tp <= GPUS_PER_NODE and dp % s == 0 and dp // s >= 2 and s % ep == 0]
    return [1] + [dp // s for s in shards]


MAX_UNEVEN_VIRTUAL = 4
"""The most virtual stages ``plan`` enumerates where pp·v does not divide the layers (a cap on its search, not on the
layout: ``--virtual-stages`` prices any; torchtitan's published 405B run used 2)."""


def _virtual_stages(cfg: ModelConfig, pp: int) -> list[int]:
    """v = 1, and under pp every power of two v > 1 whose pp·v stages divide the layers (Megatron's rule), or have a
    block each with v up to ``MAX_UNEVEN_VIRTUAL``: split as torch's pipelining and torchtitan split them, the first
    L mod pp·v stages one block more (``analytic.parallel.stage_layers``; Llama 3 405B's 126 layers over pp 16 × v 2
    or 4)."""
    out, v = [1], 2
    while pp > 1 and pp * v <= cfg.num_layers:
        if cfg.num_layers % (pp * v) == 0 or v <= MAX_UNEVEN_VIRTUAL:
            out.append(v)
        v *= 2
    return out


def _expert_degrees(cfg: ModelConfig, dp: int, zero: int) -> list[int]:
    """ep = 1, and for a mixture of experts under FSDP2 every power of two above 1 dividing dp and E
    (``ParallelLayout``: expert parallel borrows its ranks from dp)."""
    if not cfg.moe or zero < 2:
        return [1]
    return [1] + [ep for ep in _powers(2, dp) if ep & (ep - 1) == 0 and dp % ep == 0 and cfg.num_experts % ep == 0]


def _micro_batches(per_rank: int, pp: int, v: int = 1) -> list[int]:
    """Micro-batch sizes b: powers of two dividing the sequences per data-parallel rank, with at least
    pp micro-batches (1F1B); with virtual stages, k a whole number of rounds of k // pp (torch's
    ``ScheduleInterleaved1F1B``, ``ParallelLayout``)."""
    counts = [
        (b, per_rank // b)
        for b in _powers(1, per_rank)
        if b & (b - 1) == 0 and per_rank % b == 0 and per_rank // b >= pp
    ]
    return [b for b, k in counts if v == 1 or k % max(1, k // pp) == 0]


def _check_plannable(cfg: ModelConfig) -> None:
    """The planner ranks layouts by their per-GPU peak: refuse, in one line, a model whose step the
    replay does not model (``replay_unsupported``: then ``memory --dp`` gives its states and collectives)."""
    from .analytic.replay import replay_unsupported

    missing = replay_unsupported(cfg, TrainingSetup(attention="sdpa", precision="amp-bf16"))  # any MoE split
    if missing:
        raise AccountingError(
            f"plan needs per-GPU peaks, which the step replay does not model for {cfg.name} ({', '.join(missing)}); "
            f"memory {cfg.name} --dp N --zero Z gives its exact model states and collectives"
        )


MAIN_LAYOUTS = (  # label -> (zero, tp): the curves of ``memory_vs_gpus``
    ("DDP", 0, 1),
    ("ZeRO-1", 1, 1),
    ("FSDP2 ZeRO-2", 2, 1),
    ("FSDP2 ZeRO-3", 3, 1),
    ("FSDP2 ZeRO-3 × TP 8 + SP", 3, 8),
)


def curve_setup(checkpoint: str = "full") -> TrainingSetup:
    """The training setup of ``memory_vs_gpus``'s curves: sdpa, amp-bf16, foreach AdamW, ``checkpoint``."""
    return TrainingSetup(attention="sdpa", checkpoint=checkpoint, precision="amp-bf16")


def memory_vs_gpus(
    cfg: ModelConfig, seq: int, gpus: tuple[int, int], *, checkpoint: str = "full", allowance: int = DEFAULT_ALLOWANCE
) -> dict[str, list[tuple[int, int]]]:
    """Per-GPU peak + allowance (micro-batch 1, sdpa, amp-bf16, ``checkpoint``) of the worst rank
    for each of ``MAIN_LAYOUTS`` at every power-of-two GPU count in the range (where it applies)."""
    setup = curve_setup(checkpoint)
    out: dict[str, list[tuple[int, int]]] = {}
    for label, zero, tp in MAIN_LAYOUTS:
        if cfg.num_heads % tp or cfg.kv_heads % tp or cfg.d_ff % tp:
            continue
        points = []
        for w in _powers(*gpus):
            if w % tp or w // tp < 2:
                continue
            lay = ParallelLayout(dp=w // tp, zero=zero, tp=tp, sequence_parallel=tp > 1)
            points.append((w, _peak(cfg, seq, 1, setup, lay) + allowance))
        out[label] = points
    return out
