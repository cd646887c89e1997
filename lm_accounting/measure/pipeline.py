"""One stage of a pipeline-parallel (1F1B) job, run in this process on torch's fake process group.

The job is torch 2.13's own ``torch.distributed.pipelining``: a ``PipelineStage`` around the live
model pruned to the stage's blocks (torchtitan's way: stage 0 keeps the embedding, the last stage
the final norm and LM head; ``analytic.parallel.stage_layers`` splits the blocks), driven by
``Schedule1F1B`` with its real receive buffers, sends, forwards and backwards in 1F1B order.  Beside
data and tensor parallel the job's mesh is (pp, dp, tp), stages outermost: the pruned stage is given to
``parallelize_module`` (TP, SP), ``fully_shard`` (FSDP2) or DDP (``measure.parallelize.build_rank``).

One intervention, version-guarded (``_PEER_VOTE_TORCH``).  The stage is built *static*: its input and
output metadata are given ((B, S, d) hidden states, S/M positions under sequence parallel; the first
stage's (B, S) token ids, the last stage's (B, S, V) logits), so no pickled metadata is exchanged.  But before the first step every stage votes
on static vs dynamic inference (``PipelineStage._warmup_forward_vote`` / ``_warmup_backward_result``:
an int32 tensor passed stage to stage with ``dist.recv``/``dist.send``), and the fake process group
leaves a received tensor as it was allocated (zeros): the vote would read "dynamic" and fall back to
metadata inference over ``send_object_list``/``recv_object_list``, which the fake backend cannot
serve.  ``StaticPeerStage`` runs the vote's real sends and receives and then holds what every peer
sends, which is statically known: every stage of this job is built by ``_schedule`` with complete
metadata of plain (local) tensors, so each votes static (1) and the product is 1.  Everything else is torch's.

The contents of received activations and gradients are meaningless (never written), their buffers
are real: the memory is what the rank holds in the real job.
"""

from __future__ import annotations

import contextlib
import gc

import torch

from ..config import AccountingError, ModelConfig
from ..layout import ParallelLayout
from ..names import TORCH_DTYPES
from ..phases import StepMemory
from ..setup import TrainingSetup
from .devices import check_live_run
from .distributed import (
    REAL_RUN_PARAMS,
    CollectiveRecorder,
    LocalFlops,
    RankMeasurement,
    RankTracker,
    _materialise,
    _storage_bytes,
    data_parallel,
    flops_off,
    init_fake_group,
    optimizer_state_bytes,
    parameter_count,
)

_PEER_VOTE_TORCH = ("2.13",)  # torch versions whose PipelineStage has the warm-up vote read here


def stage_module(model, cfg: ModelConfig, stages: int, stage: int):
    """Prune the live model (built on meta) to pipeline stage ``stage`` of ``stages``, in place."""
    from torch import nn

    from ..analytic.parallel import stage_layers

    blocks = stage_layers(cfg.num_layers, stages, stage)
    model.layers = nn.ModuleList(model.layers[i] for i in blocks)
    model.first_layer = blocks.start
    if stage > 0:
        model.token_embeddings = None
        if hasattr(model, "position_embeddings"):
            model.position_embeddings = None
    if stage < stages - 1:
        model.ln_final = model.lm_head = None
    return model


def _static_peer_stage():
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining._utils import InferenceMode

    if not torch.__version__.startswith(_PEER_VOTE_TORCH):
        raise AccountingError(
            f"pipeline stages are measured on torch {', '.join(_PEER_VOTE_TORCH)} (its PipelineStage warm-up vote); "
            f"this is torch {torch.__version__}"
        )

    class StaticPeerStage(PipelineStage):
        """``PipelineStage`` whose warm-up vote holds what the peers send on a real process group: the
        vote of a stage built with complete metadata (every stage of this job), 1 = static."""

        def _vote(self, has_backward: bool) -> int:
            return 0 if InferenceMode.needs_dynamic(self._user_meta, has_backward) else 1

        def _warmup_forward_vote(self, has_backward, received_acc=None):
            self._has_backward_vote = has_backward
            return super()._warmup_forward_vote(has_backward, received_acc).fill_(self._vote(has_backward))

        def _warmup_backward_result(self, received_result=None):
            result = super()._warmup_backward_result(received_result)
            return result.fill_(self._vote(self._has_backward_vote))

    return StaticPeerStage


