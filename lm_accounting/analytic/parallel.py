"""Per-GPU memory, FLOPs and communication of one rank of a multi-GPU training job.  No torch.

The layout is ``layout.ParallelLayout``; the per-GPU figures are for the worst rank.  Sources:
torch 2.13's FSDP2 (``torch/distributed/fsdp/_fully_shard/_fsdp_param.py``: dim-0 chunks of
``ceil(rows / dp)``, padded storage), ``ZeroRedundancyOptimizer._partition_parameters`` (whole
tensors, largest first, to the least-loaded rank), DDP's reducer (flat bucket buffers beside
``p.grad``, ``gradient_as_bucket_view=False``), DTensor's redistribution rules (Megatron splits).
Every figure below is checked against one rank of the real job on the fake process group
(``measure.distributed``) in ``tests/test_parallel_measured.py``.

Notation: D = dp, M = tp, P = pp, L = layers, T = B·S tokens of the rank's micro-batch, d = d_model,
e = bytes per parameter element (4: fp32 and amp-bf16; 2: bf16), a = bytes per activation element
of a matmul output (2 under amp-bf16, else e).  A parameter is (rows, cols) as stored, (out, in)
for a projection; "local" means after the TP split.

1. TP split (column-wise: rows/M; row-wise: cols/M; norms, embedding and LM head replicated unless
   vocab parallel: rows/M).  The TP-local model is the model with h/M heads, kv/M kv heads and
   d_ff/M, so its parameters, FLOPs and saved activations are the single-GPU formulas of
   ``local_config(cfg, layout)`` (the embedding, norms and LM head stay whole).
2. FSDP2 (zero 2, 3) shards each local parameter on dim 0: chunk c = ceil(rows / D); storage
   c·cols·e on every rank (padded); rank r holds min(c, max(0, rows − r·c)) real rows, and AdamW's
   moments (``zeros_like`` of that shard) follow the real rows, not the padding.  Gradients are
   padded like the parameters.  Rank 0 (every chunk full) is the worst.
3. ZeRO-1: parameters and gradients whole; AdamW's moments only for the tensors the rank owns.
4. DDP (zero 0, 1; D > 1): bucket buffers holding a copy of every gradient, Σ n·e, from construction.
5. Sequence parallel: the residual stream and the norms' own tensors are split along the sequence
   (÷M); the projections keep the all-gathered norm output (whole).  The replay runs the rank itself
   (``sp_replayed``, every precision, S divisible by M): norms and residual stream at T/M rows;
   before each column-parallel projection the norm's output all-gathered (T·d; fp32 under amp-bf16,
   whose norms run in fp32; at B > 1 then ``cat`` into (B, S, d)); each row-parallel output a whole
   partial sum (bf16 under amp-bf16) reduce-scattered to T/M rows (through a T·d ``cat``); in the
   backward the mirror images (the gradient of a reduce-scattered output all-gathered, of an
   all-gathered input reduce-scattered), in the forward, the recompute and the backward alike
   (``replay._sp_all_gather``, ``_sp_reduce_scatter``).
6. Expert parallel (ep; torchtitan's convention, ``layout``): a routed-expert stack (E, out, in) is
   (E/ep, out, in) on each rank; under FSDP2 it is its own unit per MoE block, sharded over the dp/ep
   ranks that hold the same experts (dim 0, or dim 1 when dp > E: (E/ep, ceil(out/(dp/ep)), in)); every
   other parameter is sharded over dp as in rule 2.  Rank r's index among the dp/ep ranks is r // ep.
7. Expert rows (balanced routing, ``model/moe.py``): each rank routes T·k slots, c_e = ⌊T·k/E⌋ +
   [e < T·k mod E] to expert e; under ep the experts of ep rank j = r mod ep run on the rows of every
   rank, R_j = ep · Σ_{e of j} c_e per MoE layer (T·k when E divides T·k; ep rank 0 has the most).
   Each routed matrix costs 2·R·d·d_e FLOPs on the rank, so its FLOPs change by 3·2·(R − T·k)·d·d_e
   per MoE layer and forward (a full-checkpoint recompute reruns all three).  The counts are
   ``analytic.expert_parallel``'s; the step replay runs ep rank r mod ep's own dispatch, experts and
   combine (``replay._ep_routed_forward``) with the experts' FSDP2 unit (``analytic.fsdp`` rule 7).
8. HSDP (``layout.replicate`` r; torch 2.13 ``_fully_shard/_fsdp_collectives.py`` ``foreach_reduce``): a rank
   holds, allocates and frees exactly what rank k mod s of an FSDP2 job over its shard group's s = D/r ranks
   does (``ParallelLayout.shard_group``): the same dim-0 chunks ceil(rows/s), all-gather outputs and
   reduce-scatter buffers.  The one addition, the all-reduce over the r replicas, runs in place on the
   reduce-scatter output (``dist.all_reduce(reduce_output, group=replicate)``), which becomes the sharded
   gradients; ``FSDPParamGroup._all_reduce_state`` keeps a reference to it until the next unit's reduce,
   no extra bytes (our setups never cast it: the reduce dtype is the parameters' or, under amp-bf16, fp32
   = the fp32 parameters').  Checked per phase on the fake process group (tests/test_hsdp.py).  Beside expert
   parallel (torchtitan's MoE mesh, ``parallelisms.hsdp``): rank k mod s of the shard group's FSDP2 × EP job
   (ep ranks k mod ep; the expert stacks over the s/ep shard ranks holding them), but for where the stacks are
   sharded: torchtitan's dim-1 test counts the replicas (``experts_on_dim1``: r·s > E), which the shard group
   alone (s > E) would not (tests/test_hsdp_ep.py).
"""

from __future__ import annotations

import dataclasses
import heapq
from dataclasses import dataclass
from functools import lru_cache

from ..components import COL, EXPERT_COL, EXPERT_ROW, REPLICATED, ROW, VOCAB, components
from ..config import AccountingError, ModelConfig
from ..layout import ParallelLayout
from ..names import DTYPE_BYTES
from ..phases import PhaseBytes, StepMemory
from ..setup import TrainingSetup
from .activations import norm_saved_bytes, saved_activation_breakdown
from .expert_parallel import expert_parallel_split
from .fsdp import fsdp_units
from .hardware_flops import StepFlops, step_flops
from .memory import adamw_step_counter_bytes
from .ops.aten_ring import active, installed
from .replay import adamw_step_scalar_bytes
from .sizes import Sizes
from .tensor_parallel import (
    vocab_parallel_gradient_extra,
    vocab_parallel_head_saved,
    vocab_parallel_step,
)


