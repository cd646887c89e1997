"""The layouts of ``layout.ParallelLayout`` applied to the live model with torch.distributed (2.13):
device meshes, Megatron column/row splits through ``parallelize_module`` (with styles that accept the
course's ``Linear``), FSDP2 ``fully_shard`` per block and at the root, DDP's comm hook for the fake
process group, optimizer parameter groups.  Used by ``measure.distributed``."""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import torch

from ..config import AccountingError, ModelConfig
from ..layout import ParallelLayout
from ..setup import TrainingSetup

_JOBS = [0]


class Meshes(NamedTuple):
    """This rank's device meshes: None where the layout has no such dimension."""

    dp: object | None
    tp: object | None
    pp: object | None = None


def job_meshes(layout: ParallelLayout, device_type: str = "cpu") -> Meshes:
    """The job's mesh, pipeline stages outermost, then data parallel, then tensor parallel (torchtitan's
    order: a stage's ranks are consecutive).  A data-parallel dimension exists when dp > 1 or tp = 1.
    HSDP: the data-parallel dimension is two, (dp_replicate, dp_shard) (torchtitan's ``ParallelDims``), and
    the dp mesh is that 2-D mesh, which ``fully_shard`` runs as HSDP (``_fsdp_init._get_mesh_info``)."""
    from torch.distributed.device_mesh import init_device_mesh

    # names unique per job: DTensor's caches compare meshes by shape and names, and would hand a
    # second job in this process the first one's (destroyed) process groups
    _JOBS[0] += 1
    j = _JOBS[0]
    sizes = {"pp": layout.pp if layout.pp > 1 else 0, "dp": layout.dp if layout.dp > 1 or layout.tp == 1 else 0}
    if layout.replicate > 1:
        sizes = {"pp": sizes["pp"], "dp_replicate": layout.replicate, "dp_shard": layout.shard}
    sizes["tp"] = layout.tp if layout.tp > 1 else 0
    dims = {f"{k}{j}": n for k, n in sizes.items() if n}
    mesh = init_device_mesh(device_type, tuple(dims.values()), mesh_dim_names=tuple(dims))
    dp = (f"dp_replicate{j}", f"dp_shard{j}") if layout.replicate > 1 else f"dp{j}" if sizes["dp"] else None
    return Meshes(mesh[dp] if dp else None, *(mesh[f"{k}{j}"] if sizes[k] else None for k in ("tp", "pp")))


def _styles():
    """Column/row-wise styles that accept the course's ``Linear`` (torch's accept only nn.Linear)."""
    from torch import nn
    from torch.distributed.tensor import distribute_module, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    from torch.distributed.tensor.placement_types import Shard

    class Colwise(ColwiseParallel):
        def _partition_linear_fn(self, name, module, device_mesh):
            # every module's own parameters: a ``Linear``'s weight, its ``Bias`` child's bias (Shard(0) each;
            # torch's recursive walk would register "bias.bias" on the Linear)
            for key, param in module.named_parameters(recurse=False):
                module.register_parameter(
                    key, nn.Parameter(distribute_tensor(param, device_mesh, [Shard(0)]), param.requires_grad)
                )

        def _apply(self, module, mesh):
            return distribute_module(
                module,
                mesh,
                self._partition_linear_fn,
                partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
                partial(self._prepare_output_fn, self.output_layouts, self.use_local_output),
            )

    class Rowwise(RowwiseParallel):
        def _apply(self, module, mesh):
            self.desired_input_layouts = (Shard(-1),)
            return distribute_module(
                module,
                mesh,
                self._partition_linear_fn,
                partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
                partial(self._prepare_output_fn, self.output_layouts, self.use_local_output),
            )

    return Colwise, Rowwise


