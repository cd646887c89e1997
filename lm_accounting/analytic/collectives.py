"""Collectives of one training step on one rank, per kind and phase, with their payload bytes.  No torch.

The payload of a collective is the bytes of its largest tensor: the unsharded buffer of an
all-gather or reduce-scatter, the tensor of an all-reduce or broadcast (what ``CommDebugMode`` and
``measure.distributed.CollectiveRecorder`` see).  The bytes a rank sends over the wire with a ring
algorithm, for a group of n ranks: all-gather and reduce-scatter (n−1)/n · payload, all-reduce
2·(n−1)/n · payload, broadcast and point-to-point 1 · payload; an all-to-all keeps its own 1/n of the
rows and sends (n−1)/n · payload (balanced routing) (``wire_bytes``).

Notation: L layers; T = B·S tokens of the rank's micro-batch; d = d_model; e = bytes per parameter
element (fp32 and amp-bf16: 4, bf16: 2); a = bytes of a matmul output (amp-bf16: 2, else e);
G = every FSDP unit (the root: embedding, final norm, LM head; each block) all-gathered, padded,
in the all-gather dtype (bf16 under amp-bf16's MixedPrecisionPolicy); R = the same in the reduce
dtype (fp32 under amp-bf16).  Per layout (checked against the fake-PG run in tests):

1. FSDP2 zero 3: all-gather 2·(L+1) units, 2·G bytes (each unit before its forward and again
   before its backward; the root too); zero 2: L+1, G.  Reduce-scatter L+1, R.
2. DDP / ZeRO-1 (dp > 1): all-reduce of each gradient bucket, Σ n·e.  The first step has one
   bucket (torch 2.13 ``BucketCapacityConfig.compute_bucket_size_limits``: ``[sys.maxsize]`` unless
   ``find_unused_parameters``); the reducer then rebuilds them in gradient-ready order, 1 MiB for
   the first (``_DEFAULT_FIRST_BUCKET_BYTES``) and 25 MiB after: the steady-state count, taken here
   as the parameters in reverse order (not measured: the fake-PG run measures the first step).  One
   broadcast of the module buffers (the RoPE tables) per forward.  ZeRO-1 adds one broadcast per parameter tensor from its owner after the step, Σ n·e.
3. TP without SP: forward 2·L all-reduces (after output_proj and w2) of T·d·a; backward 5·L
   all-reduces of T·d·e (the input gradients of q, k, v, w1 and w3, each module's own); a
   checkpointed recompute (full or selective) adds L (output_proj's; the early stop skips w2's).
4. TP with SP: forward 2L+1 all-gathers of T·d·e (the two block inputs, the LM head's input) and 2L
   reduce-scatters of T·d·a; backward 2L all-gathers of T·d·a, one of T·d·e and 2L reduce-scatters
   of T·d·e; recompute adds 2L all-gathers of T·d·e and L reduce-scatters of T·d·a (torchtitan's per-op
   checkpointing, ``op``, saves ``reduce_scatter_tensor``'s output: no recompute reduce-scatter); the optimizer
   step all-reduces each sequence-parallel norm's Partial gradient once per AdamW op that reads
   it, 3·(2L+1) all-reduces of d·e (foreach and for-loop: ``lerp_(m, g)``, ``addcmul_(v, g, g)``;
   fused: one op, 2L+1; under FSDP2: once each in backward, (2L+1) of d·g, g the all-gather dtype's
   bytes).
5. FSDP2 with amp-bf16: the parameters the forward sees are bf16 (MixedPrecisionPolicy), so the
   embedding output and the residual stream are bf16: the T·d·e tensors of rules 3–4 are T·d·2.
6. Expert parallel (ep; ``analytic.parallel`` rules 6–7; measured on the fake process group): the
   expert units are gathered and reduced over the dp/ep ranks (group "dp/ep": L_moe units, G_e and
   R_e bytes, as rule 1; none when dp = ep: FSDP2 skips a one-rank mesh), the other units over dp.
   Each MoE layer runs two all-to-alls over the ep ranks in forward (dispatch, combine), their two
   gradients in backward, and the two again in a checkpointed recompute (full, and selective, whose
   policy keeps matmul outputs only).  Payload: the larger of the T·k rows sent and the R_j received
   (rule 7), × d × the compute dtype's bytes (2 under FSDP2's bf16 policy with amp-bf16, else e): with
   balanced routing and E dividing T·k, T·k·d·bytes each way per rank (DeepSpeed-MoE, Rajbhandari et
   al. 2022, §5; torchtitan ``ExpertParallel._token_dispatch``/``_token_combine``).
7. Vocab parallel (TP, ``measure.parallelize.apply_vocab_parallel``): the row-wise embedding's
   partial output all-reduced (reduce-scattered along the sequence under SP), T·d·e; the loss under
   ``loss_parallel`` all-reduces the row max and the sum of exponentials (fp32: T·4 each) and the
   target logit (T·xe, xe the bytes of the logits the loss reads: 2 in bf16, else 4) in forward; the LM
   head's column-wise input gradient all-reduced (SP: reduce-scattered) in backward, T·d·e.  The
   embedding's backward and the loss's backward communicate nothing.
8. Pipeline parallel (1F1B, m micro-batches; torch's ``PipelineStage``): each micro-batch's hidden
   states (B, S, d) cross each stage boundary forward and their gradient backward, in the residual
   stream's dtype (e: fp32 under amp-bf16, whose block outputs add bf16 into the fp32 stream; 2 under
   FSDP2's bf16 policy, rule 5).  Stage 0 and the last stage have one neighbour: m transfers of
   T·d·h per phase; a middle stage has two, 2m (a receive and a send each).  Measured per stage
   (``measure.pipeline.measure_stage_rank`` records the schedule's ``fwd_*``/``bwd_*`` sends and receives).
   Under sequence parallel the stages pass this rank's S/M positions: T/M rows.
9. FSDP2 beside pipeline parallel: a stage's units (its blocks, and its root where the root holds
   parameters) over its dp ranks.  ``PipelineStage`` runs every backward without resharding or
   reducing (``set_reshard_after_backward(False)``, ``set_requires_gradient_sync(False)``) and reduces
   once, in ``perform_reduce_grad``: one reduce-scatter per unit per step.  A unit is gathered by each
   forward or backward that finds it sharded (``sharded_passes``): zero 2, once per step; zero 3,
   m + 1 times (each forward reshards).  DDP's buckets and the DP collectives cover the stage's
   parameters.  Measured per stage as rule 8.
10. Tensor parallel beside pipeline parallel: rules 3–4 over the stage's L_s blocks for each of the m
   micro-batches (the counts and bytes per step, as rules 8–9), the LM head's input all-gather (SP) on
   the last stage only, the embedding gradient's on stage 0 only; the norms' all-reduces (SP) once a
   step, over the stage's norms (ln_final on the last stage), under FSDP2's amp-bf16 policy in fp32
   (the gradients folded into fp32 sums before the reduction).
11. Interleaved 1F1B (``virtual_stages`` v > 1): a pipeline rank holds v chunks, model stages
   rank + j·pp of pp·v (``ParallelLayout.as_chunks``), each its own module (its own DDP buckets or FSDP2
   units, its own TP collectives for each of the m micro-batches); rule 8's transfers run per chunk:
   m each way per neighbour, the model's first and last chunk one neighbour, every other two, so v
   times a middle 1F1B rank's (Narayanan et al. 2021, §2.2.2).  FSDP2 (rule 9 in the interleaved runtime):
   each chunk is gathered by each of the runtime's UNSHARDs (``_add_unshard_reshard``: at most 3 chunks
   unsharded at once, so with v > 3 a chunk resharded by a RESHARD is gathered again, under ZeRO-2 too), then
   by every forward or backward that finds it sharded (ZeRO-3: every forward reshards), counted along torch's
   order (``analytic.pipeline.interleaved_gathers``).  Measured per pipeline rank
   (``measure.pipeline.measure_interleaved_rank``, tests/test_pipeline_interleaved.py) alone and beside DDP,
   ZeRO-1, TP and FSDP2.
12. HSDP (``replicate`` r, shard groups of s = D/r ranks; torch 2.13 ``_fsdp_collectives.foreach_reduce``):
   rule 1 over the shard group (group "dp_shard": the all-gathers and reduce-scatters of units padded to
   multiples of s rows), then each unit's reduce-scatter output, its R/s-byte shard in the reduce dtype,
   all-reduced over the replicate group (group "dp_replicate": L+1 all-reduces of R/s in all, backward).
   Wire bytes per rank: (s−1)/s·G (twice under zero 3) and (s−1)/s·R within the shard group, 2·(r−1)/r·R/s
   across the replicas.  Beside expert parallel (torchtitan's ``apply_fsdp`` for MoE models over
   ``dp_shard_mod_ep``, ``parallelisms.hsdp``): the dense units (the root, each block without its expert
   stacks) as above over the shard group; the expert units, L_moe of G_e and R_e bytes, gathered and
   reduce-scattered over the s/ep shard ranks holding the same experts (group "dp_shard/ep"; none when s = ep:
   FSDP2 skips a one-rank shard dimension) and each one's R_e·ep/s shard all-reduced over the replicas
   ("dp_replicate", L_moe all-reduces: the experts' mesh is (dp_replicate, dp_shard_mod_ep), its replicas the
   dense units'); rule 6's all-to-alls over the ep ranks (consecutive shard ranks).
13. Context parallel (``cp``; ``analytic.context_parallel``, measured on the fake process group in tests/test_cp.py):
   FSDP2's, DDP's and ZeRO-1's collectives are rules 1-2 over the flattened dp × cp ranks (group "dp_cp") at
   s = S/cp positions; per attention layer, KV = the rank's K and V (2·B·h_kv·s·d_head·a), dKV their fp32
   gradients: rotate "allgather" (torch's default) one all-gather of cp·KV forward, one backward (and one in a full
   checkpoint's recompute), cp ring shifts of dKV backward; rotate "alltoall" cp − 1 shifts of KV forward and again
   backward (and recompute), cp of dKV.  A shift (``permute_tensor``, an ``all_to_all_single``) sends its whole
   buffer to the next cp rank: wire = payload.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from ..config import ModelConfig
from ..layout import ParallelLayout
from ..names import DTYPE_BYTES
from ..setup import TrainingSetup
from .parallel import expert_rows, local_numels, model_states, stage_layers

DDP_FIRST_BUCKET = 1024 * 1024  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
DDP_BUCKET = 25 * 1024 * 1024  # DistributedDataParallel(bucket_cap_mb=25)


class Collective(NamedTuple):  # a tuple: the planner makes tens of thousands
    kind: str  # all_gather, reduce_scatter, all_reduce, broadcast, send_recv
    phase: str  # forward, backward, optimizer_step
    group: str  # dp, tp, pp
    count: int
    payload: int  # bytes, summed over the calls
    formula: str


def wire_bytes(c: Collective, n: int, times: int = 1) -> int:
    """Bytes one rank sends for ``c`` repeated ``times`` times (its payload times that) in a ring over n
    ranks (module docstring)."""
    if n <= 1:
        return 0
    if c.kind == "all_to_all" and c.group == "cp":  # rule 13's ring shift: the whole buffer to the next rank
        return times * c.payload
    if c.kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return times * c.payload * (n - 1) // n
    if c.kind == "all_reduce":
        return 2 * times * c.payload * (n - 1) // n
    return times * c.payload


def ddp_bucket_sizes(sizes: list[int]) -> list[int]:
    """The bytes of each bucket of DDP's reducer over gradients of ``sizes`` bytes (one dtype): parameters in
    reverse order, a bucket closed once it reaches its cap (the first 1 MiB, then 25 MiB)."""
    buckets: list[int] = []
    current, cap = 0, DDP_FIRST_BUCKET
    for size in reversed(sizes):
        current += size
        if current >= cap:
            buckets.append(current)
            current, cap = 0, DDP_BUCKET
    return buckets + ([current] if current else [])


def ddp_bucket_count(sizes: list[int]) -> int:
    """Buckets of DDP's reducer (``ddp_bucket_sizes``)."""
    return len(ddp_bucket_sizes(sizes))