@dataclass(frozen=True)
class ParamShape:
    """One parameter tensor: its ``named_parameters()`` name, its shape as stored, how TP cuts it
    (``split``) and its FSDP unit (0: the root: embeddings, final norm, LM head; i + 1: block i).
    FSDP2 shards dim 0, so the tensor counts as (rows, cols) = (dim 0, the product of the others)."""

    name: str
    shape: tuple[int, ...]
    split: str
    unit: int

    @property
    def rows(self) -> int:
        return self.shape[0]

    @property
    def cols(self) -> int:
        out = 1
        for n in self.shape[1:]:
            out *= n
        return out

    @property
    def expert(self) -> bool:
        """A routed-expert stack, (E, out, in): expert parallel splits its dim 0."""
        return self.split in (EXPERT_COL, EXPERT_ROW)


def _tensor_names(key: str, tensors: int) -> tuple[str, ...]:
    """The parameter names under a registry key: a bias component is a ``Bias`` module holding ``bias``;
    a LayerNorm (2 tensors) holds ``weight`` and ``bias``; every other one ``weight``."""
    if key.endswith(".bias"):
        return (f"{key}.bias",)
    return (f"{key}.weight", f"{key}.bias")[:tensors]


@lru_cache(maxsize=64)
def parameter_shapes(cfg: ModelConfig) -> tuple[ParamShape, ...]:
    """Every parameter of the live model in ``model.parameters()`` order, read off the component
    registry (its order is the modules' registration order; ``present`` and ``layers`` say which
    exist in which block; ``shape`` and ``split`` give each tensor's stored shape and TP cut).  A tied
    LM head is the embedding: listed once."""
    before: list[ParamShape] = []  # the root's tensors registered before the blocks (embeddings)
    after: list[ParamShape] = []  # and after them (final norm, LM head)
    blocks: list[list[ParamShape]] = [[] for _ in range(cfg.num_layers)]
    for c in components(cfg, "params"):
        if c.key == "lm_head" and cfg.tie_embeddings:
            continue
        shape, split, names = c.shape(cfg), c.split, _tensor_names(c.key, c.tensors(cfg))
        if c.per_layer:
            for i in range(cfg.num_layers):
                if c.layers.has(cfg, i):
                    blocks[i] += [ParamShape(n.replace("*", str(i), 1), shape, split, i + 1) for n in names]
        else:
            (after if any(blocks) else before).extend(ParamShape(n, shape, split, 0) for n in names)
    return (*before, *(p for b in blocks for p in b), *after)


