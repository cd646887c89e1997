"""How a training job is spread over GPUs, beside the ``TrainingSetup`` (how each GPU trains).

No torch import.  ``ParallelLayout`` names the degrees; ``check(cfg)`` refuses a layout the model
cannot take, with one line.  The layouts map onto torch.distributed (torch 2.13) as follows:

* ``zero=0``: DDP (``DistributedDataParallel``) over ``dp`` ranks: every rank holds every parameter,
  gradient and optimizer state; gradients are all-reduced.
* ``zero=1``: DDP plus ``ZeroRedundancyOptimizer`` (AdamW): whole parameters are assigned to ranks
  (largest first, to the least-loaded rank) and each rank keeps the AdamW state of its own only;
  updated parameters are broadcast from their owner.
* ``zero=2``: FSDP2 ``fully_shard(..., reshard_after_forward=False)`` on every block and the root:
  parameters, gradients and optimizer state sharded on dim 0 over ``dp``; a block's parameters
  stay unsharded from its forward to its backward.
* ``zero=3``: FSDP2 full shard (``reshard_after_forward=True``), with ``MixedPrecisionPolicy(
  param_dtype=bf16, reduce_dtype=fp32)`` under ``precision="amp-bf16"``.
* ``tp``: Megatron tensor parallel (``parallelize_module``): q/k/v and w1/w3 column-wise (dim 0 of
  the (out, in) weight split), output_proj and w2 row-wise (dim 1 split); norms replicated.
  ``sequence_parallel``: norms and residual stream split along the sequence between the blocks.
  ``vocab_parallel``: the embedding split row-wise and the LM head column-wise over the vocabulary.
* ``pp`` stages with ``micro_batches`` per step under 1F1B (``analytic.pipeline``: replayed exactly
  alone or beside dp, tp, sp and vocab parallel, estimated beside DDP/ZeRO-1 × tp; a stage measured
  by ``measure.pipeline.measure_stage_rank``, beside all of them but expert parallel).  The mesh is (pp, dp, tp), stages
  outermost (torchtitan's), so global rank r is on stage r // (dp·tp).
* ``virtual_stages`` v (interleaved 1F1B: torch 2.13's ``ScheduleInterleaved1F1B``, Megatron's
  ``--num-layers-per-virtual-pipeline-stage``; Narayanan et al. 2021, "Efficient Large-Scale Language
  Model Training on GPU Clusters Using Megatron-LM", §2.2.2): the model is split into pp·v stages by the
  same rule (``analytic.parallel.stage_layers``: the first L mod pp·v one block more), and pipeline rank
  r holds the v chunks r, r + pp, r + 2pp, ... (``generate_stage_to_rank_mapping``'s "loop" style,
  torch/distributed/pipelining/_utils.py).  The schedule runs in rounds of m // pp micro-batches (at
  least 1) and refuses an m that is not a whole number of rounds (``ScheduleInterleaved1F1B.__init__``).
* ``ep``: expert parallel for a mixture of experts, torchtitan's convention
  (``torchtitan/distributed/expert_parallel.py`` ``ExpertParallel``; ``apply_fsdp`` in
  ``torchtitan/models/*/infra/parallelize.py``): the ep ranks are borrowed from the data-parallel ones
  (ep divides dp and E), each holds E/ep routed experts, and tokens reach them by an all-to-all
  dispatch and combine; FSDP2 (zero 2 or 3) shards the expert stacks over the dp/ep ranks that hold
  the same experts (their own unit per MoE block) and everything else over dp.

* ``replicate`` r (HSDP, torchtitan's ``ParallelDims.dp_replicate``; zero 2 or 3 only): FSDP2 over a
  2-D mesh ``init_device_mesh(..., (r, dp // r), mesh_dim_names=("dp_replicate", "dp_shard"))``
  (``fully_shard``: a 2-D mesh is HSDP, ``(Replicate(), Shard(0))``; torch 2.13
  ``_fully_shard/_fsdp_init.py`` ``_get_mesh_info``).  Parameters, gradients and optimizer state are
  sharded over the s = dp/r ranks of a shard group (``shard``) and replicated over the r groups; each
  unit is all-gathered and reduce-scattered over its shard group, then its reduce-scatter output is
  all-reduced over the replicate group (``_fsdp_collectives.foreach_reduce``).  Data-parallel rank k
  is replica k // s, shard rank k mod s.  Beside expert parallel, torchtitan's MoE mesh: ep borrowed from the
  shard group (``parallelisms.hsdp``; ep divides s).  Beside pipeline parallel, each stage's units over its
  shard group (the mesh (pp, dp_replicate, dp_shard, tp)); not beside both pipeline and expert parallel (no
  mixture of experts is accounted under pipeline parallel: ``parallelisms.hsdp``).

* ``cp`` (context parallel, torchtitan's ``ParallelDims.cp``; ``parallelisms.cp``): each sequence's positions
  split over cp ranks, load-balanced, the fused attention run as torch 2.13's ring attention; the mesh is
  (pp, dp, cp, tp) and DDP, ZeRO-1 and FSDP2 run over the flattened dp × cp ranks (``flat_cp``).  Beside HSDP,
  torchtitan's (dp_replicate, dp_shard, cp, tp) mesh: FSDP2 over (dp_replicate, dp_shard_cp), a shard group of
  dp/replicate · cp ranks (``shard``), the label's ``hsdp{r}x{shard}``.

``world = dp · cp · tp · pp`` GPUs.  With ZeRO/FSDP the sharding degree is ``dp`` (HSDP: ``dp // replicate``;
CP: dp·cp), never the world.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

from . import parallelisms
from .config import MAX_SIZE, MAX_WORLD, AccountingError, ModelConfig, check_positive_int, short_repr

ZERO_NAMES = {0: "DDP", 1: "ZeRO-1", 2: "FSDP2 (ZeRO-2)", 3: "FSDP2 (ZeRO-3)"}


def _positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise AccountingError(f"{name} must be a positive integer, got {short_repr(value)}")


@dataclass(frozen=True, kw_only=True)
class ParallelLayout:
    """One parallel layout (see the module docstring).  The default is one GPU."""

    dp: int = 1
    zero: int = 0
    tp: int = 1
    sequence_parallel: bool = False
    vocab_parallel: bool = False
    pp: int = 1
    micro_batches: int = 1
    ep: int = 1
    virtual_stages: int = 1
    replicate: int = 1  # HSDP's replicate degree (torchtitan's dp_replicate); the shard degree is dp // replicate
    cp: int = 1  # context parallel: each sequence over cp ranks (torchtitan's ParallelDims.cp)

    def __post_init__(self) -> None:
        degrees = (self.dp, self.tp, self.pp, self.micro_batches, self.ep, self.virtual_stages, self.replicate, self.cp)
        if not all(type(d) is int and 1 <= d <= MAX_SIZE for d in degrees):  # the planner's thousands: one pass
            for name in ("dp", "tp", "pp", "micro_batches", "ep", "virtual_stages", "replicate", "cp"):
                _positive(name, getattr(self, name))
            check_positive_int("micro_batches", self.micro_batches)
        if self.world > MAX_WORLD or self.ep > MAX_WORLD:
            raise AccountingError(
                f"dp·cp·tp·pp = {self.dp:,}·{self.cp:,}·{self.tp:,}·{self.pp:,} GPUs is beyond the supported {MAX_WORLD:,}"
                if self.ep <= MAX_WORLD
                else f"ep = {self.ep:,} is beyond the supported {MAX_WORLD:,} GPUs"
            )
        parallelisms.validate(self)  # each parallelism's own rules (lm_accounting/parallelisms)

    @property
    def shard(self) -> int:
        """FSDP2's sharding degree: dp, or under HSDP the shard group's dp // replicate (torchtitan's dp_shard), under
        context parallel the flattened dp·cp (torchtitan's dp_shard_cp), beside HSDP too: dp/replicate · cp."""
        return self.dp * self.cp // self.replicate

    def shard_group(self) -> ParallelLayout:
        """The FSDP2 layout over one HSDP shard group (dp = shard, no replicas): every per-rank buffer and
        state of an HSDP rank is that rank's (the all-reduce over the replicas runs in place on the
        reduce-scatter output, which becomes the sharded gradients).  ``self`` without HSDP."""
        return self if self.replicate == 1 else _shard_group(self)

    def shard_rank(self, rank: int | None) -> tuple[ParallelLayout, int | None]:
        """(``shard_group``, data-parallel rank ``rank``'s rank in it): where an HSDP rank's memory is its shard
        group's FSDP2 rank's (``analytic.parallel`` rule 8), beside pipeline parallel too."""
        if self.replicate == 1:
            return self, rank
        return _shard_group(self), None if rank is None else rank % self.shard

    def flat_cp(self) -> ParallelLayout:
        """The data-parallel layout over the flattened dp × cp ranks (torchtitan's ``dp_shard_cp``): what a
        context-parallel rank's model states, FSDP2 units and gradient collectives are (``parallelisms.cp``);
        data-parallel rank k, cp rank c is its rank k·cp + c.  ``self`` without CP."""
        return self if self.cp == 1 else _flat_cp(self)

    @property
    def stages(self) -> int:
        """Pipeline stages of the model: pp · v (v chunks on each pipeline rank)."""
        return self.pp * self.virtual_stages

    def chunks(self, rank: int) -> tuple[int, ...]:
        """The model stages pipeline rank ``rank`` holds: rank, rank + pp, ... (torch's "loop" mapping)."""
        return tuple(range(rank, self.stages, self.pp))

    def as_chunks(self) -> ParallelLayout:
        """Interleaved 1F1B's pp·v model stages as a 1F1B pipeline of pp·v ranks, one chunk each: the layout
        the per-stage rules (states, baseline, buffers, FLOPs, collectives) read for one chunk.  Its
        micro-batch count is pp·v (a valid 1F1B layout): what grows with m is scaled to the job's m by
        the callers."""
        return _as_chunks(
            self.dp, self.zero, self.tp, self.sequence_parallel, self.vocab_parallel, self.stages, self.ep,
            self.replicate,
        )  # fmt: skip

    @property
    def world(self) -> int:
        """GPUs in the job: dp · cp · tp · pp."""
        return self.dp * self.cp * self.tp * self.pp

    @property
    def fsdp(self) -> bool:
        """FSDP2 shards parameters and gradients (ZeRO-2 and ZeRO-3)."""
        return self.zero >= 2

    @property
    def single(self) -> bool:
        return self.world == 1

    def check(self, cfg: ModelConfig, seq: int | None = None) -> None:
        """Refuse, with one line, a layout that ``cfg`` (at ``seq`` tokens a sequence) cannot take."""
        moe_mla = [u for u in ("mixture of experts", "latent attention (MLA)") if u in cfg.unsupported_for_replay()]
        unsupported = [u for u in cfg.unsupported_for_replay() if u not in moe_mla]
        if unsupported and not self.single:
            data_parallel = (
                self.tp == self.pp == self.ep == self.replicate == self.cp == 1
            )  # what the op library replays
            hint = (
                "; --impl transformers --dp N replays DDP, ZeRO-1 or FSDP2 (--zero 0-3) over transformers' model"
                if cfg.hf_model_type and data_parallel
                else ""
            )
            raise AccountingError(
                f"parallel layouts cover the course architecture (GQA, head_dim, qk-norm, tied embeddings), "
                f"mixture of experts and latent attention; {cfg.name} has {', '.join(unsupported)}{hint}"
            )
        if moe_mla and (self.tp > 1 or self.pp > 1):
            raise AccountingError(
                f"{cfg.name} has {' and '.join(moe_mla)}: covered are data parallel (DDP, ZeRO-1, FSDP2) "
                "and expert parallel; tensor and pipeline parallel are not (tp = pp = 1)"
            )
        parallelisms.check(self, cfg, seq)

    @property
    def label(self) -> str:
        """``dp8·zero3·tp2+sp``: one short name for tables and test ids (each parallelism names its part)."""
        return parallelisms.label(self)

    def to_dict(self) -> dict[str, int | bool | str]:
        return {
            "dp": self.dp,
            "zero": self.zero,
            "tp": self.tp,
            "sequence_parallel": self.sequence_parallel,
            "vocab_parallel": self.vocab_parallel,
            "pp": self.pp,
            "micro_batches": self.micro_batches,
            "virtual_stages": self.virtual_stages,
            "ep": self.ep,
            "replicate": self.replicate,
            "cp": self.cp,
            "shard": self.shard,
            "world": self.world,
            "data_parallel": ZERO_NAMES[self.zero] + (" HSDP" if self.replicate > 1 else ""),
        }


@lru_cache(maxsize=4096)
def _shard_group(layout: ParallelLayout) -> ParallelLayout:
    return dataclasses.replace(layout, dp=layout.shard, replicate=1)


@lru_cache(maxsize=4096)
def _flat_cp(layout: ParallelLayout) -> ParallelLayout:
    return dataclasses.replace(layout, dp=layout.dp * layout.cp, cp=1)


@lru_cache(maxsize=4096)
def _as_chunks(dp: int, zero: int, tp: int, sp: bool, vp: bool, stages: int, ep: int, r: int) -> ParallelLayout:
    """Cached on every field but the micro-batch count, which the chunks' layout does not keep."""
    return ParallelLayout(
        dp=dp, zero=zero, tp=tp, sequence_parallel=sp, vocab_parallel=vp, pp=stages, micro_batches=stages, ep=ep,
        replicate=r,
    )  # fmt: skip


def parse_gpu_count(text: str) -> tuple[int, int]:
    """``"8..1024"`` -> (8, 1024); ``"64"`` -> (64, 64)."""
    low, sep, high = text.partition("..")
    try:
        lo, hi = int(low), int(high if sep else low)
    except ValueError:
        raise AccountingError(f"GPU count must be N or LOW..HIGH, got {text!r}") from None
    if lo < 1 or hi < lo:
        raise AccountingError(f"GPU range {text!r} must satisfy 1 <= LOW <= HIGH")
    return lo, hi