@lru_cache(maxsize=1024)
def _ddp_buckets(cfg: ModelConfig, tp: int, vocab_parallel: bool, where, e: int) -> tuple[int, int, int]:
    """(parameters, DDP's buckets, gradient bytes) of one rank (``where``: (P, s), a pipeline stage's)."""
    sizes = [n * e for n in local_numels(cfg, tp, vocab_parallel, where)]
    return len(sizes), ddp_bucket_count(sizes), sum(sizes)


def step_collectives(
    cfg: ModelConfig,
    seq: int,
    batch: int,
    setup: TrainingSetup,
    layout: ParallelLayout,
    first_step: bool = False,
    rank: int = 0,
    stage: int = 0,
) -> list[Collective]:
    """Every collective of one step on data-parallel rank ``rank`` of pipeline stage ``stage`` (rules of
    the module docstring; only expert parallel's all-to-alls depend on the rank, the first is the worst;
    rules 8–10 and DDP's buckets on the stage); ``first_step``: DDP's first step, with its single bucket.
    The data-parallel, tensor-parallel and pipeline groups' in turn (``plan`` prices each on its own).
    With virtual stages (interleaved 1F1B) ``stage`` is the pipeline rank: rule 11."""
    if layout.virtual_stages > 1:
        return _interleaved_collectives(cfg, seq, batch, setup, layout, first_step, rank, stage)
    out = data_parallel_collectives(cfg, seq, batch, setup, layout, first_step, rank, stage) if layout.dp > 1 else []
    if layout.tp > 1:
        out += tensor_parallel_collectives(cfg, seq, batch, setup, layout, stage)
    return out + pipeline_collectives(cfg, seq, batch, setup, layout, stage)