def local_shape(p: ParamShape, layout: ParallelLayout) -> tuple[int, int]:
    """(rows, cols) on one TP rank (rule 1; a vocabulary split is ceil(V/M) rows on the first ranks)."""
    m = layout.tp
    if p.split == COL:
        return p.rows // m, p.cols
    if p.split == ROW:
        return p.rows, p.cols // m
    if p.split == VOCAB and layout.vocab_parallel:
        return -(-p.rows // m), p.cols
    if p.expert:  # expert parallel: E/ep experts on each rank (rule 6); TP: out/M or in/M
        return p.rows // layout.ep, p.cols // m
    return p.rows, p.cols


def local_config(cfg: ModelConfig, layout: ParallelLayout) -> ModelConfig:
    """The TP-local model: h/M heads, kv/M kv heads, d_ff/M, head_dim kept (rule 1)."""
    return cfg if layout.tp == 1 else _local_config(cfg, layout.tp)


@lru_cache(maxsize=256)
def _local_config(cfg: ModelConfig, m: int) -> ModelConfig:
    return dataclasses.replace(
        cfg, num_heads=cfg.num_heads // m, num_kv_heads=cfg.kv_heads // m, head_dim=cfg.d_head, d_ff=cfg.d_ff // m
    )


def fsdp_chunk_rows(rows: int, shards: int) -> int:
    """FSDP2's dim-0 chunk, ceil(rows / D): every rank's padded storage rows."""
    return -(-rows // shards)


def fsdp_rank_rows(rows: int, shards: int, rank: int) -> int:
    """Real rows of rank ``rank``'s shard: min(c, max(0, rows − rank·c)), c = ceil(rows / D)."""
    c = fsdp_chunk_rows(rows, shards)
    return min(c, max(0, rows - rank * c))


def zero1_owners(numels: list[int], shards: int) -> list[int]:
    """``ZeroRedundancyOptimizer``'s partition: tensors sorted by numel, largest first (stable),
    each to the rank with the smallest total so far (the lowest index on a tie)."""
    heap = [(0, r) for r in range(shards)]  # (total, rank): the least-loaded, lowest rank on top
    owner = [0] * len(numels)
    for i in sorted(range(len(numels)), key=lambda j: -numels[j]):
        total, rank = heapq.heappop(heap)
        owner[i] = rank
        heapq.heappush(heap, (total + numels[i], rank))
    return owner


@dataclass(frozen=True)
class ModelStates:
    """Bytes of one rank's model states (rules 2–4), and which data-parallel rank it is."""

    rank: int
    parameters: int
    gradients: int
    optimizer: int  # AdamW exp_avg + exp_avg_sq
    ddp_buckets: int
    unsharded_all: int  # every local parameter unsharded, padded (FSDP all-gather outputs)
    unsharded_unit_max: int  # the largest FSDP unit unsharded
    owned_elements: int  # elements whose optimizer state this rank keeps
    unsharded_experts: int = 0  # of ``unsharded_all``: the expert units (expert parallel, over dp/ep)

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.ddp_buckets


def element_bytes(setup: TrainingSetup) -> int:
    return DTYPE_BYTES[setup.param_dtype]


def model_states(
    cfg: ModelConfig,
    setup: TrainingSetup,
    layout: ParallelLayout,
    rank: int | None = None,
    stage: int | None = None,
) -> ModelStates:
    """Model states of data-parallel rank ``rank`` (default: the worst, i.e. the one with the most
    optimizer state), over the whole model or, with ``stage``, pipeline stage ``stage``'s parameters.
    AdamW's 0-d ``step`` counters are left out (foreach/for-loop keep them on the CPU; fused's, on the
    device, are ``step_counter_bytes``, in ``rank_step`` and ``stage_baseline``).  Cached on what
    they depend on: the precision and the layout's degrees (not the checkpointing or micro-batches).
    HSDP (rule 8): shard rank ``rank`` mod dp/replicate of its shard group's FSDP2 job."""
    dim1 = experts_on_dim1(cfg, layout)  # the whole layout's (HSDP: r·s > E, torchtitan's)
    degrees = (layout.shard, layout.zero, layout.tp, layout.vocab_parallel, layout.pp, layout.ep, dim1)
    if layout.replicate > 1 and rank is not None:
        return dataclasses.replace(_model_states(cfg, setup.precision, degrees, rank % layout.shard, stage), rank=rank)
    return _model_states(cfg, setup.precision, degrees, rank, stage)


@lru_cache(maxsize=16384)
def _model_states(cfg: ModelConfig, precision: str, degrees: tuple, rank: int | None, stage: int | None):
    dp, zero, tp, vocab_parallel, pp, ep, dim1 = degrees
    setup = TrainingSetup(precision=precision)
    layout = ParallelLayout(dp=dp, zero=zero, tp=tp, vocab_parallel=vocab_parallel, pp=pp, ep=ep, micro_batches=pp)
    e, d = element_bytes(setup), layout.dp
    where = None if stage is None else (layout.pp, stage)
    groups = _grouped(cfg, layout.tp, layout.vocab_parallel, where, layout.ep, dim1)
    full = sum(n * r * c for (r, c, _), n in groups) * e
    if layout.fsdp:
        if rank is None:
            rank = 0  # rank 0's chunks are all full (rule 2)
        shards = {EXPERT_UNIT: d // layout.ep}  # rule 6: the expert stacks over dp/ep, the rest over dp
        group_rank = {EXPERT_UNIT: rank // layout.ep}
        padded = owned = 0
        per_kind: dict[int, int] = {}  # unit kind -> its units' unsharded elements (padded)
        for (r, c, k), n in groups:
            m = shards.get(k, d)
            padded += n * fsdp_chunk_rows(r, m) * c
            owned += n * fsdp_rank_rows(r, m, group_rank.get(k, rank)) * c
            per_kind[k] = per_kind.get(k, 0) + n * fsdp_chunk_rows(r, m) * m * c
        units = _unit_counts(cfg, where, layout.ep)
        gather_e = 2 if setup.autocast else e  # MixedPrecisionPolicy(param_dtype=bf16) under amp-bf16
        return ModelStates(
            rank,
            padded * e,
            padded * e,
            2 * owned * e,
            0,
            sum(per_kind.values()) * gather_e,
            max(v // units.get(k, 1) for k, v in per_kind.items()) * gather_e,
            owned,
            per_kind.get(EXPERT_UNIT, 0) * gather_e,
        )
    buckets = full if d > 1 else 0
    if layout.zero == 1 and d > 1:
        totals = _zero1_totals(local_numels(cfg, layout.tp, layout.vocab_parallel, where), d)
        if rank is None:
            rank = max(range(d), key=lambda r: (totals[r], -r))
        owned = totals[rank]
    else:
        rank, owned = rank or 0, full // e
    holds_embedding = stage is None or stage == 0  # vocab parallel's whole embedding gradient: stage 0's
    grads = full + vocab_parallel_gradient_extra(cfg, setup, layout) * holds_embedding
    return ModelStates(rank, full, grads, 2 * owned * e, buckets, 0, 0, owned)


@lru_cache(maxsize=1024)
def local_numels(
    cfg: ModelConfig, tp: int, vocab_parallel: bool, stage: tuple[int, int] | None = None
) -> tuple[int, ...]:
    """Elements of each parameter on one TP rank, in ``model.parameters()`` order (``stage``: (P, s))."""
    layout = ParallelLayout(tp=tp, vocab_parallel=vocab_parallel)
    return tuple(a * b for a, b in (local_shape(p, layout) for p in _params(cfg, stage)))


@lru_cache(maxsize=1024)
def _zero1_totals(numels: tuple[int, ...], shards: int) -> list[int]:
    totals = [0] * shards
    for n, o in zip(numels, zero1_owners(list(numels), shards), strict=True):
        totals[o] += n
    return totals


def _params(cfg: ModelConfig, stage: tuple[int, int] | None) -> tuple[ParamShape, ...]:
    return parameter_shapes(cfg) if stage is None else stage_parameters(cfg, *stage)


ROOT_UNIT, DENSE_UNIT, MOE_UNIT, EXPERT_UNIT = 0, 1, 2, 3
"""FSDP unit kinds: the root; a dense block; a mixture-of-experts block; under expert parallel, the
routed experts of an MoE block, their own unit over dp/ep (rule 6)."""


def _unit_kind(cfg: ModelConfig, p: ParamShape, ep: int) -> int:
    if not p.unit:
        return ROOT_UNIT
    if ep > 1 and p.expert:
        return EXPERT_UNIT
    return MOE_UNIT if cfg.layer_moe(p.unit - 1) else DENSE_UNIT


@lru_cache(maxsize=1024)
def _unit_counts(cfg: ModelConfig, stage: tuple[int, int] | None, ep: int = 1) -> dict[int, int]:
    """How many FSDP units of each kind (the root counts once)."""
    units = {(_unit_kind(cfg, p, ep), p.unit) for p in _params(cfg, stage)}
    out: dict[int, int] = {}
    for kind, _ in units:
        out[kind] = out.get(kind, 0) + 1
    return out


def experts_on_dim1(cfg: ModelConfig, layout: ParallelLayout) -> bool:
    """torchtitan shards the expert stacks on dim 1 when ``dp_mod_ep_mesh.size() * ep_degree > num_experts``
    (``apply_fsdp``), i.e. dp > E (rule 6).  Under HSDP that mesh is (dp_replicate, dp_shard_mod_ep), of
    r·s/ep ranks: dim 1 when r·s = dp > E, though the stacks are sharded over the s/ep ranks only (rule 8)."""
    return layout.ep > 1 and layout.fsdp and layout.dp > (cfg.num_experts or 0)


@lru_cache(maxsize=1024)
def _grouped(
    cfg: ModelConfig, tp: int, vocab_parallel: bool, stage: tuple[int, int] | None, ep: int = 1, dim1: bool = False
) -> tuple[tuple[tuple[int, int, int], int], ...]:
    """Each parameter's local (rows, cols) with its FSDP unit kind, counted: rows is the dim FSDP2
    shards, dim 0, or for the expert stacks with ``dim1`` dim 1 ((E/ep, out, in) -> (out, E/ep·in))."""
    layout = ParallelLayout(tp=tp, vocab_parallel=vocab_parallel, dp=ep, zero=3, ep=ep)
    counts: dict[tuple[int, int, int], int] = {}
    for p in _params(cfg, stage):
        kind = _unit_kind(cfg, p, ep)
        rows, cols = local_shape(p, layout)
        if dim1 and kind == EXPERT_UNIT:
            rows, cols = p.shape[1], rows * cols // p.shape[1]
        key = (rows, cols, kind)
        counts[key] = counts.get(key, 0) + 1
    return tuple(counts.items())


def fsdp_compute_setup(setup: TrainingSetup, layout: ParallelLayout) -> TrainingSetup:
    """The setup the forward really runs: under FSDP2 with amp-bf16 the MixedPrecisionPolicy hands
    the forward bf16 parameters, so autocast copies nothing and the residual stream is bf16: the
    pure-bf16 model (plus ``fsdp_amp_extra``; a mixture of experts keeps its routing from exp on and
    its weighted sum in fp32, cast back to the bf16 residual stream: ``replay._moe_mixed``)."""
    if layout.fsdp and setup.autocast and layout.dp > 1:
        return pure_bf16(setup)
    return setup


@lru_cache(maxsize=64)
def pure_bf16(setup: TrainingSetup) -> TrainingSetup:
    """``setup`` in pure bf16 (one object per setup: the planner asks for it tens of thousands of times)."""
    return dataclasses.replace(setup, precision="bf16")


def fsdp_amp_extra(cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup) -> int:
    """What FSDP2 + amp-bf16 saves beyond the pure-bf16 model: 1. the cross-entropy on fp32 logits
    (``logits.float()``): 2·T·V·(4−2) + T·(4−2) + (4−2); 2. and 3. the blocks' (``fsdp_amp_block_extra``)."""
    t = batch * seq
    return 2 * t * cfg.vocab_size * 2 + t * 2 + 2 + fsdp_amp_block_extra(cfg, seq, batch, setup)


def fsdp_amp_block_extra(cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup) -> int:
    """What FSDP2 + amp-bf16's blocks save beyond the pure-bf16 model's, whatever the head and loss (vocab
    parallel's too): 2. naive attention without checkpointing: exp and its row sums in fp32 (exp is on CUDA
    autocast's fp32 list), L·(B·h·S² + B·h·S)·(4−2); 3. a mixture of experts without checkpointing: its router's
    exp (T·E) and row sums (T), and the top-k weights (T·k) the weighting saves, in fp32 for the same reason
    (``replay._moe_mixed``), L_moe·T·(E + 1 + k)·(4−2)."""
    extra = 0
    if setup.attention == "naive" and setup.checkpoint == "none":
        extra += cfg.num_layers * batch * cfg.num_heads * (seq * seq + seq) * 2
    if cfg.moe and setup.checkpoint == "none":
        extra += cfg.moe_layers * batch * seq * (cfg.num_experts + 1 + cfg.experts_per_token) * 2
    return extra


def saved_activations(cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup, layout: ParallelLayout) -> int:
    """Bytes saved for backward on one rank (``_saved_activations``)."""
    mp = layout.fsdp and setup.autocast and layout.dp > 1
    key = ParallelLayout(
        dp=2 if mp else 1, zero=3 if mp else 0, tp=layout.tp,
        sequence_parallel=layout.sequence_parallel, vocab_parallel=layout.vocab_parallel,
    )  # fmt: skip
    return _saved_activations(cfg, seq, batch, setup, key)


@lru_cache(maxsize=4096)
def _saved_activations(cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup, layout: ParallelLayout) -> int:
    """Bytes saved for backward on one rank: the TP-local model's (rule 1), less what sequence
    parallel splits (rule 5): the residual stream, and the norms' own tensors (rsqrt, the fp32
    normalised input, under ``none``), ÷M (equal to the sequence-parallel replay's forward end less
    its baseline: checked by the measured tests, whose forward ends come from this).  Vocab parallel: the LM head's
    and the course loss's tensors replaced by the vocab-parallel head's (``vocab_parallel_head_saved``) in the
    setup the job computes in (under FSDP2's amp, bf16 with the loss in fp32), never the full-vocabulary
    ``fsdp_amp_extra``: it was added there too, 2·T·V·2 bytes too many, which made ``rank_floor`` exceed the
    replayed peak (issue 27: +4.40 GB on Llama-3-8B at FSDP2 × TP 8 + SP + VP); its blocks' part
    (``fsdp_amp_block_extra``) is the same as without vocab parallel."""
    local = local_config(cfg, layout)
    mp = layout.fsdp and setup.autocast and layout.dp > 1
    run = fsdp_compute_setup(setup, layout)
    saved = saved_activation_breakdown(local, seq, batch, setup=run)
    m = layout.tp
    if layout.vocab_parallel:  # the job's own head and loss (analytic.tensor_parallel), in the setup it runs
        total = saved.total - sum(saved[key].total for key in ("lm_head", "cross_entropy") if key in saved)
        total += vocab_parallel_head_saved(cfg, seq, batch, run, m)
        if mp:  # FSDP2's amp: the blocks' fp32 tensors, as without vocab parallel (issue 27: they had been left out
            # with the full-vocabulary loss), and the loss on fp32 logits: its log-softmax output, loss and weight
            loss = (batch * seq * -(-cfg.vocab_size // m) + 2) * (4 - 2)
            total += fsdp_amp_block_extra(local, seq, batch, setup) + loss
    else:  # FSDP2's amp: the full-vocabulary cross-entropy on fp32 logits (``fsdp_amp_extra``)
        total = saved.total + (fsdp_amp_extra(local, seq, batch, setup) if mp else 0)
    if not layout.sequence_parallel:
        return total
    if (batch * seq) % m:
        raise AccountingError(f"sequence parallel needs the {batch * seq} tokens divisible by tp={m}")
    z = Sizes.of(local, seq, batch, setup=fsdp_compute_setup(setup, layout))
    split = saved["layers.*.residual"].total if "layers.*.residual" in saved else 0
    # a norm's own saved tensors, less the fp32 copy of a 16-bit gain (d·4: whole on every rank)
    own = norm_saved_bytes(z, z.T, cfg.d_model) - (cfg.d_model * 4 if z.e != 4 else 0)
    if setup.checkpoint == "none":
        split += 2 * cfg.num_layers * own  # ln1 and ln2
    split += own + (z.act(cfg.d_model) if z.e == 4 else 0)  # ln_final and its fp32 input
    return total - split + split // m


def single_rank_step(
    cfg: ModelConfig,
    seq: int,
    batch: int,
    setup: TrainingSetup,
    layout: ParallelLayout,
    mode: str,
    units=None,
    device: str = "meta",
    cpu_threads: int = 1,
    rank: int = 0,
):
    """The single-GPU replay of the TP-local model (exact for one GPU; ``analytic.replay``), with
    FSDP2's unit events when ``units`` (``analytic.fsdp.FsdpUnits``) is given; vocab parallel: the job's
    own embedding, head and loss (``analytic.tensor_parallel.vocab_parallel_replay``); expert parallel:
    data-parallel rank ``rank``'s own dispatch and combine (rule 7, ep rank ``rank mod ep``).  Under a context-parallel
    ring installed (``ops.aten_ring.installed``; ``analytic.context_parallel``), that ring's attention."""
    sp = sp_replayed(layout)
    run_setup = fsdp_compute_setup(setup, layout)
    where = (device, cpu_threads)  # a plain CPU run (device "cpu") adds the CPU allocator's own extras
    if layout.vocab_parallel:
        local = local_config(cfg, layout)
        return vocab_parallel_step(local, seq, batch, run_setup, mode, layout.tp, sp, units, where, active())
    ep, ar = (layout.ep, rank % layout.ep), layout.tp > 1 and sp == 1  # ar: TP's all-reduces (rules 3, 4)
    return _replay_at(local_config(cfg, layout), seq, batch, run_setup, mode, units, where, sp, ep, ar, active())


@lru_cache(maxsize=4096)
def _replay_at(
    local: ModelConfig, seq: int, batch: int, setup: TrainingSetup, mode: str, units, where, sp=1, ep=(1, 0), ar=False,
    ring=None,
):  # fmt: skip
    # the batch whose lines the replay gives (``replay_training_step``): MoE's split, SP's all-gather cat at B > 1
    hint = batch if local.moe else min(batch, 2) if sp > 1 else 1
    cuda_batch = batch if where[0] == "cuda" else None  # CUDA's scratch that is no line in B
    return _replay(local, seq, setup, mode, units, hint, where, sp, ep, ar, cuda_batch, ring).at(batch)


@lru_cache(maxsize=1024)
def _replay(
    local: ModelConfig, seq: int, setup: TrainingSetup, mode: str, units, batch: int, where, sp=1, ep=(1, 0), ar=False,
    cuda_batch=None, ring=None,
):  # fmt: skip
    """``ring``: the context-parallel ring the blocks' fused attention runs as (a key of the caches)."""
    from .replay import replay_training_step

    device, threads = where
    with installed(ring):
        return replay_training_step(
            local, seq, setup=setup, mode=mode, units=units, batch=batch, device=device, cpu_threads=threads, sp=sp,
            ep=ep, all_reduce=ar, cuda_batch=cuda_batch,
        )  # fmt: skip


def sp_replayed(layout: ParallelLayout) -> int:
    """The sequence-parallel degree the replay models (rule 5: ``replay_training_step(sp=M)``): M under
    sequence parallel, in every precision, else 1.  ``layout.check`` admits sequence parallel for dense
    models whose S splits evenly over the M ranks (``Shard(1)`` chunks of S/M positions)."""
    m = layout.tp
    return m if layout.sequence_parallel and m > 1 else 1


def peaks_exact(setup: TrainingSetup, layout: ParallelLayout, cfg: ModelConfig | None = None) -> bool:
    """Whether ``rank_step``'s forward and backward peaks are byte-exact against the fake-PG job: every
    layout that job runs, in every setup (DDP, ZeRO-1, FSDP2 ZeRO-2/3, TP, TP + SP, TP + vocab parallel,
    FSDP2 × TP with or without SP and vocab parallel: tests/test_parallel_measured.py,
    test_tensor_parallel_measured.py, test_fsdp_replay.py; TP's all-reduces replayed,
    ``replay._tp_all_reduce``).  Estimates: DDP and ZeRO-1 with TP (dp > 1 without FSDP2: torch 2.13's
    DDP takes no DTensor parameters, so the job cannot run; composed from the DDP and TP replays, each
    exact alone).  Pipeline stages (``cfg`` needed): exact where ``analytic.pipeline.stage_replayed``."""
    if layout.pp > 1:
        from .pipeline import stage_replayed

        return cfg is not None and stage_replayed(cfg, setup, layout)
    return layout.fsdp or layout.tp == 1 or layout.dp == 1


def adamw_temporary(
    cfg: ModelConfig, setup: TrainingSetup, layout: ParallelLayout, st: ModelStates, stage: int | None = None
) -> int:
    """The AdamW step's temporary (``analytic.memory.adamw_step_temporary_bytes``) for the tensors this
    rank steps (``stage``: pipeline stage ``stage``'s), with the gradients it redistributes first
    (``adamw_redistributed``, R).  foreach: one copy of v per parameter group (``torch._foreach_sqrt``;
    the measured TP rank has two groups, DTensor and plain, because foreach refuses to mix them: the
    larger counts), or 2R, which die before it; fused: R; for-loop: the single-GPU rule over the
    rank's own tensors (``_for_loop_numels``; R's tensors are among them, one at a time)."""
    e, redistributed = element_bytes(setup), adamw_redistributed(cfg, setup, layout, stage)
    if setup.optimizer == "fused":
        return redistributed
    if setup.optimizer == "for-loop" and not cfg.moe:
        groups = _for_loop_numels(cfg, layout, st.rank, stage)
        return max((a + 2 * b for g in groups for a, b in zip((0, *g), g, strict=False)), default=0) * e
    if setup.optimizer == "foreach" and layout.tp > 1 and not layout.fsdp:
        where = None if stage is None else (layout.pp, stage)
        groups = _tp_groups(cfg, layout.tp, layout.sequence_parallel, layout.vocab_parallel, where)
        return max(max(groups) * e, 2 * redistributed)
    return max(st.owned_elements * e, 2 * redistributed)  # for-loop with experts: a bound (one copy of v)


def adamw_redistributed(
    cfg: ModelConfig, setup: TrainingSetup, layout: ParallelLayout, stage: int | None = None
) -> int:
    """Bytes of the gradients placed unlike their parameters, without FSDP2 (which reduces and shards
    each gradient itself): each AdamW op that reads one redistributes it first, a new local tensor freed
    after the op (``lerp_(m, g)`` one, ``addcmul_(v, g, g)`` two at once; fused: one op, one each).
    * Vocab parallel, on the rank or stage 0 holding the embedding: its gradient is the whole (V, d),
      Replicate (``tensor_parallel._vocab_embedding_backward``), beside a Shard(0) parameter:
      ``Shard._select_split_tensor`` clones this rank's Vl rows, Vl·d·e.
    * Sequence parallel: each norm's gradient is Partial beside a Replicate parameter, all-reduced
      (``collectives`` rule 4): d·e a norm, the stage's 2L (+1 with the final norm).
    Measured: tests/test_parallel_measured.py, tests/test_pipeline_tp.py."""
    if layout.fsdp or layout.tp == 1:
        return 0
    first, last = (stage == 0, stage == layout.pp - 1) if stage is not None else (True, True)
    rows = 0
    if layout.vocab_parallel and first:
        rows += -(-cfg.vocab_size // layout.tp)  # TP rank 0's, the most
    if layout.sequence_parallel:
        blocks = len(stage_layers(cfg.num_layers, layout.pp, stage)) if stage is not None else cfg.num_layers
        rows += 2 * blocks + last
    return rows * cfg.d_model * element_bytes(setup)


def _for_loop_numels(cfg: ModelConfig, layout: ParallelLayout, rank: int, stage: int | None):
    """The tensors the for-loop AdamW of data-parallel rank ``rank`` steps, per parameter group in its
    order (one group's loop ends before the next, its last ``denom`` with it): the TP-local ones in
    ``model.parameters()`` order, DTensor then plain under TP (``measure.parallelize.param_groups``;
    FSDP2: one group, the rank's dim-0 rows of each); ZeRO-1: the owned ones, largest first
    (``ZeroRedundancyOptimizer._partition_parameters`` sorts them so)."""
    where = None if stage is None else (layout.pp, stage)
    params = _params(cfg, where)
    shapes = [local_shape(p, layout) for p in params]
    if layout.fsdp and layout.dp > 1:
        return (tuple(fsdp_rank_rows(r, layout.dp, rank) * c for r, c in shapes),)
    numels = [r * c for r, c in shapes]
    if layout.zero == 1 and layout.dp > 1:
        owners = zero1_owners(numels, layout.dp)
        return (tuple(sorted((n for n, o in zip(numels, owners, strict=True) if o == rank), reverse=True)),)
    return _tp_group_numels(layout, params)


def _is_dtensor(p: ParamShape, layout: ParallelLayout) -> bool:
    """Whether TP makes ``p`` a DTensor (split, or a norm ``SequenceParallel`` wraps under sequence
    parallel: ln1, ln2, ln_final) or leaves it plain (the embedding and head without vocab parallel, the
    other norms, qk-norm's among them: each TP rank's gradient of those is its own heads' partial sum,
    which the measured job, like ``parallelize_module`` given no plan for them, never synchronises)."""
    sp, vp = layout.tp > 1 and layout.sequence_parallel, layout.tp > 1 and layout.vocab_parallel
    norm = p.split == REPLICATED and p.name.split(".")[-2] in SEQUENCE_PARALLEL_NORMS
    return p.split in (COL, ROW) and layout.tp > 1 or (norm and sp) or (p.split == VOCAB and vp)


SEQUENCE_PARALLEL_NORMS = ("ln1", "ln2", "ln_final")  # ``measure.parallelize``'s SequenceParallel() modules


def step_counter_bytes(
    cfg: ModelConfig,
    setup: TrainingSetup,
    layout: ParallelLayout,
    st: ModelStates,
    stage: int | None = None,
    device: str = "meta",
) -> int:
    """AdamW's 0-d fp32 ``step`` counters on this rank's device (``analytic.memory.adamw_step_counter_bytes``:
    fused only, or every implementation on the CPU): 4 bytes for each parameter tensor its optimizer
    steps, the stage's (``stage``), under ZeRO-1 only the tensors it owns (``zero1_owners``)."""
    if setup.optimizer != "fused" and device != "cpu":
        return 0
    numels = local_numels(cfg, layout.tp, layout.vocab_parallel, None if stage is None else (layout.pp, stage))
    if layout.zero == 1 and layout.dp > 1:
        return 4 * zero1_owners(list(numels), layout.dp).count(st.rank)
    return 4 * len(numels)


@lru_cache(maxsize=1024)
def _tp_groups(cfg: ModelConfig, tp: int, sp: bool, vp: bool, stage: tuple[int, int] | None) -> tuple[int, int]:
    """Elements of a TP rank's (DTensor, plain) parameter groups (``stage``: (P, s), that stage's)."""
    layout = ParallelLayout(tp=tp, sequence_parallel=sp, vocab_parallel=vp)
    dtensor, plain = _tp_group_numels(layout, _params(cfg, stage))
    return sum(dtensor), sum(plain)


def _tp_group_numels(layout: ParallelLayout, params) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The local elements of each of ``params`` in the TP rank's (DTensor, plain) parameter groups
    (``measure.parallelize.param_groups``), in ``model.parameters()`` order."""
    numels = [(r * c, _is_dtensor(p, layout)) for p in params for r, c in (local_shape(p, layout),)]
    return tuple(n for n, d in numels if d), tuple(n for n, d in numels if not d)


def rank_step(
    cfg: ModelConfig,
    seq: int,
    batch: int,
    setup: TrainingSetup,
    layout: ParallelLayout,
    mode: str = "plain",
    rank: int | None = None,
    device: str = "meta",
    cpu_threads: int = 1,
) -> tuple[StepMemory, ModelStates, int]:
    """(per-phase bytes, model states, saved activations) of data-parallel rank ``rank`` (default:
    the worst).  ``device="cpu"`` with ``mode="plain"``: what the CPU allocator's own events show
    (``analytic.replay``; measured by ``measure.distributed.measure_rank_plain``).

    From the TP-local single-GPU replay R (exact for DDP and TP; checked), with
    n = the local parameter bytes, o = 2n (AdamW moments):

    * baseline = R.baseline − n − o + parameters + optimizer + DDP buckets;
    * forward and backward: R's, shifted by the same baseline change (R's forward end is its baseline
      plus the saved activations, ``saved_activations``: checked on a grid in tests/test_parallel.py;
      under FSDP2 + every unit unsharded under zero 2, which keeps them from forward to backward; in a
      plain CPU run + the CPU allocator's own extras, e.g. naive attention's wrapped scale);
    * backward end: baseline + gradients (FSDP2: R's, shifted);
    * optimizer step: peak = baseline + gradients + ``adamw_temporary``; end = baseline.

    FSDP2 (zero 2, 3; D > 1): R is replayed with FSDP2's own events at every unit boundary (all-gather
    output and unsharded parameters, reshard, prefetch, reduce-scatter input and output:
    ``analytic.fsdp``).

    Sequence parallel: R is the sequence-parallel rank's own replay (rule 5, ``sp_replayed``).

    ``--checkpoint op`` (torchtitan's per-op policy, which this replay lacks): ``ops.data_parallel.op_rank_step``.

    Exact (byte for byte against the fake-PG run) for DDP, ZeRO-1, TP, TP + SP in every precision (with
    or without vocab parallel) and FSDP2, with TP and SP too, or expert parallel in fp32 and bf16
    (``tests/test_parallel_measured.py``, ``tests/test_tensor_parallel_measured.py``,
    ``tests/test_parallel_moe.py``; what is left: ``peaks_exact``); HSDP, its shard group's FSDP2 rank (rule 8,
    ``tests/test_hsdp.py``).
    """
    if setup.checkpoint == "op":  # torchtitan's per-op policy: the op library's course program, not this replay
        from .ops.data_parallel import op_rank_step

        return op_rank_step(cfg, seq, batch, setup, layout, mode, rank, device, cpu_threads)
    layout.check(cfg, seq)
    whole, dp_rank, dim1 = layout, rank, experts_on_dim1(cfg, layout)  # dim1: the whole layout's (rule 8)
    layout, rank = layout.shard_rank(rank)  # HSDP (rule 8): its shard group's FSDP2 rank
    units = fsdp_units(cfg, setup, layout, cuda=device == "cuda", dim1=dim1) if layout.fsdp and layout.dp > 1 else None
    st = model_states(cfg, setup, whole, rank=rank)  # HSDP: shard rank ``rank``'s
    r = single_rank_step(cfg, seq, batch, setup, layout, mode, units, device, cpu_threads, st.rank)
    act = saved_activations(cfg, seq, batch, setup, layout) + expert_parallel_saved_shift(
        cfg, seq, batch, setup, layout, mode, st.rank
    )
    e = element_bytes(setup)
    n = sum(local_numels(cfg, layout.tp, layout.vocab_parallel)) * e
    n_run = n * DTYPE_BYTES[fsdp_compute_setup(setup, layout).param_dtype] // e  # the replay's parameter bytes
    # the replay's AdamW step counters are the whole model's; ZeRO-1's rank keeps its owned tensors' only
    counters = step_counter_bytes(cfg, setup, layout, st, device=device) - adamw_step_counter_bytes(
        cfg, setup.optimizer, device
    )
    shift = st.parameters + st.optimizer + st.ddp_buckets + counters - 3 * n_run
    base = r.baseline + shift
    fwd = PhaseBytes(r.forward.peak + shift, r.forward.end + shift)  # R's forward end: baseline + ``act``
    # without FSDP2, R's gradients are the rank's (whole local tensors), but vocab parallel's whole embedding one
    bwd = PhaseBytes(r.backward.peak + shift, r.backward.end + shift if units else base + st.gradients)
    z = Sizes(cfg, e=e, setup=setup, plain=mode == "plain", cpu=mode == "plain" and device == "cpu")
    opt = PhaseBytes(base + st.gradients + adamw_temporary(cfg, setup, layout, st) + adamw_step_scalar_bytes(z), base)
    if whole.replicate > 1 and dp_rank is not None:
        st = dataclasses.replace(st, rank=dp_rank)
    return StepMemory(base, fwd, bwd, opt), st, act


def rank_floor(cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup, layout: ParallelLayout) -> int:
    """A lower bound of ``rank_step``'s peak, without the replay (the planner's first look): the worst
    rank's model states (parameters, AdamW moments, DDP's buckets) and what its forward saves, all live
    when the forward ends.  Never above the replayed peak (tests/test_plan.py checks it on every
    candidate of three plans).  Under ``op`` (torchtitan's per-op policy, which the saved-activation rules lack)
    the forward saves what ``full`` saves, each block's input held by its checkpoint, and more (every matmul
    output but every second one, ``ops.course.sac``): ``full``'s figure is its floor."""
    st = model_states(cfg, setup, layout)
    saver = dataclasses.replace(setup, checkpoint="full") if setup.checkpoint == "op" else setup
    return st.parameters + st.optimizer + st.ddp_buckets + saved_activations(cfg, seq, batch, saver, layout)


def expert_parallel_saved_shift(
    cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup, layout: ParallelLayout, mode: str, rank: int
) -> int:
    """What data-parallel rank ``rank`` saves for backward beyond the single-GPU model under expert parallel
    (rule 7; 0 without): the replay's forward end with the rank's own dispatch and combine less the one
    without, both with no FSDP2 events (each end is the baseline plus what is saved): the received rows
    (R·d) saved by the experts instead of the slots (T·k·d), the experts' tensors on R rows instead of
    T·k, and in a plain run the dispatch's int64 indices (``replay._ep_index_bytes``)."""
    if layout.ep == 1:
        return 0
    local, run, where = local_config(cfg, layout), fsdp_compute_setup(setup, layout), ("meta", 1)
    own = _replay_at(local, seq, batch, run, mode, None, where, 1, (layout.ep, rank % layout.ep))
    return own.forward.end - _replay_at(local, seq, batch, run, mode, None, where).forward.end


def expert_rows(cfg: ModelConfig, seq: int, batch: int, layout: ParallelLayout, rank: int = 0) -> int:
    """Token rows the routed experts of data-parallel rank ``rank`` process per MoE layer (rule 7)."""
    slots = batch * seq * cfg.experts_per_token
    if layout.ep == 1:
        return slots
    return expert_parallel_split(slots, cfg.num_experts, layout.ep, rank % layout.ep).received


def rank_flops(
    cfg: ModelConfig,
    seq: int,
    batch: int,
    setup: TrainingSetup,
    layout: ParallelLayout,
    rank: int = 0,
    stage: int | None = None,
) -> StepFlops:
    """Matmul FLOPs of one step on data-parallel rank ``rank``: the TP-local model's (vocab parallel: its
    LM head's local rows), with the routed experts' rows of rule 7 under expert parallel.  Under pipeline
    parallel, pipeline stage ``stage``'s (``stage_flops``); with virtual stages, pipeline rank ``stage``'s
    chunks' summed (``ParallelLayout.as_chunks``: each chunk's m micro-batches)."""
    if layout.virtual_stages > 1:
        lay, m, S = layout.as_chunks(), layout.micro_batches, layout.stages
        parts = [rank_flops(cfg, seq, batch, setup, lay, rank, c) for c in layout.chunks(stage or 0)]
        total = lambda f: sum(getattr(p, f) for p in parts) * m // S  # each chunk's S micro-batches, to m
        return StepFlops(total("forward"), total("recompute"), total("attention_recompute"))
    if layout.pp > 1:
        flops = stage_flops(local_config(cfg, layout), seq, batch, setup, layout, stage or 0)
    else:
        flops = step_flops(local_config(cfg, layout), seq, batch, setup)
    if layout.vocab_parallel and (stage or 0) == layout.pp - 1:
        # the LM head's Vl = ceil(V/M) rows on rank 0: 2·T·d·(V − Vl) fewer forward, each micro-batch of the
        # stage's step (without pipeline parallel the figure is one micro-batch's)
        cut = 2 * batch * seq * cfg.d_model * (cfg.vocab_size - -(-cfg.vocab_size // layout.tp))
        flops = dataclasses.replace(flops, forward=flops.forward - cut * (layout.micro_batches if layout.pp > 1 else 1))
    if layout.ep == 1:
        return flops
    rows = expert_rows(cfg, seq, batch, layout, rank) - batch * seq * cfg.experts_per_token
    extra = cfg.moe_layers * 3 * 2 * rows * cfg.d_model * cfg.expert_width  # rule 7, per forward
    rerun = setup.checkpoint == "full" or setup.checkpoint == "op"  # op: the experts' bmm is not saved
    recompute = flops.recompute + (extra if rerun else 0)
    return dataclasses.replace(flops, forward=flops.forward + extra, recompute=recompute)


def stage_flops(
    cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup, layout: ParallelLayout, stage: int
) -> StepFlops:
    """Matmul FLOPs of one step on pipeline stage ``stage``: m micro-batches of ``batch`` sequences through
    its blocks, and on the last stage the LM head (the stage's model: ``step_flops`` of its blocks, less
    the head elsewhere)."""
    f, m = _micro_batch_flops(cfg, seq, batch, setup, layout.pp, stage), layout.micro_batches
    return StepFlops(m * f.forward, m * f.recompute, m * f.attention_recompute)


def _micro_batch_flops(cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup, stages: int, stage: int):
    blocks = len(stage_layers(cfg.num_layers, stages, stage))
    return _blocks_flops(cfg, seq, batch, setup, blocks, stage == stages - 1)


@lru_cache(maxsize=4096)
def _blocks_flops(cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup, blocks: int, head: bool):
    """One micro-batch's matmul FLOPs through ``blocks`` blocks, with the LM head or without.  A chunk of no block
    (interleaved stages outnumbering the blocks: ``stage_layers``' last chunks; the Llama 3 paper's head-only last
    chunk) runs the head's matmuls alone, none recomputed (the head is never checkpointed)."""
    from .flops import forward_flops

    if blocks == 0:
        one = cfg.with_layers(1)
        outside = sum(it.total for it in forward_flops(one, seq, batch) if not it.key.startswith("layers.*."))
        return StepFlops(outside if head else 0, 0, 0)
    c = cfg.with_layers(blocks)
    f = step_flops(c, seq, batch, setup)
    if not head:
        head = sum(it.total for it in forward_flops(c, seq, batch) if not it.key.startswith("layers.*."))
        f = dataclasses.replace(f, forward=f.forward - head)
    return f


def stage_layers(layers: int, stages: int, stage: int) -> range:
    """The blocks of pipeline stage ``stage``: L // P each, the first L mod P stages one more."""
    base, extra = divmod(layers, stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))


@lru_cache(maxsize=1024)
def stage_parameters(cfg: ModelConfig, stages: int, stage: int) -> tuple[ParamShape, ...]:
    """Stage 0 holds the embedding, the last stage the final norm and the LM head (a tied head is
    a second copy there), each its own blocks."""
    blocks = {i + 1 for i in stage_layers(cfg.num_layers, stages, stage)}
    params = parameter_shapes(cfg)
    first_block = next((i for i, p in enumerate(params) if p.unit), len(params))
    out = [p for p in params if p.unit in blocks]
    if stage == 0:
        out[:0] = params[:first_block]  # the embeddings
    if stage == stages - 1:
        out += [p for p in params[first_block:] if p.unit == 0]  # final norm, LM head
        if cfg.tie_embeddings:
            out.append(ParamShape("lm_head.weight", (cfg.vocab_size, cfg.d_model), VOCAB, 0))
    return tuple(out)