def apply_tensor_parallel(model, mesh, layout: ParallelLayout) -> None:
    """Megatron splits of every block (torchtitan's plan): q/k/v, w1, w3 column-wise; output_proj and
    w2 row-wise; with sequence parallel the norms run on sequence shards and the embedding output is
    split along the sequence (and gathered again before the LM head)."""
    from torch.distributed.tensor.parallel import (
        PrepareModuleInput,
        PrepareModuleOutput,
        SequenceParallel,
        parallelize_module,
    )
    from torch.distributed.tensor.placement_types import Replicate, Shard

    Colwise, Rowwise = _styles()
    sp = layout.sequence_parallel
    for block in model.layers:
        plan = {
            "attn.q_proj": Colwise(),
            "attn.k_proj": Colwise(),
            "attn.v_proj": Colwise(),
            "attn.output_proj": Rowwise(output_layouts=Shard(1)) if sp else Rowwise(),
            "ffn.w1": Colwise(),
            "ffn.w3": Colwise(),
            "ffn.w2": Rowwise(output_layouts=Shard(1)) if sp else Rowwise(),
        }
        if sp:
            plan["ln1"] = SequenceParallel()
            plan["ln2"] = SequenceParallel()
            plan["attn"] = PrepareModuleInput(
                input_layouts=(Shard(1), None, None, None), desired_input_layouts=(Replicate(), None, None, None)
            )
            plan["ffn"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        parallelize_module(block, mesh, plan)
        block.attn.num_heads //= layout.tp  # the local heads: q/k/v hold h/tp and kv/tp heads per rank
        block.attn.num_kv_heads //= layout.tp
    if layout.vocab_parallel:
        apply_vocab_parallel(model, mesh, sp)
    elif sp:  # a pipeline stage holds the embedding (stage 0) or the final norm and head (the last), or neither
        plan = {
            "token_embeddings": PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1)),
            "ln_final": SequenceParallel(),
            "lm_head": PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True
            ),
        }
        parallelize_module(model, mesh, {k: v for k, v in plan.items() if getattr(model, k) is not None})


def apply_vocab_parallel(model, mesh, sp: bool) -> None:
    """torchtitan's vocab-parallel plan (``torchtitan/models/llama3/infra/parallelize.py``
    ``apply_tp`` with loss parallel): the embedding row-wise over the vocabulary
    (``RowwiseParallel(input_layouts=Replicate())``, output all-reduced, or reduce-scattered along the
    sequence under SP), the LM head column-wise with its logits left sharded on the vocabulary
    (``ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)``) for
    ``loss_parallel`` (``vocab_parallel_cross_entropy``).  The embedding looks tokens up with
    ``F.embedding``, what ``nn.Embedding`` (the only embedding torch's ``RowwiseParallel`` takes) runs:
    DTensor shards ``aten.embedding`` row-wise with a masked partial output, while the course's
    ``weight[ids]`` (``aten.index``) would all-gather the table."""
    import types

    import torch.nn.functional as F
    from torch.distributed.tensor import distribute_module
    from torch.distributed.tensor.parallel import RowwiseParallel, SequenceParallel, parallelize_module
    from torch.distributed.tensor.placement_types import Replicate, Shard

    emb, head = model.token_embeddings, model.lm_head  # a pipeline stage holds one of them, or neither
    if emb is not None and head is not None and head.weight is emb.weight:
        raise AccountingError("vocab parallel with tied embeddings is analytic only (the measured job unties them)")

    class RowwiseEmbedding(RowwiseParallel):
        def _apply(self, module, device_mesh):
            self.desired_input_layouts = (Replicate(),)
            return distribute_module(
                module,
                device_mesh,
                self._partition_embedding_fn,
                partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
                partial(self._prepare_output_fn, self.output_layouts, self.use_local_output),
            )

    plan = {}
    if emb is not None:
        emb.forward = types.MethodType(lambda self, ids: F.embedding(ids, self.weight), emb)
        plan["token_embeddings"] = RowwiseEmbedding(
            input_layouts=Replicate(), output_layouts=Shard(1) if sp else Replicate()
        )
    if head is not None:
        Colwise, _ = _styles()
        plan["lm_head"] = Colwise(
            input_layouts=Shard(1) if sp else Replicate(), output_layouts=Shard(-1), use_local_output=False
        )
        if sp:
            plan["ln_final"] = SequenceParallel()
    if plan:
        parallelize_module(model, mesh, plan)