def data_parallel_collectives(
    cfg: ModelConfig,
    seq: int,
    batch: int,
    setup: TrainingSetup,
    layout: ParallelLayout,
    first_step: bool = False,
    rank: int = 0,
    stage: int = 0,
    passes: tuple[int, int] | None = None,
) -> list[Collective]:
    """Rules 1, 2, 6, 7 and 9 (``step_collectives``): over the data-parallel ranks (dp > 1).  They read
    neither sequence parallel nor (but the all-to-alls) the batch: ``plan`` caches them so.  ``passes``:
    FSDP2's gathering passes of a pipeline stage where not rule 9's (an interleaved chunk's, rule 11)."""
    if layout.replicate > 1:  # rule 12
        return hsdp_collectives(cfg, seq, batch, setup, layout, rank, stage, passes)
    out: list[Collective] = []
    e = 2 if setup.param_dtype == "bf16" else 4
    where = (layout.pp, stage) if layout.pp > 1 else None
    if layout.fsdp:  # the model states only here: DDP's buckets are the whole gradient's (ZeRO-1's owners unread)
        st = model_states(cfg, setup, layout, stage=stage if where else None)
        units, given, passes = cfg.num_layers + 1, passes, (1, 1)
        if where:  # rule 9: the stage's units, gathered as often as the schedule finds them sharded
            units, passes = stage_units(cfg, layout, stage), given or sharded_passes(layout, stage)
        gathered = st.unsharded_all - st.unsharded_experts
        out += _fsdp_collectives(units, gathered, "dp", "", setup, layout, passes)
        if 1 < layout.ep < layout.dp:  # rule 6: the expert units over dp/ep
            out += _fsdp_collectives(cfg.moe_layers, st.unsharded_experts, "dp/ep", " (experts)", setup, layout)
        if layout.ep > 1:
            out += _all_to_alls(cfg, seq, batch, setup, layout, rank)
        return out
    params, buckets, total = _ddp_buckets(cfg, layout.tp, layout.vocab_parallel, where, e)
    n = 1 if first_step else buckets
    out.append(Collective("all_reduce", "backward", "dp", n, total, "gradient buckets, Σ n·e"))
    if cfg.positions == "rope":
        rope = 2 * cfg.context_length * (cfg.rope_dim // 2) * 4
        out.append(Collective("broadcast", "forward", "dp", 1, rope, "module buffers (RoPE tables)"))
    if layout.zero == 1:
        out.append(Collective("broadcast", "optimizer_step", "dp", params, total, "updated parameters, Σ n·e"))
    return out


def hsdp_collectives(
    cfg: ModelConfig,
    seq: int,
    batch: int,
    setup: TrainingSetup,
    layout: ParallelLayout,
    rank: int = 0,
    stage: int = 0,
    passes: tuple[int, int] | None = None,
) -> list[Collective]:
    """Rule 12: rule 1 over the shard group, and each unit's sharded gradients all-reduced over the replicas;
    beside expert parallel the expert units' over their s/ep ranks, then all-reduced over the replicas, and
    rule 6's all-to-alls over the ep ranks of the shard group.  Beside pipeline parallel, rule 9 (or 11) over
    the shard group, and each of the stage's units' shards all-reduced over the replicas."""
    group = layout.shard_group()
    if layout.pp > 1:
        out = data_parallel_collectives(cfg, seq, batch, setup, group, False, rank, stage, passes)
        out = [c._replace(group="dp_shard") for c in out]
        units = sum(c.count for c in out if c.kind == "reduce_scatter")
        reduced = sum(c.payload for c in out if c.kind == "reduce_scatter") // layout.shard
        return out + [Collective("all_reduce", "backward", "dp_replicate", units, reduced, "every unit's shard (R/s)")]
    st = model_states(cfg, setup, layout)
    units = cfg.num_layers + 1
    out = _fsdp_collectives(units, st.unsharded_all - st.unsharded_experts, "dp_shard", "", setup, group)
    reduced = next(c.payload for c in out if c.kind == "reduce_scatter") // layout.shard
    out.append(Collective("all_reduce", "backward", "dp_replicate", units, reduced, "every unit's shard (R/s)"))
    if layout.ep == 1:
        return out
    s = layout.shard // layout.ep  # the expert units' shard group (none of one rank: FSDP2 skips it)
    experts = _fsdp_collectives(cfg.moe_layers, st.unsharded_experts, "dp_shard/ep", " (experts)", setup, group)
    full = sum(c.payload for c in experts if c.kind == "reduce_scatter")  # R_e, in the reduce dtype
    text = "every expert unit's shard (R_e·ep/s)"
    out += experts if s > 1 else []
    out.append(Collective("all_reduce", "backward", "dp_replicate", cfg.moe_layers, full // s, text))
    return out + _all_to_alls(cfg, seq, batch, setup, group, rank)


def tensor_parallel_collectives(
    cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup, layout: ParallelLayout, stage: int = 0
) -> list[Collective]:
    """Rules 3, 4, 7 and 10 (``step_collectives``): over the TP ranks (tp > 1), ``tensor_parallel_parts``
    with each micro-batch's m times under pipeline parallel (rule 10)."""
    each, once = tensor_parallel_parts(cfg, seq, batch, setup, layout, stage)
    m = layout.micro_batches if layout.pp > 1 else 1
    return [c._replace(count=m * c.count, payload=m * c.payload) for c in each] + once


def tensor_parallel_parts(
    cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup, layout: ParallelLayout, stage: int = 0
) -> tuple[list[Collective], list[Collective]]:
    """(one micro-batch's, once a step's) TP collectives (rules 3, 4, 7; the norms' once a step).  They read
    neither the micro-batch count nor the data-parallel layout but whether FSDP2 runs: ``plan`` caches
    them so."""
    T = batch * seq
    each, once = _tp_collectives(cfg, T, setup, layout, stage)
    if layout.vocab_parallel:
        e = 2 if setup.param_dtype == "bf16" else 4
        each += _vocab_parallel_collectives(T, cfg.d_model, e, setup, layout, stage)
    return each, once


def pipeline_collectives(
    cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup, layout: ParallelLayout, stage: int = 0
) -> list[Collective]:
    """Rule 8 (``step_collectives``): stage ``stage``'s sends and receives (none without pp); with virtual
    stages (rule 11) pipeline rank ``stage``'s, over its v chunks (v times a 1F1B rank's, less the ends)."""
    if layout.pp == 1:
        return []
    e = 2 if setup.param_dtype == "bf16" else 4
    h = 2 if layout.fsdp and setup.autocast else e  # the residual stream's bytes (rule 5)
    T, d = batch * seq // (layout.tp if layout.sequence_parallel else 1), cfg.d_model  # SP: S/M positions cross
    ends = (0, layout.stages - 1)  # neighbours: one at either end of the model, two elsewhere
    sides = sum(1 if c in ends else 2 for c in layout.chunks(stage))
    n = layout.micro_batches * sides
    what = {1: "m", 2: "2m (two neighbours)"}.get(sides, f"{sides}m ({layout.virtual_stages} chunks)")
    return [
        Collective("send_recv", "forward", "pp", n, n * T * d * h, f"{what} × T·d·h, hidden states"),
        Collective("send_recv", "backward", "pp", n, n * T * d * h, f"{what} × T·d·h, their gradients"),
    ]


def _interleaved_collectives(cfg, seq, batch, setup, layout, first_step, rank, stage) -> list[Collective]:
    """Rule 11: pipeline rank ``stage``'s chunks, each a stage of ``ParallelLayout.as_chunks``: the
    data-parallel collectives of each chunk's own module, the TP ones of each chunk's m micro-batches, and
    the point-to-point transfers of rule 8 over the rank's chunks (``pipeline_collectives``)."""
    from .pipeline import interleaved_gathers

    lay, m = layout.as_chunks(), layout.micro_batches
    gathers = interleaved_gathers(layout, stage) if layout.fsdp else None
    out: list[Collective] = []
    for j, c in enumerate(layout.chunks(stage)):
        if layout.dp > 1:
            passes = gathers and gathers[j]
            out += data_parallel_collectives(cfg, seq, batch, setup, lay, first_step, rank, c, passes)
        if layout.tp > 1:
            each, once = tensor_parallel_parts(cfg, seq, batch, setup, lay, c)
            out += [x._replace(count=m * x.count, payload=m * x.payload) for x in each] + once
    return out + pipeline_collectives(cfg, seq, batch, setup, layout, stage)


def _fsdp_collectives(
    units: int,
    gathered: int,
    group: str,
    what: str,
    setup: TrainingSetup,
    layout: ParallelLayout,
    passes: tuple[int, int] = (1, 1),
) -> list[Collective]:
    """Rule 1 for ``units`` FSDP2 units of ``gathered`` unsharded bytes (all-gather dtype) in total;
    ``passes``: (forwards, backwards) that gather them (rule 9; one each without pipeline parallel)."""
    e = 2 if setup.param_dtype == "bf16" else 4
    g, r = gathered, gathered // (2 if setup.autocast else e) * e
    f, b = passes
    times = lambda k: "" if k == 1 else f", {k} passes"
    out = [Collective("all_gather", "forward", group, f * units, f * g, f"every unit{what}, padded (G){times(f)}")]
    if b and (layout.zero == 3 or layout.pp > 1):  # rule 11: zero 2's interleaved chunks regathered after RESHARD
        out.append(
            Collective("all_gather", "backward", group, b * units, b * g, f"every unit{what} again (G){times(b)}")
        )
    out.append(Collective("reduce_scatter", "backward", group, units, r, f"every unit{what}'s gradients (R)"))
    return out


def _tp_collectives(cfg: ModelConfig, T: int, setup: TrainingSetup, layout: ParallelLayout, stage: int) -> tuple:
    """Rules 3 and 4: (one micro-batch's, once a step's: the norms') (rule 10 under pipeline parallel: the
    stage's blocks, the LM head's input gather on the last stage, the embedding gradient's on stage 0)."""
    e = 2 if setup.param_dtype == "bf16" else 4
    a = 2 if setup.autocast else e
    d, recompute = cfg.d_model, setup.checkpoint != "none"
    L, head, emb = cfg.num_layers, 1, 1
    if layout.pp > 1:
        L = len(stage_layers(cfg.num_layers, layout.pp, stage))
        head, emb = int(stage == layout.pp - 1), int(stage == 0)
    act, full = T * d * a, T * d * e
    if layout.fsdp and setup.autocast:  # rule 5: bf16 parameters, so a bf16 residual stream
        full = T * d * 2
    tp = lambda kind, phase, n, payload, text="": Collective(kind, phase, "tp", n, payload, text)
    if not layout.sequence_parallel:
        n = 5 * L + (L if recompute else 0)
        return [
            tp("all_reduce", "forward", 2 * L, 2 * L * act, "2L × T·d·a"),
            tp("all_reduce", "backward", n, 5 * L * full + (L * act if recompute else 0)),
        ], []
    rescatter = recompute and setup.checkpoint != "op"  # op: the reduce-scatter's output is saved (rule 4)
    ag = 2 * L * act + emb * full + (2 * L * full if recompute else 0)
    rs = 2 * L * full + (L * act if rescatter else 0)
    each = [
        tp("all_gather", "forward", 2 * L + head, (2 * L + head) * full, f"(2L{'+1' if head else ''}) × T·d·e"),
        tp("reduce_scatter", "forward", 2 * L, 2 * L * act, "2L × T·d·a"),
        tp("all_gather", "backward", 2 * L + emb + (2 * L if recompute else 0), ag),
        tp("reduce_scatter", "backward", 2 * L + (L if rescatter else 0), rs),
    ]
    norms = 2 * L + head
    if layout.fsdp:  # FSDP2 reduces each Partial norm gradient once, in its post-backward
        # in the all-gather dtype; beside pp the gradients it reduces are the fp32 sums (rule 9)
        g = 2 if setup.autocast and layout.pp == 1 else e
        label = f"(2L{'+1' if head else ''}) × d·g"
        return each, [Collective("all_reduce", "backward", "tp", norms, norms * d * g, label)]
    # AdamW redistributes each Partial gradient where it reads it: lerp_(m, g), addcmul_(v, g, g); fused once
    k = 1 if setup.optimizer == "fused" else 3
    label = f"{k}(2L{'+1' if head else ''}) × d·e"
    return each, [Collective("all_reduce", "optimizer_step", "tp", k * norms, k * norms * d * e, label)]


def stage_units(cfg: ModelConfig, layout: ParallelLayout, stage: int) -> int:
    """FSDP2 units on pipeline stage ``stage``: its blocks, and its root where the root holds parameters
    (the embedding on stage 0, the final norm and LM head on the last)."""
    root = stage == 0 or stage == layout.pp - 1
    return len(stage_layers(cfg.num_layers, layout.pp, stage)) + root


def sharded_passes(layout: ParallelLayout, stage: int) -> tuple[int, int]:
    """Rule 9: (forwards, backwards) of a 1F1B step on stage ``stage`` that find FSDP2's units sharded
    and gather them.  Zero 2: the first forward only.  Zero 3: each forward reshards, each backward
    leaves them unsharded, so the w = min(m, P − s) warm-up forwards gather, and so does every backward
    that follows a forward: the first after the warm-up and the m − w steady-state ones (m + 1 in all)."""
    if layout.zero == 2:
        return 1, 0
    w = min(layout.micro_batches, layout.pp - stage)
    return w, layout.micro_batches - w + 1


def _all_to_alls(
    cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup, layout: ParallelLayout, rank: int
) -> list[Collective]:
    """Rule 6: dispatch and combine per MoE layer, forward, backward and a checkpointed recompute."""
    sent = batch * seq * cfg.experts_per_token
    rows = max(sent, expert_rows(cfg, seq, batch, layout, rank))
    nbytes = rows * cfg.d_model * (2 if setup.autocast else DTYPE_BYTES[setup.param_dtype])
    n = 2 * cfg.moe_layers
    text = "dispatch + combine per MoE layer, max(T·k, R)·d·bytes"
    out = [Collective("all_to_all", "forward", "ep", n, n * nbytes, text)]
    k = 2 if setup.checkpoint != "none" else 1  # their gradients; the recompute's
    out.append(Collective("all_to_all", "backward", "ep", k * n, k * n * nbytes, text))
    return out


def _vocab_parallel_collectives(
    T: int, d: int, e: int, setup: TrainingSetup, layout: ParallelLayout, stage: int = 0
) -> list[Collective]:
    """Rule 7, one micro-batch's: the row-wise embedding's output, the loss's three all-reduces, the LM
    head's input gradient (in the residual stream's dtype: bf16 under FSDP2's amp-bf16 policy, rule 5);
    beside pipeline parallel the embedding's on stage 0, the loss's and the head's on the last (rule 10)."""
    xe = 2 if setup.param_dtype == "bf16" else 4  # the logits the loss reads (amp-bf16: ``logits.float()``)
    h = 2 if layout.fsdp and setup.autocast else e
    kind = "reduce_scatter" if layout.sequence_parallel else "all_reduce"
    first, last = (stage == 0, stage == layout.pp - 1) if layout.pp > 1 else (True, True)
    out = [Collective(kind, "forward", "tp", 1, T * d * h, "embedding output, T·d·h")] if first else []
    if last:
        out.append(Collective("all_reduce", "forward", "tp", 3, T * (8 + xe), "loss: row max, Σ exp, target logit"))
        out.append(Collective(kind, "backward", "tp", 1, T * d * h, "LM head input gradient, T·d·h"))
    return out


def totals(collectives: list[Collective]) -> dict[str, tuple[int, int]]:
    """kind -> (count, payload bytes), summed over phases (``CollectiveRecorder.totals``'s shape)."""
    out: dict[str, tuple[int, int]] = {}
    for c in collectives:
        n, b = out.get(c.kind, (0, 0))
        out[c.kind] = (n + c.count, b + c.payload)
    return out