def _stage_metas(cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup, layout: ParallelLayout, stage: int):
    """(input, output) example tensors on meta: token ids or hidden states in, hidden states or
    logits out.  The residual stream is in the parameters' dtype, or bf16 under FSDP2's amp-bf16
    policy (its bf16 parameters compute it; the stage's root casts its floating inputs to bf16); the
    logits in the parameters' dtype (the model's ``logits.float()`` under amp)."""
    dtype = getattr(torch, TORCH_DTYPES[setup.param_dtype])
    stream = torch.bfloat16 if setup.autocast and layout.fsdp else dtype
    rows = seq // layout.tp if layout.sequence_parallel else seq  # sequence parallel: this rank's S/M positions
    hidden = torch.empty(batch, rows, cfg.d_model, dtype=stream, device="meta", requires_grad=True)
    tokens = torch.empty(batch, seq, dtype=torch.long, device="meta")
    logits = torch.empty(batch, seq, cfg.vocab_size, dtype=dtype, device="meta", requires_grad=True)
    return (tokens if stage == 0 else hidden), (logits if stage == layout.pp - 1 else hidden)


def measure_stage(
    cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup, layout: ParallelLayout, stage: int = 0
) -> StepMemory:
    """The step memory of ``measure_stage_rank``."""
    return measure_stage_rank(cfg, seq, batch, setup, layout, stage).step


def measure_stage_rank(
    cfg: ModelConfig,
    seq: int,
    batch: int,
    setup: TrainingSetup,
    layout: ParallelLayout,
    stage: int = 0,
    dp_rank: int | None = None,
) -> RankMeasurement:
    """Stage ``stage`` of ``layout`` (pp > 1, beside data and tensor parallel: DDP, ZeRO-1, FSDP2, TP,
    TP + SP, vocab parallel with ``loss_parallel``; not expert parallel, not DDP/ZeRO-1 × TP), data-parallel rank ``dp_rank`` (default:
    the one with the most optimizer state, ZeRO-1's worst, else the first; TP rank 0), run by torch's
    ``Schedule1F1B`` over ``layout.micro_batches`` micro-batches of ``batch`` sequences, then AdamW,
    under ``RankTracker``.  The job's mesh is (pp, dp, tp), stages outermost (torchtitan's), so the global
    rank is (stage · dp + dp_rank) · tp; the stage's model is pruned first, then parallelized
    (``build_rank``: Megatron splits, FSDP2 per block and at the stage's root; DDP around it, which
    ``PipelineStage`` runs without gradient sync until the last backward).  Phases: "forward" from the
    step's start to the stage's first backward (its 1F1B warm-up forwards), "backward" the rest of the
    schedule (steady state, cool-down, FSDP2's reduce-scatters, the gradient scaling by 1/m),
    "optimizer_step" AdamW + zero_grad.  The baseline holds the stage's (sharded) parameters, AdamW
    state and the step's token ids (stage 0) or targets (the last stage), m·B·S each.  ``rank`` of the
    result is the stage."""
    from ..analytic.parallel import model_states
    from .parallelize import build_rank

    if layout.virtual_stages > 1:  # interleaved 1F1B: ``stage`` is the pipeline rank
        return measure_interleaved_rank(cfg, seq, batch, setup, layout, stage, dp_rank)
    _check(cfg, seq, batch, setup, layout, stage)
    if dp_rank is None:
        dp_rank = model_states(cfg, setup, layout, stage=stage).rank if layout.zero == 1 else 0  # ZeRO-1: the worst
    if not 0 <= dp_rank < layout.dp:
        raise AccountingError(f"data-parallel rank {dp_rank} is outside the {layout.dp} ranks")
    init_fake_group(layout.world, (stage * layout.dp + dp_rank) * layout.tp)
    torch.manual_seed(0)
    model, meshes = build_rank(cfg, setup, layout, stage=stage)
    tracker = RankTracker()
    with tracker:
        _materialise(model, cfg, layout)
        train, opt = data_parallel(model, layout, meshes.dp, setup)
        args, target = _step_inputs(cfg, seq, batch * layout.micro_batches, layout.pp, stage)
    baseline = tracker.live_bytes("cpu")
    schedule = _schedule(train, cfg, seq, batch, setup, layout, stage, meshes.pp.get_group())
    from .attention_flops import install

    install()  # FLOP formulas for the CPU flash kernels (FlopCounterMode's registry counts them as 0)
    comms, flops = CollectiveRecorder(), LocalFlops()
    with tracker, comms, flops, _recorded_p2p() as p2p:
        with _phases(schedule._stage, tracker, comms) as step, _loss_parallel(layout):
            schedule.step(*args, target=target, return_outputs=False)
            step.close()
        grads = _storage_bytes(p.grad for p in model.parameters())
        comms.phase = "optimizer_step"
        with flops_off(flops), tracker.phase("optimizer_step"):
            opt.step()
            opt.zero_grad(set_to_none=True)
    step = StepMemory(baseline, **tracker.phase_table("cpu"))
    sent = comms.totals() | ({"send_recv": (len(p2p), sum(p2p))} if p2p else {})
    params, optimizer = _storage_bytes(model.parameters()), optimizer_state_bytes(opt)
    return RankMeasurement(stage, params, grads, optimizer, step, sent, flops.total, calls=tuple(comms.calls))