def apply_expert_parallel(model, layout: ParallelLayout):
    """torchtitan's expert parallel (``layout``'s docstring): the ranks as a (dp/ep, ep) mesh, ep
    ranks side by side; each MoE block keeps its E/ep experts and routes through all-to-alls over
    its ep group (``MixtureOfExperts.expert_parallel``).  Returns the dp/ep mesh (the ranks holding the
    same experts), over which FSDP2 shards the expert stacks.  Under HSDP torchtitan's
    (dp_replicate, dp_shard_mod_ep, dp_shard_in_ep) (``ParallelDims._build_mesh_with_ep``): the ep ranks
    consecutive within a shard group, and the experts' mesh the 2-D (dp_replicate, dp_shard_mod_ep), which
    ``fully_shard`` runs as HSDP (``apply_fsdp``'s ``dp_mod_ep_mesh``)."""
    from torch.distributed.device_mesh import init_device_mesh

    j = _JOBS[0]
    outer, inner = f"dp_mod_ep{j}", f"ep{j}"
    if layout.replicate > 1:
        dims = (f"dp_replicate_ep{j}", f"dp_shard_mod_ep{j}", inner)
        mesh = init_device_mesh("cpu", (layout.replicate, layout.shard // layout.ep, layout.ep), mesh_dim_names=dims)
        outer = dims[:2]
    else:
        mesh = init_device_mesh("cpu", (layout.dp // layout.ep, layout.ep), mesh_dim_names=(outer, inner))
    ep = mesh[inner]
    for block in model.layers:
        if block.ffn is None:  # a mixture-of-experts block
            block.moe.expert_parallel(ep.get_group(), layout.ep, ep.get_local_rank())
    return mesh[outer]


def param_groups(model) -> list[dict]:
    """DTensor and plain parameters in separate groups: foreach AdamW runs one group at a time and
    refuses to mix the two (TP leaves the embedding, norms and LM head plain)."""
    from torch.distributed.tensor import DTensor

    params = list(model.parameters())
    split = [[p for p in params if isinstance(p, DTensor)], [p for p in params if not isinstance(p, DTensor)]]
    return [{"params": g} for g in split if g]


def build_rank(
    cfg: ModelConfig,
    setup: TrainingSetup,
    layout: ParallelLayout,
    device_type: str = "cpu",
    stage: int = 0,
    meshes: Meshes | None = None,
) -> tuple[object, Meshes]:
    """(model, meshes) of this rank, built on meta and parallelized over meshes of ``device_type``
    ("cpu", or "cuda" for the plain run on a GPU); not yet materialised.  Under pipeline parallel the
    model is first pruned to stage ``stage`` of the model's ``layout.stages`` (an interleaved rank's chunk:
    ``measure.pipeline.stage_module``), then sharded; ``meshes``: the job's, built once for a rank's chunks."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from ..model import build_model

    meshes = meshes or job_meshes(layout, device_type)
    dp_mesh, tp_mesh = meshes.dp, meshes.tp
    model = build_model(cfg, "meta", setup=setup)
    if layout.pp > 1:
        from .pipeline import stage_module

        stage_module(model, cfg, layout.stages, stage)
        model.sequence_shards = layout.tp if layout.sequence_parallel else 1
    if tp_mesh is not None:
        apply_tensor_parallel(model, tp_mesh, layout)
    expert_mesh = apply_expert_parallel(model, layout) if layout.ep > 1 else None
    if layout.fsdp and dp_mesh is not None:
        mp = MixedPrecisionPolicy()
        if setup.autocast:
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        reshard = layout.zero == 3
        for block in model.layers:
            if expert_mesh is not None and block.ffn is None:  # the experts: their own unit over dp/ep
                fully_shard(
                    block.moe.experts, mesh=expert_mesh, reshard_after_forward=reshard, mp_policy=mp,
                    shard_placement_fn=_expert_placement(cfg, layout),
                )  # fmt: skip
            fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp)
        fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp)
    return model, meshes


def _expert_placement(cfg: ModelConfig, layout: ParallelLayout):
    """torchtitan's rule: shard the expert stacks on dim 1 when (dp/ep)·ep > E, else FSDP2's dim 0 (under HSDP
    ``dp_mod_ep_mesh.size()`` counts the replicas too: r·s/ep·ep = dp)."""
    if layout.dp <= cfg.num_experts:
        return None
    from torch.distributed.tensor.placement_types import Shard

    return lambda param: Shard(1)


def all_reduce_hook(group, bucket):
    """DDP comm hook for the fake group: all-reduce the bucket (a no-op there), return it done."""
    import torch.distributed as dist

    buffer = bucket.buffer()
    dist.all_reduce(buffer, group=group)
    fut = torch.futures.Future()
    fut.set_result(buffer)
    return fut
