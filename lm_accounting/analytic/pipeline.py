"""Pipeline parallel (1F1B, interleaved 1F1B): the worst stage's memory.  No torch.

Pipeline parallel alone or beside data parallel (DDP, ZeRO-1, FSDP2) and tensor parallel (with or
without sequence parallel, with or without vocab parallel; not DDP/ZeRO-1 × TP; a dense model): each
stage's step is REPLAYED
(``stage_step``, ``stage_replayed``): one micro-batch's forward, loss and backward on the stage's
blocks (``analytic.replay``'s own block replays) placed in torch 2.13's ``Schedule1F1B`` order with
the schedule's references to outputs, input gradients and losses (``_schedule``).  Byte-exact
against one stage of the real job (``PipelineStage`` + ``Schedule1F1B`` on the fake process group,
``measure.pipeline.measure_stage``): every phase's peak and end on the grid of
``tests/test_pipeline_measured.py`` (pp 2 and 4, m = P and 2P, stages 0, middle and P − 1, fp32,
bf16, amp-bf16, no/full/selective checkpointing, naive and sdpa attention, B 1 and 2; AdamW foreach)
and of ``tests/test_pipeline_dp.py`` (the same beside DDP, ZeRO-1 and FSDP2 ZeRO-2/-3 over dp 2 and 4)
and ``tests/test_pipeline_tp.py`` (beside TP and TP + SP, alone or with FSDP2: TP's all-reduces replayed,
``replay._tp_all_reduce``; with vocab parallel too).

Data parallel beside: DDP's gradient buckets are allocated with the module and the last backward's
all-reduce copies into and out of them, so DDP and ZeRO-1 shift the baseline only (``stage_baseline``;
ZeRO-1 its owned moments, the worst dp rank).  FSDP2 adds its events to the replay (``_StageEvents``,
``_reduce_grads``): ``PipelineStage`` runs every backward without resharding or reducing, so a unit is
gathered by each forward or backward that finds it sharded, its gradients accumulate unsharded (under
amp-bf16 folded into fp32 sums after each backward), and ``perform_reduce_grad`` reduce-scatters
every unit once at the end.  Under FSDP2's amp-bf16 policy the stage runs the bf16 model
(``fsdp_compute_setup``) with fp32 logits, and the residual stream crossing stages is bf16.  Tensor
parallel: the TP-local model's stage (h/M heads, d_ff/M), as one TP rank replays; under sequence
parallel its T/M-row residual stream (``Sizes.sp``), which also crosses the stages.  Vocab parallel:
stage 0's row-wise embedding and the last stage's column-wise head with ``loss_parallel``, as the
single-GPU vocab-parallel replay has them (``analytic.tensor_parallel``; the logits stay the schedule's,
the embedding's gradient is the whole (V, d) under FSDP2 too: ``fsdp`` rule 8).  A tied head is
a second copy of the embedding on the last stage (``stage_parameters``; its gradient its own: nothing
in ``PipelineStage`` shares it with stage 0's, which the real job would have to synchronise itself).

Interleaved 1F1B (``ParallelLayout.virtual_stages`` v > 1; torch 2.13's ``ScheduleInterleaved1F1B``; Narayanan et
al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", §2.2.2): pipeline rank
r holds the chunks r, r + pp, ... of a pp·v-stage split (``ParallelLayout.as_chunks``), each replayed as that
stage of a 1F1B pipeline replays (``_stage_parts``) and placed in torch's interleaved order (``interleaved_order``,
``_interleaved_schedule``: ``interleaved_rank_step``), byte-exact against the rank's v ``PipelineStage``s on the
fake process group (``measure.pipeline.measure_interleaved_rank``; ``tests/test_pipeline_interleaved.py``) alone
or beside DDP, ZeRO-1 and TP (with or without SP and vocab parallel), and beside FSDP2, where the same replay
follows the runtime's UNSHARD, RESHARD and REDUCE_GRAD actions (``_runtime_actions``: at most 3 chunks unsharded
at once); elsewhere the ESTIMATE is ``interleaved_rank_estimate``.  The time
model's bubble: ``pipeline_slots``.

Beside DDP/ZeRO-1 × TP, or with a mixture of experts, the peaks stay an ESTIMATE
(``_stage_estimate``): baseline, receive buffers, k × saved activations and the gradients, each
backward's transient left out (the estimate before the replays, which also counted the gradients twice
and left the buffers out, was off by −7 % .. +25 % on the tiny grid with pipeline parallel alone,
−16 % .. −7 % beside FSDP2, and by 26 GB for Llama-3.1-70B on pp 8 at m = 256: the buffers).
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from typing import NamedTuple

from ..config import AccountingError, ModelConfig
from ..layout import ParallelLayout
from ..names import DTYPE_BYTES
from ..phases import PhaseBytes, StepMemory
from ..setup import TrainingSetup
from . import replay as rp
from .fsdp import FsdpEvents, FsdpUnits, Unit, fsdp_units
from .hooks import StepHooks
from .ops.engine import Copy, Grad, Join, Replay, repeat
from .parallel import (
    adamw_temporary,
    element_bytes,
    fsdp_compute_setup,
    local_config,
    model_states,
    saved_activations,
    single_rank_step,
    stage_layers,
    step_counter_bytes,
)
from .params import parameter_breakdown
from .sizes import Sizes
from .tensor_parallel import _loss_parallel_backward, _loss_parallel_forward, _vocab_embedding_forward


def check_stage_call(cfg: ModelConfig, seq: int, layout: ParallelLayout, rank: int | None = None) -> None:
    """The refusals of this module's public entries (``pipeline_stages``, ``stage_step``, ``interleaved_rank_step``,
    ``stage_floor``), before anything is replayed: the layout's (``ParallelLayout.check``, e.g. pp·v stages beyond
    the layers, which had reached ``_interleaved_first_backward`` as a ValueError traceback), and a pipeline rank
    ``rank`` outside the pp ranks.  One line each, exit 2 (``AccountingError``)."""
    layout.check(cfg, seq)
    if rank is not None and not 0 <= rank < layout.pp:
        raise AccountingError(f"pipeline rank {rank} is outside the {layout.pp} ranks")


def pipeline_stages(
    cfg: ModelConfig,
    seq: int,
    batch: int,
    setup: TrainingSetup,
    layout: ParallelLayout,
    stage: int | None = None,
    with_traced: bool = True,
    rank: int | None = None,
    stop_above: int | None = None,
) -> tuple[int, StepMemory, StepMemory, object, int]:
    """1F1B over P stages and m micro-batches: (stage, plain step, traced step, states, activations) of
    the stage with the highest peak.  Where ``stage_replayed``: the candidate stages replayed (``stage_step``),
    exact against the measured stage.  Otherwise an ESTIMATE
    (``_stage_estimate``) of stage 0 (the most micro-batches in flight, the first L mod P stages one
    block more) and the last (the head).  ``stage``: that stage's instead; ``rank``: that data-parallel
    rank's (default: the worst; only ZeRO-1's owned moments differ).  ``with_traced=False`` (the planner):
    the traced step is the plain one (not replayed).  Replayed, the candidates are ``worst_stage_candidates``
    (at most four stages, not all P: the replay is linear in P, not quadratic).  ``stop_above`` (the planner's
    budget): the first stage or rank, in the order above (rank 0 first), whose plain peak exceeds it is returned
    without replaying the rest; its peak is then a lower bound of the worst, the maximum over all of them."""
    check_stage_call(cfg, seq, layout, stage)
    if layout.virtual_stages > 1:  # interleaved: each pipeline rank's v chunks (replayed: every rank)
        exact, best = stage_replayed(cfg, setup, layout), None
        ranks = range(layout.pp) if exact else sorted({0, layout.pp - 1})
        for r in [stage] if stage is not None else ranks:
            step, st, act = interleaved_rank_step(cfg, seq, batch, setup, layout, r, "plain", rank)
            if best is None or step.peak > best[1].peak:
                traced = step
                if exact and with_traced:
                    traced = interleaved_rank_step(cfg, seq, batch, setup, layout, r, "traced", rank)[0]
                best = (r, step, traced, st, act)
            if stop_above is not None and step.peak > stop_above:
                break
        return best
    exact = stage_replayed(cfg, setup, layout)
    ends = sorted({0, layout.pp - 1})
    stages = [stage] if stage is not None else worst_stage_candidates(cfg.num_layers, layout.pp) if exact else ends
    best = None
    for s in stages:
        step, st, act = stage_step(cfg, seq, batch, setup, layout, s, mode="plain", rank=rank)
        if best is None or step.peak > best[1].peak:
            traced = step
            if exact and with_traced:
                traced = stage_step(cfg, seq, batch, setup, layout, s, mode="traced", rank=rank)[0]
            best = (s, step, traced, st, act)
        if stop_above is not None and step.peak > stop_above:
            break
    return best


def stage_floor(
    cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup, layout: ParallelLayout, stop_above: int | None = None
) -> int:
    """A lower bound of the worst stage's peak, without the replay (the planner's first look): stage 0's
    or the last stage's baseline, receive buffers and the saved activations of its w = min(m, P − s)
    warm-up micro-batches, all live when its first backward starts (each forward keeps at least what its
    blocks and head save).  Never above ``pipeline_stages``' peak (tests/test_plan.py checks it on every
    pipeline candidate of two plans).  Interleaved: the first or last pipeline rank's baseline and receive
    buffers, + the larger of two bytes each live at some point: beside FSDP2 its chunks' units unsharded (the
    runtime's UNSHARD before the first compute), and the saved activations of the chunk micro-batches in flight
    at its first backward (``_interleaved_first_backward``: each forward before it keeps what its chunk saves,
    as under 1F1B; tests/test_plan_speed.py checks the floor on random interleaved candidates); ``stop_above``
    (the planner's budget): the first rank's alone where it exceeds it, a lower bound too."""
    check_stage_call(cfg, seq, layout)
    layout = layout.shard_group()  # HSDP: its shard group's FSDP2 stages (``parallel`` rule 8)
    if layout.virtual_stages > 1:
        fsdp = layout.fsdp and layout.dp > 1  # the runtime's UNSHARD (or the estimate's units) before any compute

        def kept(r: int) -> int:
            st, base, buffers, _, in_flight = _interleaved_first_backward(cfg, seq, batch, setup, layout, r, None)
            return base + buffers + max(st.unsharded_all if fsdp else 0, in_flight)

        floor = kept(0)
        return floor if stop_above is not None and floor > stop_above else max(floor, kept(layout.pp - 1))
    flat, P = _flat(layout), layout.pp
    return max(
        stage_baseline(cfg, seq, batch, setup, layout, s)
        + schedule_buffers(cfg, seq, batch, setup, layout, s)
        + min(P - s, layout.micro_batches) * _stage_saved(cfg, seq, batch, setup, flat, P, s)
        for s in {0, P - 1}
    )


def stage_replayed(cfg: ModelConfig, setup: TrainingSetup, layout: ParallelLayout) -> bool:
    """Whether ``stage_step`` replays the stage rather than estimating it: pipeline parallel alone or
    beside data parallel (DDP, ZeRO-1, FSDP2) and tensor parallel with or without sequence parallel (the
    TP-local model, with or without vocab parallel; beside FSDP2, not DDP or ZeRO-1, as measured), a dense
    model (no
    MoE split in the stage replay; a tied head a second copy on the last stage), and a model the
    single-GPU replay models.  Interleaved 1F1B (virtual stages) too, beside FSDP2 along the runtime's own
    UNSHARD, RESHARD and REDUCE_GRAD actions (``interleaved_rank_step``, tests/test_pipeline_interleaved.py).
    Byte-exact against the measured stage (the test files of the module docstring)."""
    tp = layout.tp == 1 or not (layout.zero in (0, 1) and layout.dp > 1)
    return layout.pp > 1 and tp and not cfg.moe and rp.replay_supported(cfg, setup)


def stage_step(
    cfg: ModelConfig,
    seq: int,
    batch: int,
    setup: TrainingSetup,
    layout: ParallelLayout,
    stage: int,
    mode: str = "plain",
    rank: int | None = None,
) -> tuple[StepMemory, object, int]:
    """(step, model states, saved activations of the k = min(P − s, m) micro-batches in flight) of
    pipeline stage ``stage`` (``rank``: its data-parallel rank, default the worst).  ``mode``: "traced" is what the storage tracker sees (the measured stage);
    "plain" a run without a dispatch mode (``analytic.replay``'s traced-only copies left out; derived, not
    measured: the measured stage runs under the storage tracker, a dispatch mode).

    Replayed (``stage_replayed``), in the phases of ``measure.pipeline.measure_stage``:

    1. baseline: ``stage_baseline`` (parameters, AdamW moments, RoPE tables, the step's ids or targets);
    2. "forward" runs from ``Schedule1F1B.step`` to the stage's first ``backward_one_chunk``: the receive
       buffers (``schedule_buffers``, allocated by ``_initialize_stage`` before the first forward), then the
       1F1B warm-up, k = min(P − s, m) forwards (and on the last stage each micro-batch's loss);
    3. "backward" is the rest of the schedule (steady state: one backward, one forward; cool-down: the
       remaining backwards) and ``perform_reduce_grad`` (``p.grad.div_(m)``, in place);
    4. each forward, loss and backward is one micro-batch replayed on the stage's blocks (``_chunk_lines``),
       placed where ``Schedule1F1B._step_microbatches`` runs it, with the schedule's references
       (``_schedule``);
    5. "optimizer_step": AdamW over the stage's gradients (``adamw_temporary``), then ``zero_grad``:
       the end is the baseline and the receive buffers, which the stage keeps."""
    rp.check_mode(mode)
    check_stage_call(cfg, seq, layout, stage)
    layout, rank = layout.shard_rank(rank)  # HSDP: its shard group's FSDP2 stage (``parallel`` rule 8)
    if layout.virtual_stages > 1:  # ``stage``: the pipeline rank
        return interleaved_rank_step(cfg, seq, batch, setup, layout, stage, mode, rank)
    if not stage_replayed(cfg, setup, layout):
        return _stage_estimate(cfg, seq, batch, setup, layout, stage, rank)
    P, m = layout.pp, layout.micro_batches
    st, base, buffers, chunks, fsdp, opt_top = _stage_parts(
        cfg, seq, batch, setup, layout, _like(cfg.num_layers, P, stage), mode, rank
    )
    fwd, bwd = _schedule(P, m, stage, buffers, chunks, fsdp)
    opt = PhaseBytes(base + bwd.end + opt_top, base + buffers)
    step = StepMemory(
        base, PhaseBytes(base + fwd.peak, base + fwd.end), PhaseBytes(base + bwd.peak, base + bwd.end), opt
    )
    return step, st, min(P - stage, m) * _stage_saved(cfg, seq, batch, setup, _flat(layout), P, stage)


def _like(layers: int, stages: int, stage: int) -> int:
    """The first stage whose model equals stage ``stage``'s (the same ends, as many blocks): only the
    1F1B schedule tells equal middle stages apart.  The first L mod P stages hold one block more
    (``stage_layers``), so that is stage 1 below L mod P, else the first middle stage from L mod P on."""
    if stage in (0, stages - 1):
        return stage
    extra = layers % stages
    return 1 if stage < extra else max(extra, 1)


def worst_stage_candidates(layers: int, stages: int) -> list[int]:
    """The stages whose peaks ``pipeline_stages`` compares: the first and the last, and of the middle stages
    the first of each model (``_like``).  Middle stages of one model differ only in 1F1B's warm-up depth
    min(m, P − s), which never grows with s, and a deeper warm-up holds more micro-batches' outputs at every
    point of the schedule, so the first is the worst (every stage replayed agrees: tests/test_hostile_round3.py)."""
    extra = layers % stages
    middle = {s for s in (1, max(extra, 1)) if 0 < s < stages - 1}
    return sorted({0, stages - 1} | middle)


@lru_cache(maxsize=16384)
def _states(cfg: ModelConfig, setup: TrainingSetup, layout: ParallelLayout, stage: int, rank: int | None = None):
    """``model_states`` of pipeline stage ``stage`` (data-parallel rank ``rank``, default the worst); the
    micro-batch count changes nothing there (``model_states`` reads the layout's degrees only)."""
    return model_states(cfg, setup, layout, rank=rank, stage=stage)


@lru_cache(maxsize=1024)
@lru_cache(maxsize=4096)
def _stage_parts(cfg, seq, batch, setup, layout, stage, mode, rank=None):
    """What ``stage_step`` needs of a stage's model: (model states, baseline, receive buffers, chunks,
    FSDP2's (gathering chunks, zero 3, reductions) or None, the optimizer step above the backward's end).
    Cached (immutable results): an interleaved rank's chunks alike in blocks and ends (``_like``), and each
    pipeline rank of a layout, ask for the same stage."""
    P = layout.pp
    st = _states(cfg, setup, layout, stage, rank)
    base = stage_baseline(cfg, seq, batch, setup, layout, stage, rank)
    buffers = schedule_buffers(cfg, seq, batch, setup, layout, stage)
    blocks = len(stage_layers(cfg.num_layers, P, stage))
    run = fsdp_compute_setup(setup, layout)  # FSDP2's amp-bf16: the bf16 model
    local = local_config(cfg, layout)  # the TP rank's model: h/M heads, d_ff/M
    where = (local, seq, run, blocks, stage == 0, stage == P - 1, mode == "traced")
    units = _StageUnits.of(cfg, setup, layout, stage)
    shards = layout.tp if layout.sequence_parallel else 1
    # (M, ``Sizes.gather_cat``) under sequence parallel; TP without it all-reduces (``Sizes.all_reduce``)
    sp = (shards, shards > 1 and batch > 1, layout.tp > 1 and shards == 1)
    vl = -(-cfg.vocab_size // layout.tp) if layout.vocab_parallel else 0  # TP rank 0's vocabulary rows
    fwd = _chunk_lines(*where, units and units.held(), False, sp, "forward", vl)
    bwd = _chunk_lines(*where, units and units.folds(), False, sp, "backward", vl)
    chunks = _at(fwd._replace(first_backward=bwd.first_backward, later_backward=bwd.later_backward), batch)
    fsdp = None
    if units:  # zero 2 never finds the units sharded in a backward: no gathering one to replay
        gathering = _at(_chunk_lines(*where, units, True, sp, "both" if units.zero3 else "forward", vl), batch)
        fsdp = (gathering, units.zero3, _reduce_grads(cfg, units, blocks, mode == "traced"))
    z = Sizes(cfg, e=element_bytes(setup), setup=setup, plain=mode == "plain")
    opt_top = adamw_temporary(cfg, setup, layout, st, stage) + rp.adamw_step_scalar_bytes(z)
    return st, base, buffers, chunks, fsdp, opt_top


def stage_baseline(
    cfg: ModelConfig,
    seq: int,
    batch: int,
    setup: TrainingSetup,
    layout: ParallelLayout,
    stage: int,
    rank: int | None = None,
):
    """Bytes live when stage ``stage``'s step starts (exact against the measured stage): its parameters
    and AdamW moments (sharded by FSDP2; ZeRO-1's owned ones), DDP's gradient buckets, the RoPE tables,
    AdamW's step counters on the device (fused), and the whole step's int64 token ids (m·B·S, stage 0) or targets (the last stage); a middle stage
    holds neither.  ``rank``: the data-parallel rank (default: the worst)."""
    st = _states(cfg, setup, layout, stage, rank)
    rotary = cfg.rope_dim if cfg.partial_rotary else cfg.d_head  # partial rotary: narrower tables
    rope = 2 * cfg.context_length * (rotary // 2) * 4 if cfg.positions == "rope" else 0  # fp32 cos, sin
    ends = (stage == 0) + (stage == layout.pp - 1)
    counters = step_counter_bytes(cfg, setup, layout, st, stage)  # fused AdamW's, on the device
    return (
        st.parameters + st.optimizer + st.ddp_buckets + counters + rope + ends * 8 * layout.micro_batches * batch * seq
    )


def schedule_buffers(cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup, layout: ParallelLayout, stage: int):
    """Bytes of the receive buffers torch's ``PipelineStage`` allocates at its first step and keeps
    (exact against the measured stage): one (B, S, d) activation buffer per micro-batch on every stage
    but the first (``_setup_forward_recv_info``), one (B, S, d) gradient buffer per micro-batch on every
    stage but the last (``_setup_backward_recv_info``), in the residual stream's dtype: the parameters',
    or bf16 under FSDP2's amp-bf16 policy (``fsdp_compute_setup``)."""
    sides = (stage > 0) + (stage < layout.pp - 1)
    e = element_bytes(fsdp_compute_setup(setup, layout))
    rows = seq // layout.tp if layout.sequence_parallel else seq  # sequence parallel: S/M positions
    return sides * layout.micro_batches * batch * rows * cfg.d_model * e


class _Part(NamedTuple):
    """One micro-batch's forward, loss or backward on the stage: its highest point above the bytes live
    when it starts, and its net change."""

    peak: int
    net: int


class _Chunks(NamedTuple):
    forward: _Part
    loss: _Part | None  # the last stage's cross-entropy
    first_backward: _Part  # the step's first backward: each gradient kept as ``.grad``
    later_backward: _Part  # later backwards: each gradient added into ``.grad``, then freed
    output: int  # bytes of the stage's output (hidden states, or the last stage's logits)
    input_grad: int  # bytes of the gradient of the stage's input (0 on stage 0: token ids)
    loss_bytes: int  # the loss scalar each micro-batch leaves in ``_internal_losses`` (last stage)


class _StageReplay(Replay):
    """``analytic.replay``'s running bytes with a pipeline stage's two differences from one GPU.

    * ``accumulate``: the stage's later backwards find ``.grad`` set, so ``AccumulateGrad`` adds each new
      gradient in place (``variable_grad += new_grad``: torch/csrc/autograd/functions/accumulate_grad.h,
      grad mode off) and the new one dies with the node that made it: each tagged gradient
      (``replay._Grad``) is freed at the end of its node's line.
    * ``keep``: that many residual-stream joins (``replay._Join``) whose old gradient is the receive
      buffer, which the stage keeps (``_RecvInfo.buffer``): the sum is a fresh tensor (the buffer has other
      references, so it is out of place in a plain run too) and nothing dies: + its size, where one GPU
      has a transient copy and the old gradient's release."""

    def __init__(self, live: rp.Affine, traced: bool, accumulate: bool = False):
        super().__init__(live, traced)
        self.accumulate, self.keep = accumulate, 0

    def fresh(self) -> _StageReplay:
        return _StageReplay(rp.Affine(0), self.traced, self.accumulate)

    def __call__(self, *deltas) -> None:
        if self.keep and any(isinstance(d, Join) for d in deltas):
            out = []
            for d in deltas:
                if self.keep and isinstance(d, Join):
                    self.keep -= 1
                    d = d.size
                out.append(d)
            deltas = tuple(out)
        if self.accumulate:
            deltas += tuple(-int(d) for d in deltas if isinstance(d, Grad))
        super().__call__(*deltas)


class _StageUnits(NamedTuple):
    """FSDP2's units on one pipeline stage (``analytic.fsdp``'s ``Unit``): the stage's root (its embedding
    on stage 0, its final norm and LM head on the last; None on a middle stage, whose root holds no
    parameter) and its blocks' (dense: all alike), over the stage's dp ranks."""

    root: Unit | None
    block: Unit
    zero3: bool  # reshard_after_forward
    amp: bool  # amp-bf16: MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)

    def folds(self) -> _StageUnits | None:
        """What a backward that finds the units unsharded sees of them: only the gradients amp-bf16 folds
        (``_StageEvents._fold``; None without amp), the same for every dp and ZeRO stage (one replay
        serves them all)."""
        fold = lambda u: u and Unit(0, 0, u.grads, u.last_grad, 0, 0, 0, 0, vocab_extra=u.vocab_extra)
        return _StageUnits(fold(self.root), fold(self.block), False, True) if self.amp else None

    def held(self) -> _StageUnits | None:
        """What a forward that finds the units unsharded sees of them: zero 3 reshards them; zero 2 does
        nothing (``folds``)."""
        return self if self.zero3 else self.folds()

    @staticmethod
    def of(cfg: ModelConfig, setup: TrainingSetup, layout: ParallelLayout, stage: int) -> _StageUnits | None:
        """Cached on what ``fsdp_units`` reads (the precision of ``setup``; of ``layout`` neither the ZeRO stage,
        2 or 3, nor sequence parallel): every chunk of an interleaved rank asks at each replay, every micro-batch
        size and checkpointing at each stage."""
        return _StageUnits.on(cfg, setup.precision, layout, stage)

    @staticmethod
    @lru_cache(maxsize=4096)
    def on(cfg: ModelConfig, precision: str, layout: ParallelLayout, stage: int) -> _StageUnits | None:
        if not layout.fsdp or layout.dp == 1:
            return None
        units = _StageUnits.at(cfg, precision, dataclasses.replace(layout, zero=3, sequence_parallel=False), stage)
        return units._replace(zero3=layout.zero == 3)

    @staticmethod
    @lru_cache(maxsize=4096)
    def at(cfg: ModelConfig, precision: str, layout: ParallelLayout, stage: int) -> _StageUnits:
        setup = TrainingSetup(precision=precision)
        units = fsdp_units(cfg, setup, layout, stage=(layout.pp, stage))
        assert len(units.blocks) == 1, "a stage's blocks are one unit kind (stage_replayed: dense models only)"
        return _StageUnits(units.root, units.blocks[0], True, setup.autocast)


class _StageEvents(StepHooks):
    """FSDP2's events in one forward or backward of a stage (``analytic.fsdp``'s rules, as
    ``FsdpEvents``), under ``PipelineStage.backward_maybe_with_nosync``: every backward runs with
    ``set_reshard_after_backward(False)`` and ``set_requires_gradient_sync(False)``, so a unit unsharded in
    backward stays so, its gradients accumulate unsharded (fp32 and bf16: in ``.grad``, as without FSDP2)
    and nothing is reduced until ``perform_reduce_grad`` (``_reduce_grads``).  So a unit is gathered by a
    forward or backward that finds it sharded (``sharded``): the step's first forward; under zero 3 also
    every forward before the first backward and every backward that follows a forward (each forward
    reshards, rule 3).  A forward that finds the units unsharded gathers nothing (``FSDPParamGroup.unshard``
    returns, ``wait_for_unshard`` has no result to free) but still reshards them (zero 3).  ``i``: the
    block's index on the stage (1 stands for any block above the first: all alike)."""

    def __init__(self, units: _StageUnits | None, sharded: bool, blocks: int, last: bool = False):
        self.u, self.sharded, self.top, self.last = units, sharded, blocks - 1, last
        self.first_backward = True

    def root_pre_forward(self, r) -> None:
        if self.sharded and self.u.root:
            self.u.root.unshard(r)

    def block_pre_forward(self, r, i: int) -> None:
        if self.sharded:
            self.u.block.unshard(r)
            before = self.u.block if i else self.u.root  # rule 2: the previous unit's all-gather output
            r(-(before.output if before else 0))

    def block_post_forward(self, r, i: int) -> None:
        if self.u and self.u.zero3:
            r(-self.u.block.gathered)  # rule 3

    def root_post_forward(self, r) -> None:
        if self.u and self.u.zero3 and self.u.root:
            r(-self.u.root.gathered)
        if self.sharded:
            r(-self.u.block.output)  # rule 2: the last block's all-gather output

    def root_pre_backward(self, r) -> None:
        """Rule 4: the root unsharded; on the last stage, whose output is the root's (the logits), its hook
        fires first and prefetches the top block.  Stage 0's output is the top block's, which registered
        its hook on it first: the top block gathered itself and prefetched the one below, and the root's
        prefetch target (the top block) is unsharded already.  A middle stage's root has no unit."""
        if self.sharded and self.u.root:
            root, top = self.u.root, self.u.block
            root.unshard(r)
            r(-root.output)
            if self.last:
                r(+top.copy_in, +top.output, -top.copy_in)

    def block_pre_backward(self, r, i: int) -> None:
        """Rule 4: copy out the prefetched unit (or gather it: the top block, unless the last stage's root
        prefetched it), free its all-gather output, prefetch the block below."""
        if not self.sharded:
            return
        unit = self.u.block
        if i == self.top and not (self.last and self.u.root):
            r(+unit.copy_in, +unit.output, -unit.copy_in)
        unit.copy_out(r)
        r(-unit.output)
        if i > 0:
            r(+unit.copy_in, +unit.output, -unit.copy_in)

    def block_post_backward(self, r, i: int) -> None:
        self._fold(r, self.u.block if self.u else None)

    def root_post_backward(self, r) -> None:
        """At the backward's end: the last stage's root hook is on its input (the received hidden states,
        whose gradient comes last); stage 0's input is token ids, so the final callback runs it."""
        self._fold(r, self.u.root if self.u else None)

    def _fold(self, r, unit: Unit | None) -> None:
        """amp-bf16 (``reduce_dtype`` fp32): ``post_backward`` without reducing folds the unit's bf16
        gradients into fp32 sums.  The first backward: ``to_accumulated_grad_if_needed``, per parameter an
        fp32 copy (2g), then the bf16 gradient freed (g), the last parameter's copy the highest point; a
        later one, whose autograd found ``.grad`` None and kept its bf16 gradients: ``accumulate_unsharded_
        grad_if_needed`` adds them in place into the sums and frees them."""
        if unit is None or not self.u.amp:
            return
        # vocab parallel: the embedding's whole gradient (``fsdp`` rule 8), stage 0's root's only parameter
        g, last = unit.grads + unit.vocab_extra, unit.last_grad + unit.vocab_extra
        if self.first_backward:
            r(+(g - last), +2 * last, -last)
        else:
            r(-g)


@lru_cache(maxsize=4096)
def _block_lines(
    c: ModelConfig,
    seq: int,
    setup: TrainingSetup,
    traced: bool,
    fl: bool,
    kind: str,
    accumulate: bool,
    keep: int,
    sp: tuple[int, bool, bool] = (1, False, False),
) -> _StageReplay:
    """One block's forward (``kind`` "forward") or backward ("backward"; "backward_block0": block 0's,
    which also releases the shared mask) replayed from zero as a segment (``replay.apply_segment``), with
    ``_StageReplay``'s ``accumulate`` and ``keep``: the same for every FSDP2 layout, whose events come
    between blocks (``_StageEvents``)."""
    z = _stage_sizes(c, seq, setup, traced, fl, sp)
    p = {
        it.key.removeprefix("layers.*."): Grad(it.per_layer * z.e)
        for it in parameter_breakdown(c)
        if it.per_layer is not None
    }
    r = _StageReplay(rp.Affine(0), traced, accumulate)
    r.keep = keep
    cached = setup.checkpoint == "selective"
    if kind == "forward" and setup.checkpoint != "none":
        (rp._amp_layer_forward_unsaved if z.amp else rp._layer_forward_unsaved)(
            r, z, *((p,) if z.amp else ()), cached=cached
        )
    elif kind == "forward":
        rp._amp_layer_forward(r, z, p) if z.amp else rp._layer_forward(r, z)
    else:
        (rp._amp_layer_backward if z.amp else rp._layer_backward)(r, z, p, last=kind == "backward_block0")
    r.best, r.copies = _frontier(r.best), _frontier(r.copies)
    return r


def _frontier(points: dict[int, int]) -> dict[int, int]:
    """The candidate peaks (slope a per sequence, intercept b) that no other one reaches at every B ≥ 0
    (another with a' ≥ a and b' ≥ b): the envelope's maximum is theirs."""
    out, top = {}, None
    for a in sorted(points, reverse=True):
        if top is None or points[a] > top:
            out[a] = top = points[a]
    return out


@lru_cache(maxsize=4096)
def _reduce_grads(cfg: ModelConfig, units: _StageUnits, blocks: int, traced: bool) -> _Part:
    """``perform_reduce_grad`` under FSDP2: ``post_backward`` of every unit in ``all_states`` order (the
    root, then the blocks in order: alike after the first, ``replay._repeat``), each rule 5 (reshard; the
    previous unit's reduce-scatter input freed; the unsharded gradients copied into this one's and freed;
    the sharded gradients allocated), then ``_root_post_backward_final_callback`` frees the last
    reduce-scatter input."""
    ev = FsdpEvents(cfg, FsdpUnits(units.zero3, False, units.root, (units.block,), (0,) * cfg.num_layers))
    fp32 = lambda u: (
        dataclasses.replace(
            u, grads=2 * u.grads, last_grad=2 * u.last_grad, vocab_rows=2 * u.vocab_rows, vocab_extra=2 * u.vocab_extra
        )
        if units.amp
        else u
    )
    root, block = fp32(units.root) if units.root else None, fp32(units.block)
    r = _StageReplay(rp.Affine(0), traced)
    if root:
        ev._reduce(r, root, None)
    ev._reduce(r, block, root)
    repeat(r, blocks - 1, lambda q: ev._reduce(q, block, block))
    r(-block.reduce_in)
    return _Part(r.peak().at(1), r.live.at(1))  # no term in B: the units' bytes


def _at(ch: _Chunks, batch: int) -> _Chunks:
    """``_chunk_lines`` at ``batch`` sequences a micro-batch (its lines are affine in B: one replay
    serves every micro-batch size; under sequence parallel, every B > 1 alike)."""
    at = lambda x: x.at(batch) if isinstance(x, rp.Affine) else x
    part = lambda p: p and _Part(p.peak.at(batch), p.net.at(batch))
    return _Chunks(*(part(p) for p in ch[:4]), at(ch.output), at(ch.input_grad), ch.loss_bytes)


@lru_cache(maxsize=64)
def _embedding(cfg: ModelConfig) -> int:
    return parameter_breakdown(cfg)["token_embeddings"].total


def _stage_sizes(c: ModelConfig, seq: int, setup: TrainingSetup, traced: bool, fl: bool, sp: tuple[int, bool, bool]):
    e = DTYPE_BYTES[setup.param_dtype]
    return Sizes(c, rp.Affine(1), seq, e, setup, not traced, softmax32=fl, sp=sp[0], gather_cat=sp[1], all_reduce=sp[2])


@lru_cache(maxsize=8192)
def _end_lines(
    part: str,
    c: ModelConfig,
    seq: int,
    setup: TrainingSetup,
    traced: bool,
    fl: bool,
    sp: tuple[int, bool],
    first: bool,
    last: bool,
    accumulate: bool,
    vl: int = 0,
) -> _StageReplay:
    """The stage's lines around its blocks (``_chunk_lines`` (1)–(3)) as segments (``replay.apply_segment``),
    the same for every FSDP2 layout, whose events come between them: ``part`` "forward_in" (positions,
    mask, stage 0's embedding), "forward_out" (the last stage's final norm, LM head and logits; forward's
    locals dying), "loss", "backward_loss" (its backward up to the logits' gradient), "backward_head" (the
    LM head's and final norm's backward), "backward_out" (stage 0's embedding backward, or the buffer
    that block 0's backward released).  ``vl``: vocab parallel's rows of the embedding and the LM head on
    this rank (0: none), the single-GPU vocab-parallel replay's lines (``tensor_parallel``: the masked
    lookup, the T·Vl logits, ``loss_parallel``, the whole embedding gradient)."""
    e = DTYPE_BYTES[setup.param_dtype]
    z = _stage_sizes(c, seq, setup, traced, fl, sp)
    V = vl or c.vocab_size  # the logits' columns
    Td, TV, Tr, emb = z.act(c.d_model), z.act(V), z.act(1), _embedding(c) * e
    head = V * c.d_model * e  # the LM head's weight (its gradient): the embedding's unless vocab parallel
    split, Tres = z.sp > 1, z.residual  # sequence parallel: the residual stream's T/M rows
    head2, ck = head // 2, setup.checkpoint  # amp: autocast's bf16 copy of the LM head's weight
    TV2, Td2 = z.bf16.act(V), z.bf16.act(c.d_model)
    le = 4 if fl else z.e  # the loss's bytes (vocab parallel: the logits' its loss reads too)
    if fl and part in ("loss", "backward_loss", "backward_head"):  # the loss reads the fp32 logits
        TV, Tr = 2 * TV, 2 * Tr
    r = _StageReplay(rp.Affine(0), traced, accumulate)
    if part == "forward_in":
        r(+8 * seq)  # positions
        if not z.sdpa:
            r(+seq * seq, +seq * seq, -seq * seq)  # the causal mask
        if first and vl:
            _vocab_embedding_forward(r, z, z.T, Td)  # a masked lookup in the rank's rows, all-reduced (SP: scattered)
        elif first:
            r(+Td)  # embedding lookup
        if first and split and not vl:
            r(+Tres, -Td)  # this rank's S/M positions copied (Replicate -> Shard(1)); the lookup dies
    elif part == "forward_out":
        if last:
            rp._norm_forward(r, z, z.rows, c.d_model)  # ln_final
            rp._sp_all_gather(r, z)  # its output gathered for the LM head (saved by it)
            if z.amp:  # weight copy, input copy (saved), bf16 logits; ln_final's fp32 output(s) die
                r(+head2, +Td2, +TV2, -Td, -Tres * split)
            r(+TV)  # logits (amp: logits.float())
            if split and not z.amp:
                r(-Tres)  # ln_final's own output dies
            if fl:
                r(+2 * TV)  # logits.float()
        if ck == "none":
            r(-8 * seq)  # positions die with forward's locals (a checkpoint's closure keeps them)
        if last and (z.amp or fl):
            r(-TV2)  # the bf16 logits die with forward's locals
        if last and e != 4:
            r(-Tres)  # 16-bit: the last residual stream dies (ln_final kept an fp32 copy)
    elif part == "loss" and vl:  # ``loss_parallel``'s, less the logits' release
        _loss_parallel_forward(r, z.T, vl, le, keep_logits=True)
    elif part == "loss":  # cross-entropy, as one GPU's, less the logits' release
        r(+Tr, +TV, -Tr)  # z = logits − max
        r(+TV, +Tr, +Tr, +Tr, +Tr)  # exp (saved); Σ (saved); log; gather; subtract
        r(+le)  # mean (the loss)
        r(-Tr, -Tr, -Tr)  # (gather keeps z; the logits stay)
    elif part == "backward_loss" and vl:  # the seed, ``loss_parallel``'s backward: the logits' gradient left
        _loss_parallel_backward(r, z.T, vl, le)
    elif part == "backward_loss":  # d loss; mean, gather (a copy when traced), log, exp backward: one GPU's
        r(+le, +Tr, +Tr, +TV, Copy(TV), -Tr, -TV)
        r(+Tr, -Tr, -Tr, +TV, -Tr, -TV, Copy(TV), -TV)
    elif part == "backward_head":
        if fl:
            r(+TV2, -TV, +Grad(head), +Td, -TV2, -Td)  # logits.float() backward; lm_head: dW, dx
        elif z.amp:
            r(+TV2, -TV)  # logits.float() backward
            r(+head2, +Td2, -TV2, -head2, -Td2, +Td, -Td2, +Grad(head), -head2)  # lm_head
        else:
            r(+Grad(head), +Td, -TV, -Td)  # lm_head: dW, dx; ln_final output released
        if split and vl:  # vocab parallel's column-wise head: dx reduce-scattered (no SP: all-reduced)
            rp._sp_reduce_scatter(r, z, Td)
        elif vl:
            r(+Td, -Td)
        elif split:  # dx split along the sequence (the backward of Shard(1) -> Replicate); dx dies
            r(+Tres, -Td)
        rp._norm_backward(r, z, z.rows, c.d_model, residual=False, sp=split)  # ln_final
    elif part == "backward_out":
        if first and split:  # the gradient of this rank's S/M positions gathered; the local one dies
            rp._sp_all_gather(r, z)
            r(-Tres)
        if first and vl:  # DTensor's embedding backward: the whole (V, d) gradient (``_vocab_embedding_backward``)
            r(+Grad(emb), -Td)
        elif first:
            r(+Grad(emb), Copy(emb), -Td)  # embedding backward: zeros, index_put
        elif not (e != 4 and ck == "none"):
            r(+Tres)  # block 0 released its input, the buffer, which stays
    return r


@lru_cache(maxsize=8192)
def _chunk_lines(
    cfg: ModelConfig,
    seq: int,
    setup: TrainingSetup,
    blocks: int,
    first: bool,
    last: bool,
    traced: bool,
    units: _StageUnits | None = None,
    sharded: bool = False,
    sp: tuple[int, bool, bool] = (1, False, False),
    passes: str = "both",
    vl: int = 0,
) -> _Chunks:
    """One micro-batch of B sequences (the lines affine in B) on a stage of ``blocks`` blocks (``first``:
    it holds the embedding; ``last``: the
    final norm, LM head and the loss), each line as ``replay.replay_training_step``'s, with what differs:

    1. forward (``PipelineStage.forward_one_chunk`` -> ``TransformerLM.forward`` of the pruned model): the
       positions and causal mask, then stage 0's embedding lookup; elsewhere the input is the receive
       buffer (``_retrieve_recv_activations``: the buffer itself, ``requires_grad_``), already counted.
       A 16-bit model without checkpointing frees block 0's input at the block's end (its norms keep fp32
       copies): on a later stage that is the buffer, so its bytes come back (+T·d·e).  The output is
       kept (``fwd_cache``): hidden states, or on the last stage the logits (fp32 under amp-bf16: the
       bf16 logits die with forward's locals), whose lifetime ``_schedule`` follows;
    2. loss (last stage, ``_maybe_compute_loss``: ``cross_entropy`` outside autocast): the single-GPU
       replay's lines, except that the logits do not die (the schedule holds them); the loss scalar
       stays in ``_internal_losses`` until ``_update_losses`` clears it at the step's end;
    3. backward (``backward_one_chunk`` -> ``stage_backward``: ``torch.autograd.backward`` from the loss,
       or from the output with the gradient receive buffer): the last stage replays the loss's, head's and
       final norm's backward as one GPU does; elsewhere the top block's incoming gradient is the buffer,
       so its first residual join keeps it (``_StageReplay.keep``).  On a later stage the block-0 input's
       release (fp32: ln1's saved input; under checkpointing: the frame) frees the buffer, which stays:
       + T·d·e after the blocks; its gradient (``AccumulateGrad`` on the leaf, read back as
       ``grads_input``, ``val.grad = None``) stays in ``bwd_cache`` (``_schedule`` follows it); stage 0's
       embedding backward is one GPU's.  Later backwards accumulate (``_StageReplay.accumulate``).  The
       gradient seed dies with the backward; the loss stays (2).

    ``units``: FSDP2's events on the stage (``_StageUnits``), for a forward or backward that finds the
    units ``sharded`` (gathering them) or unsharded (``_StageUnits`` says which); ``passes``: "forward"
    (forward and loss), "backward" (the two backwards) or "both".  ``sp``: (M, B > 1) of a
    sequence-parallel rank (``cfg`` the TP-local model; ``Sizes.gather_cat``): the residual stream, the
    stage's input and output at T/M rows; stage 0 splits its embedding output, the last stage gathers
    its final norm's output for the LM head and splits the head's input gradient (one GPU's lines).
    Tensor parallel without it is the TP-local model's replay, as one TP rank's."""
    c = cfg.with_layers(blocks)
    ev = _StageEvents(units, sharded, blocks, last)  # no units: no events
    fl = units is not None and units.amp  # FSDP2's bf16 policy: ``setup`` is the bf16 model it runs
    e = DTYPE_BYTES[setup.param_dtype]
    z = _stage_sizes(c, seq, setup, traced, fl, sp)
    Tres, ck = z.residual, setup.checkpoint  # the residual stream (T/M rows under sequence parallel)
    rest = cfg.with_layers(blocks - 1) if blocks > 1 else None  # the blocks but one, in runs
    ends = lambda part, accumulate=False: _end_lines(part, c, seq, setup, traced, fl, sp, first, last, accumulate, vl)

    one = cfg.with_layers(1)  # a block's segment is any stage's
    block = lambda kind, accumulate=False, keep=0: _block_lines(one, seq, setup, traced, fl, kind, accumulate, keep, sp)
    body = lambda q, m: rp.apply_segment(q, block("forward"))
    input_back = not first and e != 4 and ck == "none"  # (1) block 0 freed its input, the buffer
    forward = loss = None
    if passes != "backward":
        r = _StageReplay(rp.Affine(0), traced)
        ev.root_pre_forward(r)
        rp.apply_segment(r, ends("forward_in"))
        ev.block_pre_forward(r, 0)
        body(r, None)  # block 0
        if input_back:
            r(+Tres)
        ev.block_post_forward(r, 0)
        if blocks > 1:
            run = lambda q, m: (ev.block_pre_forward(q, 1), body(q, m), ev.block_post_forward(q, 1))
            rp._layer_runs(r, rest, None, False, run)
        rp.apply_segment(r, ends("forward_out"))
        ev.root_post_forward(r)
        forward = _Part(r.peak(), r.live)
        loss = _Part(ends("loss").peak(), ends("loss").live) if last else None  # (2)
    le = 4 if fl else z.e  # the loss's bytes (fp32 logits under FSDP2's bf16 policy; ``loss_parallel``'s too)

    backward = [None, None]
    for accumulate in (False, True) if passes != "forward" else ():  # (3)
        acc = accumulate and not fl  # amp: FSDP2 folds them (_StageEvents)
        r = _StageReplay(rp.Affine(0), traced, acc)
        ev.first_backward = not accumulate
        if last:
            rp.apply_segment(r, ends("backward_loss", acc))
            ev.root_pre_backward(r)  # on the logits' gradient
            rp.apply_segment(r, ends("backward_head", acc))
        ev.block_pre_backward(r, blocks - 1)
        if not last:  # stage 0's root: its hook on the stage's output, after the top block's
            ev.root_pre_backward(r)
        # the top block's incoming gradient: the buffer (``keep``), but on the last stage
        rp.apply_segment(r, block("backward_block0" if blocks == 1 else "backward", acc, 0 if last else 1))
        ev.block_post_backward(r, blocks - 1)
        if blocks > 1:
            rest_backward = lambda q, m, acc=acc: (
                ev.block_pre_backward(q, 1),
                rp.apply_segment(q, block("backward", acc)),
                ev.block_post_backward(q, 1),
            )
            rp._layer_runs(r, rest, None, True, rest_backward)
            ev.block_pre_backward(r, 0)
            rp.apply_segment(r, block("backward_block0", acc))
            ev.block_post_backward(r, 0)
        rp.apply_segment(r, ends("backward_out", acc))
        ev.root_post_backward(r)
        if last:
            r(-le)  # the gradient seed (vl: its backward freed it; ``nll_loss``'s total weight dies with the graph)
        backward[accumulate] = _Part(r.peak(), r.live)
    TV = z.act(vl or c.vocab_size) * (2 if fl else 1)  # the logits the stage keeps (fp32 under the bf16 policy)
    output = TV if last else Tres
    return _Chunks(forward, loss, backward[0], backward[1], output, 0 if first else Tres, le if last else 0)


def _schedule(
    P: int, m: int, stage: int, buffers: int, ch: _Chunks, fsdp: tuple[_Chunks, bool, _Part] | None = None
) -> tuple[PhaseBytes, PhaseBytes]:
    """(forward, backward) bytes above the baseline of stage ``stage`` under ``Schedule1F1B._step_microbatches``
    (torch/distributed/pipelining/schedules.py), followed step by step:

    1. ``_initialize_stage``: the receive buffers (``schedule_buffers``);
    2. warm-up, w = min(m, P − s) times: ``forward_one_chunk`` (its output in ``fwd_cache`` and in the loop's
       ``output``), ``fwd_sends = get_fwd_send_ops`` (the output, detached: the same storage), the loss;
    3. steady state: ``backward_one_chunk`` (pops ``fwd_cache``; the output dies when no other reference
       is left), ``bwd_sends = get_bwd_send_ops`` (pops ``bwd_cache``: the input gradient stays in the ops
       list until the next ``get_bwd_send_ops``), then, until the m-th forward, a forward, its loss and
       ``fwd_sends``; the previous ``output`` and ``fwd_sends`` are dropped as they are rebound;
    4. cool-down: the remaining backwards, each with its ``bwd_sends``;
    5. ``_update_losses`` clears the losses; ``perform_reduce_grad`` divides the gradients in place; the
       method returns: ``output``, ``fwd_sends`` and ``bwd_sends`` die.
    6. The steady state is periodic: once an iteration starts in the state the previous one started in
       (the same holders of the in-flight outputs, relative to the next backward's micro-batch, and the
       same FSDP2 state), each later one repeats it, with the same net change and highest point: they
       are skipped in O(1), all but the last (a 1F1B step of m micro-batches costs O(P) here, not O(m)).
    The "forward" phase ends where the first backward starts (``measure_stage``'s boundary).

    ``fsdp``: (the chunks that gather the units, zero 3, ``perform_reduce_grad``'s reductions) beside
    FSDP2: a forward or backward that finds the units sharded runs the gathering chunk
    (``_StageEvents``); a forward leaves them sharded under zero 3, a backward leaves them unsharded;
    the reductions run in (5)."""
    first, last = stage == 0, stage == P - 1
    gathering, zero3, reduce = fsdp if fsdp else (ch, False, None)
    sharded = [fsdp is not None]
    live, peak, phase = 0, {"forward": 0, "backward": 0}, ["forward"]
    fwd_end = 0

    top = [0]  # the highest point of the current steady-state iteration

    def run(part: _Part) -> None:
        nonlocal live
        peak[phase[0]] = max(peak[phase[0]], live + part.peak)
        top[0] = max(top[0], live + part.peak)
        live += part.net

    holders: dict[int, set[str]] = {}  # micro-batch -> what holds its output
    held = {"output": None, "fwd_sends": None, "bwd_sends": None}

    def release(i: int, who: str) -> None:
        nonlocal live
        holders[i].discard(who)
        if not holders[i]:
            del holders[i]
            live -= ch.output

    def rebind(who: str, i: int | None) -> None:
        nonlocal live
        old, held[who] = held[who], i
        if who == "bwd_sends":
            live -= ch.input_grad if old is not None else 0
        elif old is not None:
            release(old, who)

    def forward(i: int) -> None:
        run((gathering if sharded[0] else ch).forward)
        sharded[0] = zero3
        holders[i] = {"fwd_cache"}
        rebind("output", i)
        holders[i].add("output")

    def fwd_sends(i: int) -> None:
        if not last:
            holders[i].add("fwd_sends")
            rebind("fwd_sends", i)

    def loss(i: int) -> None:
        if last:
            run(ch.loss)

    def backward(j: int) -> None:
        nonlocal fwd_end
        if j == 0:
            fwd_end = live
            phase[0] = "backward"
            peak["backward"] = live
        part = gathering if sharded[0] else ch
        run(part.first_backward if j == 0 else part.later_backward)
        sharded[0] = False
        release(j, "fwd_cache")
        if not first:
            rebind("bwd_sends", j)

    live += buffers  # 1
    peak["forward"] = live
    f = b = 0
    for _ in range(min(m, P - stage)):  # 2
        forward(f)
        fwd_sends(f)
        loss(f)
        f += 1
    previous = None
    while True:  # 3
        state, start = _steady_state(b, holders, held, sharded[0]), live
        top[0] = live
        backward(b)
        b += 1
        if f == m:
            break
        forward(f)
        loss(f)
        fwd_sends(f)
        f += 1
        n = m - f - 1  # iterations left before the last one
        if state == previous and n > 0:  # (6) periodic: skip n iterations
            step, high = live - start, top[0] - start
            peak["backward"] = max(peak["backward"], live + high, live + (n - 1) * step + high)
            live, f, b = live + n * step, f + n, b + n
            holders = {i + n: h for i, h in holders.items()}
            held.update({k: None if i is None else i + n for k, i in held.items()})
        previous = state
    while b < m:  # 4
        backward(b)
        b += 1
    live -= m * ch.loss_bytes  # 5
    if reduce is not None:
        run(reduce)
    for who in held:
        rebind(who, None)
    return PhaseBytes(peak["forward"], fwd_end), PhaseBytes(peak["backward"], live)


def _steady_state(b: int, holders: dict[int, set[str]], held: dict[str, int | None], sharded: bool) -> tuple:
    """``_schedule``'s state at a steady-state iteration's start, relative to micro-batch ``b``."""
    rel = lambda i: None if i is None else i - b
    return sharded, tuple(sorted((i - b, frozenset(h)) for i, h in holders.items())), tuple(map(rel, held.values()))


def _flat(layout: ParallelLayout) -> ParallelLayout:
    """The layout of one stage's ranks: without the pipeline."""
    return _flat_of(layout.dp, layout.zero, layout.tp, layout.sequence_parallel, layout.vocab_parallel, layout.ep)


@lru_cache(maxsize=1024)
def _flat_of(dp: int, zero: int, tp: int, sp: bool, vp: bool, ep: int) -> ParallelLayout:
    """``_flat``, cached on the fields it keeps."""
    return ParallelLayout(dp=dp, zero=zero, tp=tp, sequence_parallel=sp, vocab_parallel=vp, ep=ep)


def pipeline_slots(k: int, pp: int, v: int = 1) -> float:
    """The busiest pipeline rank's compute time of one step, in units of one micro-batch through all of
    its chunks: its k micro-batches take k·v chunk-slots, and filling and draining the pipeline pp − 1
    more, each 1/v of a micro-batch (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training
    on GPU Clusters Using Megatron-LM", §2.2.1–2.2.2: bubble fraction (pp − 1)/k under 1F1B, (pp − 1)/(v·k)
    interleaved): (k·v + pp − 1) / v, so k + pp − 1 without virtual stages and k without pp."""
    return (k * v + pp - 1) / v if pp > 1 else float(k)


def interleaved_order(pp: int, v: int, m: int, rank: int) -> list[tuple[bool, int]]:
    """(forward?, local chunk j: model stage rank + j·pp) of each computation pipeline rank ``rank`` runs
    in one step of torch 2.13's ``ScheduleInterleaved1F1B`` (torch/distributed/pipelining/schedules.py,
    ``_calculate_single_rank_operations`` -> ``_get_1f1b_rank_ops``; ``_get_warmup_ops``): rounds of
    r = m // max(1, m // pp) micro-batches; w = min((v − 1)·r + 2(pp − 1 − rank), m·v) warm-up forwards;
    then forward-backward pairs until the m·v forwards are done; then the remaining backwards.  Forward
    op i runs chunk (i // r) mod v, backward op i (counted from w) chunk v − 1 − ((i − w) // r) mod v."""
    per_round = m // max(1, m // pp)
    ops = m * v
    warmup = min((v - 1) * per_round + 2 * (pp - 1 - rank), ops)
    fwd = lambda i: (i // per_round) % v
    bwd = lambda i: v - 1 - ((i - warmup) // per_round) % v
    order = [(True, fwd(i)) for i in range(warmup)]
    for i in range(warmup, ops):
        order += [(True, fwd(i)), (False, bwd(i))]
    return order + [(False, bwd(i)) for i in range(ops, ops + warmup)]


def interleaved_rank_step(
    cfg: ModelConfig,
    seq: int,
    batch: int,
    setup: TrainingSetup,
    layout: ParallelLayout,
    rank: int,
    mode: str = "plain",
    dp_rank: int | None = None,
):
    """(step, model states, saved activations at the first backward) of pipeline rank ``rank`` under
    interleaved 1F1B (data-parallel rank ``dp_rank``, default ``interleaved_dp_rank``), REPLAYED where
    ``stage_replayed`` (alone or beside DDP, ZeRO-1, FSDP2, TP): each chunk's forward,
    loss and backward (``_stage_parts`` of its stage in ``ParallelLayout.as_chunks``: one micro-batch on its
    blocks, as 1F1B's stages replay it) placed in torch 2.13's ``ScheduleInterleaved1F1B`` order
    (``_interleaved_schedule``); the baseline and the receive buffers each chunk's (``interleaved_rank_estimate``).
    "optimizer_step": one AdamW per chunk (torchtitan's ``OptimizersContainer``), stepped in turn over all
    the rank's gradients, then ``zero_grad``.  Elsewhere the ESTIMATE (``interleaved_rank_estimate``)."""
    rp.check_mode(mode)
    check_stage_call(cfg, seq, layout, rank)
    layout, dp_rank = layout.shard_rank(dp_rank)  # HSDP: its shard group's FSDP2 rank (``parallel`` rule 8)
    if not stage_replayed(cfg, setup, layout):
        return interleaved_rank_estimate(cfg, seq, batch, setup, layout, rank, dp_rank)
    lay, S, L = layout.as_chunks(), layout.stages, cfg.num_layers
    chunks = layout.chunks(rank)
    dp_rank = interleaved_dp_rank(cfg, setup, layout, rank) if dp_rank is None else dp_rank
    parts = [_stage_parts(cfg, seq, batch, setup, lay, _like(L, S, c), mode, dp_rank) for c in chunks]
    st, base, buffers, _, act = _interleaved_first_backward(cfg, seq, batch, setup, layout, rank, dp_rank)
    fsdp = None
    if parts[0][4] is not None:  # FSDP2: each chunk's (gathering chunks, zero 3, reductions, UNSHARD's issue and wait)
        units = [_StageUnits.of(cfg, setup, lay, c) for c in chunks]
        blocks = [len(stage_layers(L, S, c)) for c in chunks]
        explicit = [_explicit_unshard(u, n, mode == "traced") for u, n in zip(units, blocks, strict=True)]
        fsdp = [(*p[4], *x) for p, x in zip(parts, explicit, strict=True)]
    fwd, bwd = _interleaved_schedule(layout, rank, buffers, [p[3] for p in parts], fsdp)
    opt = PhaseBytes(base + bwd.end + max(p[5] for p in parts), base + buffers)
    step = StepMemory(
        base, PhaseBytes(base + fwd.peak, base + fwd.end), PhaseBytes(base + bwd.peak, base + bwd.end), opt
    )
    return step, st, act


def _interleaved_schedule(
    layout: ParallelLayout, rank: int, buffers: int, chs: list, fsdps: list | None = None
) -> tuple[PhaseBytes, PhaseBytes]:
    """(forward, backward) bytes above the baseline of pipeline rank ``rank`` under
    ``_PipelineScheduleRuntime._step_microbatches`` running ``ScheduleInterleaved1F1B``'s actions
    (``interleaved_order``; ``_add_send_recv`` puts each compute action's send right after it):

    1. ``_initialize_stages``: every chunk's receive buffers (``buffers``);
    2. FORWARD: ``forward_one_chunk`` (its output kept in the chunk's ``fwd_cache``; the runtime keeps no
       other reference: ``output`` is a local of ``_perform_action``) and, on the last stage, the loss
       (kept in ``_internal_losses``); SEND_F's ops list holds a detached view of the output and dies
       with ``_batch_p2p``'s call;
    3. FULL_BACKWARD: ``backward_one_chunk`` (the chunk's first backward keeps each gradient as ``.grad``,
       later ones accumulate) pops ``fwd_cache`` (the output dies); SEND_B right after it pops
       ``bwd_cache`` (the input gradient dies with its ops list);
    4. ``_update_losses`` clears the losses.
    The "forward" phase ends where the rank's first backward starts.
    7. The steady state is periodic (``_periodic``): once a period starts in the state the previous one started
       in (the chunks' FSDP2 flags, which have run a backward, which are reduced) with the same actions ahead,
       each later one repeats it, with the same net change and highest point: they are skipped in O(1), up to
       the end of the periodic stretch and short of any chunk's last backward (a step costs O(pp·v), not O(m·v)).

    ``fsdps``: beside FSDP2, each chunk's (gathering chunks, zero 3, reductions, UNSHARD's issue, its wait,
    RESHARD's release), along the runtime's FSDP actions (``_runtime_actions``, ``_add_unshard_reshard``):
    before a computation, RESHARD of the active chunks not among the next 3 the rank computes (its unsharded
    parameters freed, where FSDP2 has not resharded them already), then UNSHARD of those not active (issued:
    copy-in, all-gather output); a chunk's first computation after its UNSHARD waits for it
    (``_assert_unsharded``); a forward or backward that finds the chunk sharded (ZeRO-3 reshards after each
    forward) runs the gathering chunk; REDUCE_GRAD (``perform_reduce_grad``: reduce-scatter, reshard) follows
    each chunk's last backward and its send."""
    live, fwd_end, peak = buffers, None, {"forward": buffers, "backward": 0}
    started, done = [False] * len(chs), [0] * len(chs)
    phase = "forward"
    fsdps = fsdps or [None] * len(chs)
    sharded = [f is not None for f in fsdps]  # FSDP2's own view: every unit sharded until the runtime's UNSHARD
    waiting = [False] * len(chs)
    pick = lambda j: fsdps[j][0] if sharded[j] else chs[j]
    m, top = layout.micro_batches, [0]  # top: the highest point since the last period's start (7)

    def run(part: _Part) -> None:
        nonlocal live
        peak[phase] = max(peak[phase], live + part.peak)
        top[0] = max(top[0], live + part.peak)
        live += part.net

    acts, start, span, end = _periodic(layout.pp, len(chs), m, rank, fsdps[0] is not None)
    last, k = None, 0  # last: (flags, live) at the previous period's start
    while k < len(acts):
        if k >= start and (k - start) % span == 0 and phase == "backward":  # (7) a period's start
            flags = (tuple(sharded), tuple(waiting), tuple(started), tuple(n >= m for n in done))
            n = min((end - k) // span, *((m - 1 - x) // (span // 2 // len(chs)) for x in done))
            if last is not None and last[0] == flags and n > 0:
                step, high = live - last[1], top[0] - last[1]
                peak[phase] = max(peak[phase], live + high, live + (n - 1) * step + high)
                live, k = live + n * step, k + n * span
                done = [x + n * span // 2 // len(chs) for x in done]
            last, top[0] = (flags, live), live
        forward, j, evict, fetch = acts[k]
        k += 1
        ch = chs[j]
        for e in evict:  # RESHARD: ``reshard()`` of each FSDP module (a no-op where FSDP2 resharded it already)
            live -= 0 if sharded[e] else fsdps[e][5]
            sharded[e] = True
        for f in fetch:  # UNSHARD: ``unshard(async_op=True)`` of each FSDP module: copy-in, all-gather output
            run(fsdps[f][3])
            sharded[f], waiting[f] = False, True
        if waiting[j]:  # ``_assert_unsharded``: the chunk's first action after its UNSHARD waits for it
            run(fsdps[j][4])
            waiting[j] = False
        if forward:
            run(pick(j).forward)
            sharded[j] = fsdps[j] is not None and fsdps[j][1]
            if ch.loss is not None:
                run(ch.loss)
            continue
        if fwd_end is None:
            fwd_end, phase = live, "backward"
            peak["backward"] = live
        part = pick(j)
        run(part.later_backward if started[j] else part.first_backward)
        started[j], sharded[j] = True, False
        live -= ch.output + ch.input_grad
        done[j] += 1
        if done[j] == m and fsdps[j] is not None:  # REDUCE_GRAD after the chunk's last backward
            run(fsdps[j][2])
            sharded[j] = True  # ``post_backward`` with ``reshard_after_backward``: the runtime's RESHARD finds it so
    live -= m * sum(ch.loss_bytes for ch in chs)
    return PhaseBytes(peak["forward"], fwd_end), PhaseBytes(peak["backward"], live)


def _runtime_actions(layout: ParallelLayout, rank: int) -> tuple[tuple[bool, int, tuple, tuple], ...]:
    """(forward?, local chunk, chunks RESHARDed, chunks UNSHARDed before it) of each computation of pipeline rank
    ``rank`` beside FSDP2, as torch 2.13's ``_add_unshard_reshard`` (torch/distributed/pipelining/schedules.py,
    ``max_active_stages`` = 3) lowers ``interleaved_order``: before each computation, the next 3 distinct chunks
    the rank computes from it on (``next_stage_indices``) are its active ones: the active chunks not among them are
    resharded, then those not yet active unsharded (in the order they come).  With v <= 3 every chunk is
    unsharded before the first action and none resharded before its last backward."""
    return _actions_of(layout.pp, layout.virtual_stages, layout.micro_batches, rank)


@lru_cache(maxsize=1024)
def _periodic(pp: int, v: int, m: int, rank: int, fsdp: bool) -> tuple[tuple, int, int, int]:
    """(actions, start, span, end) of ``_interleaved_schedule``: the rank's computations with their RESHARDs and
    UNSHARDs (``_runtime_actions``; none without FSDP2), the index of its first backward, the span of one
    period of the steady state (r·v forward-backward pairs: each chunk r forwards and r backwards,
    ``interleaved_order``) and the end of the periodic stretch: every action in [start + span, end) is the one
    a span before it."""
    acts = _actions_of(pp, v, m, rank) if fsdp else tuple((f, j, (), ()) for f, j in interleaved_order(pp, v, m, rank))
    start = next(i for i, a in enumerate(acts) if not a[0])
    span = 2 * v * (m // max(1, m // pp))
    end = start + span
    while end < len(acts) and acts[end] == acts[end - span]:
        end += 1
    return acts, start, span, end


@lru_cache(maxsize=1024)
def _actions_of(pp: int, v: int, m: int, rank: int) -> tuple[tuple[bool, int, tuple, tuple], ...]:
    """``_runtime_actions``, cached on what it reads, in O(m·v): each computation's next 3 distinct chunks
    from its successor's (scanned from the end), ``next_stage_indices``' window."""
    order = interleaved_order(pp, v, m, rank)
    upcoming, ahead = [()] * len(order), ()
    for i in range(len(order) - 1, -1, -1):
        c = order[i][1]
        ahead = (c, *(x for x in ahead if x != c))[:3]
        upcoming[i] = ahead
    active: set[int] = set()
    out = []
    for (forward, j), nxt in zip(order, upcoming, strict=True):
        evict = tuple(sorted(active - set(nxt)))  # frees only: their order moves no peak
        fetch = tuple(c for c in nxt if c not in active)
        active = (active - set(evict)) | set(fetch)
        out.append((forward, j, evict, fetch))
    return tuple(out)


@lru_cache(maxsize=1024)
def interleaved_gathers(layout: ParallelLayout, rank: int) -> tuple[tuple[int, int], ...]:
    """FSDP2's gathering passes of each of pipeline rank ``rank``'s chunks in one interleaved step, as
    (before, from) the rank's first backward (``measure_interleaved_rank``'s phases): each of the runtime's
    UNSHARDs (``_runtime_actions``: before the computation it precedes), then each forward or backward that finds
    the chunk sharded (ZeRO-3: every forward reshards; a backward leaves it unsharded; a RESHARD reshards), along
    ``interleaved_order`` (as ``_interleaved_schedule`` replays them)."""
    zero3 = layout.zero == 3
    sharded, counts, phase = [True] * layout.virtual_stages, [[0, 0] for _ in range(layout.virtual_stages)], 0
    for forward, j, evict, fetch in _runtime_actions(layout, rank):
        for e in evict:
            sharded[e] = True
        for f in fetch:  # issued before the computation: in the phase before it
            counts[f][phase] += 1
            sharded[f] = False
        phase = phase or int(not forward)
        counts[j][phase] += sharded[j]
        sharded[j] = forward and zero3
    return tuple(map(tuple, counts))


@lru_cache(maxsize=1024)
def _explicit_unshard(units: _StageUnits, blocks: int, traced: bool) -> tuple[_Part, _Part, int]:
    """(issue, wait, reshard) of ``_PipelineScheduleRuntime``'s UNSHARD and RESHARD of one chunk under FSDP2:
    ``unshard(async_op=True)`` of each of its FSDP modules in ``modules()`` order (the root, then the blocks)
    copies in and all-gathers (rule 1's first half); the chunk's first action waits (``_assert_unsharded``): each
    unit's copy-out into its unsharded storages, its all-gather output freed; RESHARD's ``reshard()`` of each
    frees the unsharded storages (``FSDPParam.free_unsharded_param``; the unsharded gradients stay)."""
    order = ([units.root] if units.root else []) + [units.block] * blocks
    issue, wait = _StageReplay(rp.Affine(0), traced), _StageReplay(rp.Affine(0), traced)
    for u in order:
        issue(+u.copy_in, +u.output, -u.copy_in)
        u.copy_out(wait)
        wait(-u.output)
    part = lambda r: _Part(r.peak().at(1), r.live.at(1))
    return part(issue), part(wait), sum(u.gathered for u in order)


def _interleaved_kept(cfg, seq, batch, setup, layout, rank, dp_rank):
    """(model states, baseline, receive buffers) of pipeline rank ``rank``'s chunks (``interleaved_rank_estimate``;
    ``setup``: its precision and optimizer, all these read).  The step's ids or targets and the buffers grow with
    m·B; the rest reads neither (``_interleaved_fixed``, cached once for every m and B)."""
    dp_rank = interleaved_dp_rank(cfg, setup, layout, rank) if dp_rank is None else dp_rank
    st, base, ends, buffers = _interleaved_fixed(cfg, seq, setup, layout.as_chunks(), layout.chunks(rank), dp_rank)
    rows = layout.micro_batches * batch  # m·B sequences a step
    return st, base + ends * 8 * rows * seq, buffers * rows


@lru_cache(maxsize=4096)
def _interleaved_fixed(cfg, seq, setup, lay: ParallelLayout, chunks: tuple[int, ...], dp_rank: int):
    """(model states, baseline less the step's ids and targets, how many of ``chunks`` hold the ids or the
    targets, receive buffers per sequence of the step) of the model stages ``chunks`` of ``lay``
    (``ParallelLayout.as_chunks``): ``stage_baseline`` at B = 0 (its int64 ids or targets, 8·m·B·S on stage 0 or
    the last, are the caller's), and ``schedule_buffers``, S per chunk at B = 1 (the caller's m·B per chunk)."""
    S, L = lay.pp, cfg.num_layers
    models = [_like(L, S, c) for c in chunks]  # a chunk's model states are its model's
    st = _sum_states([_states(cfg, setup, lay, c, dp_rank) for c in models])
    base = sum(stage_baseline(cfg, seq, 0, setup, lay, c, dp_rank) for c in models)
    ends = sum((c == 0) + (c == S - 1) for c in models)
    buffers = sum(schedule_buffers(cfg, seq, 1, setup, lay, c) for c in models) // S
    return st, base, ends, buffers


@lru_cache(maxsize=1024)
def _in_flight(pp: int, v: int, m: int, rank: int) -> tuple[frozenset, tuple, frozenset]:
    """The micro-batches in flight per local chunk along ``interleaved_order`` (each forward adds one to
    its chunk, each backward takes one away), as the distinct count vectors: (those up to the first
    backward, the one at it, those after it).  Few: the steady state repeats itself."""
    counts, warm, steady, first = [0] * v, set(), set(), None
    for forward, j in interleaved_order(pp, v, m, rank):
        if not forward and first is None:
            first = tuple(counts)
        counts[j] += 1 if forward else -1
        (warm if first is None else steady).add(tuple(counts))
    return frozenset(warm), first, frozenset(steady)


def interleaved_dp_rank(cfg: ModelConfig, setup: TrainingSetup, layout: ParallelLayout, rank: int) -> int:
    """The data-parallel rank ``interleaved_rank_estimate`` and ``interleaved_rank_step`` take by default on
    pipeline rank ``rank``: under ZeRO-1 (one ``ZeroRedundancyOptimizer`` per chunk, each assigning its
    chunk's tensors) the one, of the chunks' own worst ranks, with the most optimizer state summed over the
    chunks (the lowest on a tie); otherwise 0 (every dp rank alike)."""
    if layout.zero != 1 or layout.dp == 1:
        return 0
    return _owned_dp_rank(cfg, setup, layout.as_chunks(), layout.chunks(rank))


@lru_cache(maxsize=1024)
def _owned_dp_rank(cfg, setup, lay: ParallelLayout, chunks: tuple[int, ...]) -> int:
    """``interleaved_dp_rank`` under ZeRO-1 of the model stages ``chunks`` of ``lay`` (``ParallelLayout.as_chunks``:
    no micro-batch count, so one cache key for every m)."""
    models = [_like(cfg.num_layers, lay.pp, c) for c in chunks]
    held = lambda r: sum(_states(cfg, setup, lay, c, r).optimizer for c in models)
    return max(sorted({_states(cfg, setup, lay, c).rank for c in models}), key=lambda r: (held(r), -r))


def _sum_states(states: list) -> object:
    """One pipeline rank's model states over its chunks: each byte count summed, the largest FSDP2 unit
    the largest of any chunk."""
    first = states[0]
    summed = {
        f.name: (max if f.name == "unsharded_unit_max" else sum)(getattr(x, f.name) for x in states)
        for f in dataclasses.fields(first)
        if f.name != "rank"
    }
    return dataclasses.replace(first, **summed)


@lru_cache(maxsize=4096)
def interleaved_rank_estimate(
    cfg: ModelConfig,
    seq: int,
    batch: int,
    setup: TrainingSetup,
    layout: ParallelLayout,
    rank: int,
    dp_rank: int | None = None,
):
    """(step ESTIMATE, model states, saved activations at the first backward) of pipeline rank ``rank``
    under interleaved 1F1B (``layout.virtual_stages`` v > 1; not replayed).  Its chunks are the model
    stages rank, rank + pp, ... of ``ParallelLayout.as_chunks``; exact, as each chunk's rule is: the model states
    (summed over the chunks), the baseline (each chunk's ``stage_baseline``: its parameters, moments,
    RoPE tables, and the step's ids on stage 0 or targets on the last) and the receive buffers (each
    chunk's ``schedule_buffers``: torch allocates them per ``PipelineStage``).  The estimate, as
    ``_stage_estimate``'s: the saved activations of the chunk micro-batches in flight, followed through
    ``interleaved_order`` (each forward adds its chunk's ``_stage_saved``, each backward frees it), at
    their most; forward peak: the kept bytes + the most in flight before the first backward (+ the last
    stage's cross-entropy transient); backward peak: + the gradients; beside FSDP2 both + every chunk's
    units unsharded (the runtime's UNSHARD actions, ``_add_unshard_reshard``); each backward's own
    transient left out."""
    flat, S, chunks = _flat(layout), layout.stages, layout.chunks(rank)
    st, base, buffers, saved, at_backward = _interleaved_first_backward(cfg, seq, batch, setup, layout, rank, dp_rank)
    warm, _, steady = _in_flight(layout.pp, layout.virtual_stages, layout.micro_batches, rank)
    dot = lambda counts: sum(n * x for n, x in zip(counts, saved, strict=True))
    warm_top = max(map(dot, warm))
    top = max(warm_top, max(map(dot, steady), default=0))
    kept = base + buffers
    r = single_rank_step(cfg, seq, batch, setup, flat, "plain")
    transient = (r.forward.peak - r.forward.end) if S - 1 in chunks else 0
    # FSDP2: the runtime's UNSHARD actions gather whole chunks (up to 3 at once; the estimate holds all) before
    # they compute; ZeRO-3's forwards reshard each unit again, ZeRO-2's keep them to the step's end
    held = st.unsharded_all if layout.fsdp and layout.dp > 1 else 0
    fwd = PhaseBytes(kept + warm_top + transient + held, kept + at_backward + (held if layout.zero == 2 else 0))
    bwd = PhaseBytes(kept + top + st.gradients + transient + held, kept + st.gradients)
    opt = PhaseBytes(kept + st.gradients + st.owned_elements * element_bytes(setup), kept)
    return StepMemory(base, fwd, bwd, opt), st, at_backward


@lru_cache(maxsize=64)
def _states_setup(precision: str, optimizer: str) -> TrainingSetup:
    """The setup of what the model states, baselines and buffers read (the precision and the optimizer): one
    object each, for the cache keys of ``_interleaved_kept``."""
    return TrainingSetup(precision=precision, optimizer=optimizer)


def _interleaved_first_backward(cfg, seq, batch, setup, layout, rank, dp_rank):
    """(model states, baseline, receive buffers, each chunk's saved activations of one micro-batch, the saved
    activations in flight at the rank's first backward) of pipeline rank ``rank``: what
    ``interleaved_rank_estimate`` and ``interleaved_rank_step`` share."""
    states_setup = _states_setup(setup.precision, setup.optimizer)  # all they read
    st, base, buffers = _interleaved_kept(cfg, seq, batch, states_setup, layout, rank, dp_rank)
    flat, S = _flat(layout), layout.stages
    saved = [_stage_saved(cfg, seq, batch, setup, flat, S, c) for c in layout.chunks(rank)]
    first = _in_flight(layout.pp, layout.virtual_stages, layout.micro_batches, rank)[1]
    return st, base, buffers, saved, sum(n * x for n, x in zip(first, saved, strict=True))


@lru_cache(maxsize=16384)
def _stage_saved(cfg, seq, batch, setup, flat: ParallelLayout, stages: int, stage: int) -> int:
    """Saved activations of one micro-batch on stage ``stage`` of ``stages`` (``flat``: its ranks' layout):
    its blocks' share, plus on the last stage the final norm's, LM head's and cross-entropy's."""
    per_layer, head = _activation_split(cfg, seq, batch, setup, flat)
    last = stage == stages - 1
    return len(stage_layers(cfg.num_layers, stages, stage)) * per_layer + (head if last else 0)


def _stage_estimate(
    cfg: ModelConfig,
    seq: int,
    batch: int,
    setup: TrainingSetup,
    layout: ParallelLayout,
    stage: int,
    rank: int | None = None,
):
    """(step ESTIMATE, model states, saved activations) of stage ``stage`` where the stage is not replayed
    (``stage_replayed``: beside DDP/ZeRO-1 × TP, a mixture of experts).  Stage s keeps
    k = min(P − s, m) micro-batches' saved activations (1F1B's warm-up depth); peak: its baseline
    (``stage_baseline``) + the receive buffers + k × its activations (the forward's end: ``stage_floor``)
    + its gradients + the last stage's cross-entropy transient (the single-GPU replay's forward peak
    above its forward end).  It leaves out each backward's own transient."""
    flat = _flat(layout)
    r = single_rank_step(cfg, seq, batch, setup, flat, "plain")
    st = _states(cfg, setup, layout, stage, rank)
    last = stage == layout.pp - 1
    one = _stage_saved(cfg, seq, batch, setup, flat, layout.pp, stage)
    base = stage_baseline(cfg, seq, batch, setup, layout, stage, rank)
    kept = base + schedule_buffers(cfg, seq, batch, setup, layout, stage)  # the receive buffers stay
    act = min(layout.pp - stage, layout.micro_batches) * one
    transient = (r.forward.peak - r.forward.end) if last else 0
    fwd = PhaseBytes(kept + act + transient, kept + act)
    bwd = PhaseBytes(kept + act + st.gradients + transient, kept + st.gradients)
    opt = PhaseBytes(kept + st.gradients + st.owned_elements * element_bytes(setup), kept)
    return StepMemory(base, fwd, bwd, opt), st, act


@lru_cache(maxsize=1024)
def _activation_split(cfg, seq, batch, setup, layout) -> tuple[int, int]:
    """(saved bytes per block, saved bytes of everything else) of one micro-batch on one rank."""
    total = saved_activations(cfg, seq, batch, setup, layout)
    one = cfg.with_layers(1)
    two = cfg.with_layers(2)
    per_layer = saved_activations(two, seq, batch, setup, layout) - saved_activations(one, seq, batch, setup, layout)
    return per_layer, total - cfg.num_layers * per_layer