@contextlib.contextmanager
def _recorded_p2p():
    """The bytes of every send and receive the schedule posts (its ``fwd_*``/``bwd_*`` batches through
    ``schedules._batch_p2p``; the warm-up vote's, posted without a description, left out)."""
    from torch.distributed.pipelining import schedules

    real, sizes = schedules._batch_p2p, []

    def batch_p2p(ops, desc=None):
        if desc is not None:
            sizes.extend(op.tensor.numel() * op.tensor.element_size() for op in ops)
        return real(ops, desc)

    schedules._batch_p2p = batch_p2p
    try:
        yield sizes
    finally:
        schedules._batch_p2p = real


def _check(cfg, seq, batch, setup, layout, stage) -> None:
    layout.check(cfg, seq)
    if layout.pp == 1 or layout.ep > 1:
        raise AccountingError(
            "a pipeline stage is measured beside data or tensor parallel (pp > 1; no expert parallel)"
        )
    if layout.tp > 1 and layout.dp > 1 and not layout.fsdp:
        raise AccountingError("DDP and ZeRO-1 with tensor parallel are analytic only (torch's DDP takes no DTensor)")
    if not 0 <= stage < layout.pp:
        raise AccountingError(f"stage {stage} is outside the {layout.pp} stages")
    if parameter_count(cfg) > REAL_RUN_PARAMS:
        raise AccountingError(f"a real-tensor run is limited to {REAL_RUN_PARAMS:,} parameters")
    # real CPU tensors: the whole step's ids (m·B·S) must exist, and the stage's predicted peak (the tracker's
    # run, the worst data-parallel rank) must fit the CPU, the single-GPU step's rule
    ids = (("the step's token ids", "micro-batches·B·S", layout.micro_batches * batch * seq, 8),)
    what = "this stage's step (real CPU tensors)"
    check_live_run(cfg, seq, batch, "meta", what, training=True, dtype=setup.param_dtype, extra_tensors=ids)
    from ..analytic.pipeline import stage_step

    need = stage_step(cfg, seq, batch, setup, layout, stage, mode="traced")[0].peak
    check_live_run(cfg, seq, batch, "cpu", what, training=True, dtype=setup.param_dtype, need=need)


def _step_inputs(cfg: ModelConfig, seq: int, rows: int, stages: int, stage: int):
    """The whole step's token ids for stage 0, its targets for the last stage (torchtitan hands the
    first stage the inputs and the last the labels)."""
    from ..model import random_tokens

    args = (random_tokens(cfg, rows, seq, device="cpu", seed=0),) if stage == 0 else ()
    target = random_tokens(cfg, rows, seq, device="cpu", seed=1) if stage == stages - 1 else None
    return args, target


def _schedule(train, cfg, seq, batch, setup, layout, stage, group):
    from torch.distributed.pipelining import Schedule1F1B

    from ..model import cross_entropy

    inputs, outputs = _stage_metas(cfg, seq, batch, setup, layout, stage)
    st = _static_peer_stage()(
        train, stage, layout.pp, torch.device("cpu"), input_args=inputs, output_args=outputs, group=group
    )
    from .distributed import vocab_parallel_cross_entropy

    loss = vocab_parallel_cross_entropy if layout.vocab_parallel else cross_entropy
    return Schedule1F1B(st, layout.micro_batches, loss_fn=loss)


def _loss_parallel(layout: ParallelLayout):
    """Vocab parallel: the schedule's losses and their backwards under ``loss_parallel()``."""
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel() if layout.vocab_parallel else contextlib.nullcontext()


