"""One rank of an FSDP2 or DDP job over transformers' own model, on torch's fake process group (DESIGN.md §9).

``measure_hf_rank`` builds transformers' model as ``measure.hf.build_hf_model`` does (on meta), shards it
as FSDP2 users do with transformers (and as ``measure.parallelize.build_rank`` does for ours):
``fully_shard`` on every decoder layer (transformers' ``GradientCheckpointingLayer``
units), then on the root, ``reshard_after_forward`` for ZeRO-3 (not for ZeRO-2), over a data-parallel mesh
of the layout's world; under amp-bf16 a ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` and no
autocast (torchtitan's recipe: the parameters are gathered in bf16, so every op runs in bf16 and only the
model's own upcasts (RMSNorm, the loss) are fp32).  The sharded parameters are then materialised: FakeTensors
under ``FakeTensorMode`` (``fake=True``, any shape, no data), or real CPU tensors (small shapes).  One
training step (the first: FSDP2's lazy initialisation is part of it) runs under ``distributed.RankTracker``,
and its ``StepMemory`` is returned, phase by phase as the single-device tracker reports it.

DDP (``--zero 0``): transformers' model in ``DistributedDataParallel`` as the HF Trainer wraps it (``wrap_ddp``),
built in the setup's dtype, amp-bf16 under the Trainer's autocast (``hf.HFTrainingStep``, the single-GPU run's); a
tied head tied again after ``to_empty``.  ``steps`` 2 measures the step after the reducer rebuilt its buckets (its
rebuild reads data: real cpu tensors only).

ZeRO-1 (``--zero 1``): DDP with ``ZeroRedundancyOptimizer`` around AdamW (``hf_optimizer``).

TP (``--tp``): transformers' own tensor parallel, ``shard_hf_tp`` (its plan, as ``DistributedConfig(tp_size=M)``
applies it: DTensor parameters), AdamW over two parameter groups, DTensor then plain
(``parallelize.param_groups``: the HF Trainer's decay and no-decay groups for a model without biases, trainer.py
``create_optimizer``; with biases, DTensors all, the Trainer's no-decay group would mix them with the plain norms),
the Trainer's autocast; a tied head built untied and tied after the plan (``untied``), as ``from_pretrained`` does; with ``--dp N --zero 2|3`` then FSDP2 as above over the dp dimension
of the (dp, tp) mesh (not transformers' own ``fsdp_plan``).  Measured on real CPU tensors by the command
(``hf._measure_rank``: FakeTensors change TP's transient peaks).  Pipeline and expert parallel and TP beside DDP
are not run here.  A
mixture of experts runs transformers' ``grouped_mm`` experts, whose shapes need no data; their FakeTensor
kernel takes bf16 only (``measure.hf.check_hf_setup``), so fp32 weights are measured on cpu tensors.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from ..config import AccountingError, ModelConfig
from ..layout import ParallelLayout
from ..names import ADAMW_KWARGS
from ..phases import StepMemory
from ..setup import TrainingSetup


def check_hf_layout(cfg: ModelConfig, layout: ParallelLayout, find_unused: bool = False) -> None:
    """One line for a layout this module does not run (``find_unused``: DDP's ``find_unused_parameters``)."""
    if layout.tp > 1:
        return check_hf_tp_layout(cfg, layout)
    other = layout.pp > 1 or layout.ep > 1 or layout.replicate > 1 or layout.cp > 1
    if other or layout.dp < 2:
        raise AccountingError(
            "transformers' model is measured under data parallel only: DDP, ZeRO-1 (--dp >= 2 --zero 0 or 1) or "
            "FSDP2 (--zero 2 or 3), or under its own tensor parallel (--tp); no pipeline, expert or context "
            "parallel, no HSDP"
        )
    if not layout.fsdp and cfg.indexer and not find_unused:
        raise AccountingError(
            "DDP over DSA's indexer (parameters no gradient reaches) needs find_unused_parameters=True (the HF "
            "Trainer's without checkpointing): with False the reducer fails there"
        )


def check_hf_tp_layout(cfg: ModelConfig, layout: ParallelLayout) -> None:
    """One line for a tensor-parallel job over transformers' model not run here (``analytic.ops.tp.check_tp``)."""
    from ..analytic.ops.tp import check_tp

    try:
        check_tp(cfg, layout)
    except ValueError as err:
        raise AccountingError(str(err)) from None


def shard_hf_tp(model, tp_mesh) -> None:
    """transformers' own tensor parallel over its model, as ``from_pretrained(distributed_config=
    DistributedConfig(tp_size=m))`` applies it (transformers 5.24 ``distributed/mixin.py``
    ``maybe_distribute_model``): the plan resolved from the class's ``_tp_plan`` (Llama's head:
    ``colwise_gather_output``), the config's ``base_model_tp_plan`` and ``embedding_rowwise`` on ``embed_tokens``
    (``init_parallel_plans``), expanded per layer, then ``apply_tensor_parallelism`` on the tp mesh."""
    from transformers.distributed import DistributedConfig
    from transformers.distributed.tensor_parallel import apply_tensor_parallelism

    tp_plan, _, _ = model._resolve_parallel_plans(DistributedConfig(tp_size=tp_mesh.size()))
    apply_tensor_parallelism(model, tp_mesh, tp_plan)


def untied(layout: ParallelLayout):
    """Under TP, the model built with its head untied, as ``from_pretrained`` builds it
    (``get_init_context``: ``initialization.no_tie_weights``), so that the plan shards the embedding and the head
    each (``maybe_distribute_model``); ``tie_weights`` ties them after (``_finalize_model_loading``)."""
    if layout.tp == 1:
        return contextlib.nullcontext()
    from transformers.initialization import no_tie_weights

    return no_tie_weights()


def wrap_ddp(step, dp_mesh, find_unused: bool = False):
    """torch's ``DistributedDataParallel`` around the training step, as the HF Trainer's accelerate builds it
    (``DistributedDataParallelKwargs``' defaults: 25 MiB buckets, ``broadcast_buffers``, no
    ``gradient_as_bucket_view``, no ``static_graph``), with ``find_unused_parameters=find_unused`` (the Trainer's:
    True without gradient checkpointing; with True the reducer reads its used-parameter map's values, which
    FakeTensors have none of: real CPU tensors only, ``measure_hf_rank``) and ``init_sync=False``: the construction's shape check reads the parameters' data, and its broadcast
    of them moves nothing on the fake group (its flat copies die before the step).  The fake group needs the
    all-reduce comm hook (``parallelize.all_reduce_hook``) in place of the default one."""
    from torch.nn.parallel import DistributedDataParallel

    from .parallelize import all_reduce_hook

    group = dp_mesh.get_group()
    ddp = DistributedDataParallel(step, process_group=group, find_unused_parameters=find_unused, init_sync=False)
    ddp.register_comm_hook(group, all_reduce_hook)
    return ddp


def shard_hf_model(model, setup: TrainingSetup, layout: ParallelLayout, dp_mesh) -> None:
    """FSDP2 over transformers' model: each decoder layer (every ``GradientCheckpointingLayer``: Llama's
    ``model.layers``, GPT-2's ``transformer.h``), then the root."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy()
    if setup.autocast:
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    reshard = layout.zero == 3
    from transformers.modeling_layers import GradientCheckpointingLayer

    for layer in [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]:
        fully_shard(layer, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp)


def hf_optimizer(model, setup: TrainingSetup, layout: ParallelLayout, dp_mesh):
    """AdamW over the model's parameters, or under ZeRO-1 torch's ``ZeroRedundancyOptimizer`` around it over the
    data-parallel group (as ``distributed.data_parallel`` builds it for our model)."""
    from .parallelize import param_groups

    kwargs = ADAMW_KWARGS[setup.optimizer]
    if layout.zero != 1:
        return torch.optim.AdamW(param_groups(model), **kwargs)
    from torch.distributed.optim import ZeroRedundancyOptimizer

    group = dp_mesh.get_group()
    return ZeroRedundancyOptimizer(
        param_groups(model), optimizer_class=torch.optim.AdamW, process_group=group, **kwargs
    )


def measure_hf_rank(
    cfg: ModelConfig,
    seq: int,
    batch: int,
    setup: TrainingSetup,
    layout: ParallelLayout,
    rank: int = 0,
    fake: bool = True,
    collectives: list | None = None,
    steps: int = 1,
    listener=None,
    find_unused: bool = False,
) -> StepMemory:
    """The ``StepMemory`` of rank ``rank`` of the FSDP2 or DDP job (see the module docstring); ``batch`` is the
    rank's micro-batch.  ``collectives``: receives the last step's collectives, ``(kind, payload bytes, phase)``
    as ``distributed.CollectiveRecorder`` records them; ``steps``: the step measured is the last of that many
    (DDP rebuilds its buckets after the first); ``listener``: the tracker's (``measure.tracker.StorageTracker``), to
    trace every allocation and release; ``find_unused``: DDP's ``find_unused_parameters`` (``wrap_ddp``)."""
    from ..model import random_tokens
    from .distributed import CollectiveRecorder, RankTracker, init_fake_group
    from .hf import HFTrainingStep, build_hf_model, mark_unreached, model_loss, patched_for
    from .parallelize import job_meshes
    from .tracker import init_optimizer_state

    check_hf_layout(cfg, layout, find_unused)
    if find_unused and fake and not layout.fsdp:
        from ..analytic.ops.ddp import FIND_UNUSED_ON_FAKE

        raise AccountingError(FIND_UNUSED_ON_FAKE)
    if not 0 <= rank < layout.world:
        raise AccountingError(f"rank {rank} is outside the world of {layout.world}")
    init_fake_group(layout.world, rank)
    # amp-bf16: FSDP2's policy casts (the model is built in fp32, no autocast); DDP runs the Trainer's autocast
    built = dataclasses.replace(setup, precision="fp32") if setup.autocast and layout.fsdp else setup
    with untied(layout):
        model = build_hf_model(cfg, built, "meta")
    meshes = job_meshes(layout)
    dp_mesh = meshes.dp
    if layout.tp > 1:
        shard_hf_tp(model, meshes.tp)
    if layout.fsdp:
        shard_hf_model(model, setup, layout, dp_mesh)
    tracker, dev = RankTracker(listener=listener), torch.device("meta" if fake else "cpu")
    mode = contextlib.nullcontext()
    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode

        mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode, patched_for("cpu", fake=fake):
        with tracker:
            model.to_empty(device="cpu")
            if not layout.fsdp:  # ``to_empty`` unties a tied head (FSDP2's shards keep the tie); TP: ``untied``
                model.tie_weights()  # tied again, as ``from_pretrained`` leaves it
            if cfg.indexer and not layout.fsdp:  # AdamW makes no state for the indexer's weights (no gradient)
                probe = HFTrainingStep(model, random_tokens(cfg, batch, seq, device="cpu", seed=1), None)
                mark_unreached(probe, random_tokens(cfg, batch, seq, device="cpu", seed=0), None, model_loss)
                del probe
            if layout.zero == 1 and len({p.dtype for p in model.parameters()}) > 1:
                from ..analytic.ops.ddp import ZERO1_MIXED_DTYPES

                raise AccountingError(ZERO1_MIXED_DTYPES)
            opt = hf_optimizer(model, setup, layout, dp_mesh)
            init_optimizer_state(opt)
            inputs = random_tokens(cfg, batch, seq, device="cpu", seed=0)
            labels = random_tokens(cfg, batch, seq, device="cpu", seed=1)
            step = HFTrainingStep(model, labels, None if layout.fsdp or not setup.autocast else "cpu")
            if not layout.fsdp and layout.tp == 1:
                step = wrap_ddp(step, dp_mesh, find_unused)
        for _ in range(steps - 1):
            _train(step, labels, opt, tracker, CollectiveRecorder(), inputs)
        baseline = tracker.live_bytes(dev)
        comms = CollectiveRecorder()
        _train(step, labels, opt, tracker, comms, inputs)
    if collectives is not None:
        collectives.extend(comms.calls)
    return StepMemory(baseline, **tracker.phase_table(dev))


def _train(step, labels, opt, tracker, comms, inputs) -> None:
    """One training step under ``tracker`` and ``comms`` (the tracker's phases reset at each entry)."""
    from .hf import model_loss

    with tracker, comms:
        with tracker.phase("forward"):
            loss = model_loss(step(inputs), labels)
        comms.phase = "backward"
        with tracker.phase("backward"):
            loss.backward()
            del loss
        comms.phase = "optimizer_step"
        with tracker.phase("optimizer_step"):
            opt.step()
            opt.zero_grad(set_to_none=True)