@contextlib.contextmanager
def _phases(stage, tracker, comms):
    """Tracker phase (and the collectives' label) "forward" until the stage's first
    ``backward_one_chunk``, then "backward"; the yielded stack closes the last phase."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(tracker.phase("forward"))
        run = stage.backward_one_chunk

        def first_backward(*args, **kwargs):
            stage.backward_one_chunk = run
            stack.close()
            stack.enter_context(tracker.phase("backward"))
            comms.phase = "backward"
            return run(*args, **kwargs)

        stage.backward_one_chunk = first_backward
        yield stack


def measure_interleaved_rank(
    cfg: ModelConfig,
    seq: int,
    batch: int,
    setup: TrainingSetup,
    layout: ParallelLayout,
    rank: int = 0,
    dp_rank: int | None = None,
) -> RankMeasurement:
    """Pipeline rank ``rank`` (data-parallel rank ``dp_rank``, default ``analytic.pipeline.interleaved_dp_rank``;
    TP rank 0) of an interleaved 1F1B job (``layout.virtual_stages`` v > 1; alone or beside DDP, ZeRO-1,
    FSDP2 or TP with or without SP and vocab parallel): v ``PipelineStage``s, one per chunk (model stages
    rank, rank + pp, ...: ``ParallelLayout.chunks``, each the live model pruned to its blocks over pp·v
    stages, as torchtitan's ``pipeline_module_split`` builds its model parts, then parallelized:
    ``build_rank`` over the job's one mesh), driven by torch's ``ScheduleInterleaved1F1B`` over
    ``layout.micro_batches``, then one AdamW (ZeRO-1: ``ZeroRedundancyOptimizer``) per chunk (torchtitan's
    ``OptimizersContainer``: one optimizer per model part), under ``RankTracker``.  Phases as ``measure_stage_rank``'s: "forward" until the rank's first
    ``backward_one_chunk`` (of any chunk), "backward" the rest of the schedule, "optimizer_step" the AdamW
    steps + zero_grad.  ``rank`` of the result is the pipeline rank."""
    from ..analytic.pipeline import interleaved_dp_rank
    from .parallelize import build_rank, job_meshes

    layout.check(cfg, seq)
    if layout.virtual_stages == 1 or layout.ep > 1:
        raise AccountingError(
            "an interleaved pipeline rank is measured with virtual stages, alone or beside data and tensor "
            "parallel (not expert parallel)"
        )
    if layout.tp > 1 and layout.dp > 1 and not layout.fsdp:
        raise AccountingError("DDP and ZeRO-1 with tensor parallel are analytic only (torch's DDP takes no DTensor)")
    if not 0 <= rank < layout.pp:
        raise AccountingError(f"pipeline rank {rank} is outside the {layout.pp} ranks")
    if parameter_count(cfg) > REAL_RUN_PARAMS:
        raise AccountingError(f"a real-tensor run is limited to {REAL_RUN_PARAMS:,} parameters")
    from ..analytic.pipeline import interleaved_rank_step
    from ..model import random_tokens

    ids = (("the step's token ids", "micro-batches·B·S", layout.micro_batches * batch * seq, 8),)
    what = "this pipeline rank's step (real CPU tensors)"
    check_live_run(cfg, seq, batch, "meta", what, training=True, dtype=setup.param_dtype, extra_tensors=ids)
    need = interleaved_rank_step(cfg, seq, batch, setup, layout, rank, "traced")[0].peak
    check_live_run(cfg, seq, batch, "cpu", what, training=True, dtype=setup.param_dtype, need=need)

    lay, S = layout.as_chunks(), layout.stages
    if dp_rank is None:  # ZeRO-1: the worst (of the chunks' own worst ones)
        dp_rank = interleaved_dp_rank(cfg, setup, layout, rank)
    if not 0 <= dp_rank < layout.dp:
        raise AccountingError(f"data-parallel rank {dp_rank} is outside the {layout.dp} ranks")
    init_fake_group(layout.world, (rank * layout.dp + dp_rank) * layout.tp)
    torch.manual_seed(0)
    meshes = job_meshes(layout)
    tracker = RankTracker()
    models, opts, stages = [], [], []
    with tracker:
        for c in layout.chunks(rank):
            model = build_rank(cfg, setup, layout, stage=c, meshes=meshes)[0]
            _materialise(model, cfg, layout)
            train, opt = data_parallel(model, layout, meshes.dp, setup)
            models.append(model)
            opts.append(opt)
            inputs, outputs = _stage_metas(cfg, seq, batch, setup, lay, c)
            stages.append(
                _static_peer_stage()(
                    train,
                    c,
                    S,
                    torch.device("cpu"),
                    input_args=inputs,
                    output_args=outputs,
                    group=meshes.pp.get_group(),
                )
            )
        first, last = 0 in layout.chunks(rank), S - 1 in layout.chunks(rank)
        rows = batch * layout.micro_batches
        args = (random_tokens(cfg, rows, seq, device="cpu", seed=0),) if first else ()
        target = random_tokens(cfg, rows, seq, device="cpu", seed=1) if last else None
        # FSDP2's ``fully_shard`` (``build_rank``, on meta) leaves a reference cycle holding the root's managed
        # modules (torch 2.13 _fsdp_init.py ``_get_managed_modules``: the recursive ``dfs`` closure keeps its
        # ``modules`` list and ``visited_modules`` set), among them the RoPE module ``_materialise`` replaces: its
        # tables (one pair per chunk built so) would die whenever the cycle collector next runs, during the step.
        # A real job initialises its tables in place; collect the harness's garbage before the baseline.
        gc.collect()
    baseline = tracker.live_bytes("cpu")
    from torch.distributed.pipelining import ScheduleInterleaved1F1B

    from ..model import cross_entropy
    from .attention_flops import install
    from .distributed import vocab_parallel_cross_entropy

    loss = vocab_parallel_cross_entropy if layout.vocab_parallel else cross_entropy
    schedule = ScheduleInterleaved1F1B(stages, layout.micro_batches, loss_fn=loss)
    install()  # FLOP formulas for the CPU flash kernels (FlopCounterMode's registry counts them as 0)
    comms, flops = CollectiveRecorder(), LocalFlops()
    with tracker, comms, flops, _recorded_stage_p2p(stages) as p2p:
        with _phases_multi(stages, tracker, comms) as step, _loss_parallel(layout):
            schedule.step(*args, target=target, return_outputs=False)
            step.close()
        grads = _storage_bytes(p.grad for m in models for p in m.parameters())
        comms.phase = "optimizer_step"
        with flops_off(flops), tracker.phase("optimizer_step"):
            for opt in opts:
                opt.step()
            for opt in opts:
                opt.zero_grad(set_to_none=True)
    step = StepMemory(baseline, **tracker.phase_table("cpu"))
    sent = comms.totals() | ({"send_recv": (len(p2p), sum(p2p))} if p2p else {})
    params = _storage_bytes(p for m in models for p in m.parameters())
    optimizer = sum(optimizer_state_bytes(o) for o in opts)
    return RankMeasurement(rank, params, grads, optimizer, step, sent, flops.total, calls=tuple(comms.calls))


@contextlib.contextmanager
def _recorded_stage_p2p(stages):
    """The bytes of every send and receive the stages' ``get_{fwd,bwd}_{send,recv}_ops`` hand the schedule
    (``_PipelineScheduleRuntime`` posts them through ``_batch_p2p`` without a description)."""
    sizes, names = [], ("get_fwd_send_ops", "get_bwd_send_ops", "get_fwd_recv_ops", "get_bwd_recv_ops")
    real = {(id(st), n): getattr(st, n) for st in stages for n in names}

    def recorded(run):
        def ops(*args, **kwargs):
            out = run(*args, **kwargs)
            sizes.extend(op.tensor.numel() * op.tensor.element_size() for op in out)
            return out

        return ops

    for st in stages:
        for n in names:
            setattr(st, n, recorded(real[id(st), n]))
    try:
        yield sizes
    finally:
        for st in stages:
            for n in names:
                setattr(st, n, real[id(st), n])


@contextlib.contextmanager
def _phases_multi(stages, tracker, comms):
    """``_phases`` over several stages: "forward" until the first ``backward_one_chunk`` of any of them."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(tracker.phase("forward"))
        runs = {id(st): st.backward_one_chunk for st in stages}

        def restore():
            for st in stages:
                st.backward_one_chunk = runs[id(st)]

        def hooked(st):
            def first_backward(*args, **kwargs):
                restore()
                stack.close()
                stack.enter_context(tracker.phase("backward"))
                comms.phase = "backward"
                return runs[id(st)](*args, **kwargs)

            return first_backward

        for st in stages:
            st.backward_one_chunk = hooked(st)
        yield stack
