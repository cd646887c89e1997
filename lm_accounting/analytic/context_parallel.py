"""One rank of a context-parallel job (``layout.cp`` > 1; ``parallelisms.cp``): memory, FLOPs and collectives.
No torch.

torch 2.13's ``context_parallel`` (``torch/distributed/tensor/experimental/_context_parallel/_attention.py``) splits
each sequence over the cp ranks, load-balanced (``_HeadTailLoadBalancer``: rank c holds chunks c and 2cp − 1 − c of
2·cp), so a rank runs every op but the attention on s = S/cp positions, and each fused attention as ring attention
over the cp ranks.  torchtitan (``torchtitan/models/llama3/infra/parallelize.py`` ``apply_fsdp`` over
``parallel_dims.get_mesh("dp_shard_cp")``; DDP over ``dp_cp``) runs FSDP2, DDP and ZeRO-1 over the flattened dp × cp
ranks; beside HSDP (``replicate`` r) FSDP2 over the 2-D (dp_replicate, dp_shard_cp) mesh, its shard group the
dp/r · cp ranks of one replica.  So, with ``flat`` = ``ParallelLayout.flat_cp()`` (dp·cp data-parallel ranks, no CP;
HSDP's replicate kept: r groups of dp/r · cp):

1. Model states, FSDP2's units and their collectives, DDP's buckets: ``flat``'s (its rules in ``analytic.parallel``
   and ``analytic.collectives``), the group "dp" renamed "dp_cp" (dp·cp ranks, tp apart); beside HSDP, rule 8's
   shard-group rank and rule 12's collectives, "dp_shard" renamed "dp_shard_cp" (torchtitan's), "dp_replicate" kept.
2. Saved activations, baseline and every phase's end: ``flat``'s rank at s positions.  The ring attention saves what
   the fused kernel saves at s (q, k, v, the output and its fp32 logsumexp: ``_SDPAMerger.results`` casts back to
   the input dtype): the ends are equal (``cp_rank_step`` checks it on each replay; measured, tests/test_cp.py).
3. Peaks: the higher of ``flat``'s at s and the op library's replay of the flattened rank (``ops.predict_step``;
   TP: its one-GPU program of the TP-local model, h/tp heads) with torch's ring transliterated around the fused
   attention (``ops.aten_ring``, installed as a hook of the CPU flash op), shifted to the rank's baseline.  The
   replay with the ring is the rank's program but for what the op library does not run (TP's all-reduces, DDP's
   buckets), which never coincides with the ring: where the ring is, it is the rank's live bytes; elsewhere it is at
   most ``flat``'s.  The load-balanced branches differ by cp rank (rank c holds chunks c and 2cp − 1 − c): a rank's
   own, or the worst cp rank's.  The optimizer step, where no ring runs, is ``flat``'s alone: the op library
   replays FSDP2's rank 0, whose AdamW transients exceed a short last shard's by more than the baseline shift (an
   uneven vocabulary, tests/test_cp_hsdp.py).  Equal to the fake-PG run (``measure_cp_rank``) on every rank of
   tests/test_cp.py's and tests/test_cp_hsdp.py's grids.
   Beside sequence or vocab parallel the op library has no program of the rank (SP's norms and residual stream at
   s/tp rows, its all-gathers and reduce-scatters; the vocab-parallel head and loss): the peaks are ``flat``'s own
   replay (``analytic.replay``, ``rank_step``; ``analytic.tensor_parallel.vocab_parallel_replay``) with cp rank c's
   ring spliced into its blocks (``replay._ring``: ``ops.aten_ring.ring_deltas``, the same transliteration's
   allocations and frees in order, and what its layouts change downstream: dK and dV one buffer, dV copied for
   v_proj).  That replay is the whole rank's program, TP's collectives included; without SP it equals the op
   library's with the ring on every phase (tests/test_cp.py), and with SP, vocab parallel or both it equals the
   fake-PG run on every rank of cp 2 · tp 2 and dp 2 · cp 2 · tp 2 (fp32, amp-bf16; none, full).
4. FLOPs (the full-square convention of ``analytic.flops``): a rank does 1/cp of every sequence's attention, cp·s²
   of the S² score square per layer, so its QKᵀ and AV are cp times the s-position model's; everything else is the
   s-position model's (``rank_flops``).  The kernels the ring runs are the causal half: s² + (cp − 1)·s²/2.
5. Collectives (``analytic.collectives`` rule 13), per layer, KV = the rank's K and V (2·B·h_kv·s·d_head·a, a the
   attention inputs' bytes), dKV = their fp32 gradients (``_cp_options.convert_to_f32``): rotate "allgather"
   (torch's default): one all-gather of cp·KV in the forward, one again in the backward (K and V are not saved
   gathered), cp ring shifts of dKV (``_AllToAllRotater``: an ``all_to_all_single`` sending the whole buffer to the
   next rank); under full checkpointing the recompute's all-gather too.  Rotate "alltoall": KV shifted cp − 1 times
   in the forward and again in the backward (and the recompute), cp shifts of dKV.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache

from ..config import AccountingError, ModelConfig
from ..layout import ParallelLayout
from ..parallelisms.cp import check_attention
from ..phases import PHASES, PhaseBytes, StepMemory
from ..setup import TrainingSetup
from .collectives import Collective, step_collectives
from .hardware_flops import StepFlops
from .ops.aten_ring import Ring, installed
from .parallel import ModelStates, local_config, rank_flops, rank_step

ROTATES = ("allgather", "alltoall")


def check(cfg: ModelConfig, seq: int, setup: TrainingSetup, layout: ParallelLayout, rotate: str = "allgather") -> int:
    """Refuse (one line) a CP job we do not account; the rank's positions s = S/cp."""
    layout.check(cfg, seq)
    check_attention(layout, setup.attention)
    if rotate not in ROTATES:
        raise AccountingError(f"unknown CP rotate method {rotate!r} (valid: {', '.join(ROTATES)})")
    if setup.checkpoint in ("selective", "op"):
        raise AccountingError(
            f"context parallel (cp={layout.cp}) with {setup.checkpoint} checkpointing is not measured: use none or full"
        )
    return seq // layout.cp


def _sizes(cfg: ModelConfig, s: int, batch: int, setup: TrainingSetup, tp: int = 1) -> tuple[int, int]:
    """(KV, dKV): the rank's K and V (its kv/tp heads under TP) in the attention inputs' dtype (bf16 under bf16 and
    amp-bf16), and their fp32 gradients."""
    a = 4 if setup.precision == "fp32" else 2
    kv = 2 * batch * (cfg.kv_heads // tp) * s * cfg.d_head
    return kv * a, kv * 4


def cp_collectives(
    cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup, layout: ParallelLayout, rotate: str = "allgather"
) -> list[Collective]:
    """Rule 13 (module docstring, 5) over the cp group, the step's L attention layers."""
    s, cp, L = seq // layout.cp, layout.cp, cfg.num_layers
    kv, dkv = _sizes(cfg, s, batch, setup, layout.tp)
    again = 2 if setup.checkpoint == "full" else 1  # the backward's own, and the recompute's
    if rotate == "allgather":
        out = [
            Collective("all_gather", "forward", "cp", L, L * cp * kv, "K, V gathered, cp·KV a layer"),
            Collective("all_gather", "backward", "cp", again * L, again * L * cp * kv, "K, V gathered again"),
        ]
    else:
        out = [
            Collective("all_to_all", "forward", "cp", L * (cp - 1), L * (cp - 1) * kv, "K, V shifted cp−1 times"),
            Collective("all_to_all", "backward", "cp", again * L * (cp - 1), again * L * (cp - 1) * kv, "K, V again"),
        ]
    return out + [Collective("all_to_all", "backward", "cp", L * cp, L * cp * dkv, "fp32 dK, dV shifted cp times")]


def rank_collectives(
    cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup, layout: ParallelLayout, rank: int = 0,
    rotate: str = "allgather",
) -> list[Collective]:  # fmt: skip
    """Every collective of the CP rank's step: ``flat``'s over dp·cp ranks (group "dp_cp"; beside HSDP its shard
    group's over dp_shard·cp ranks, "dp_shard_cp", and the all-reduces over "dp_replicate"), then rule 13's."""
    s = check(cfg, seq, setup, layout, rotate)
    flat = step_collectives(cfg, s, batch, setup, layout.flat_cp(), rank=rank)
    names = {"dp": "dp_cp", "dp_shard": "dp_shard_cp"}  # torchtitan's flattened meshes
    renamed = [c._replace(group=names.get(c.group, c.group)) for c in flat]
    return renamed + cp_collectives(cfg, seq, batch, setup, layout, rotate)


@lru_cache(maxsize=256)
def op_library_step(
    cfg: ModelConfig, s: int, batch: int, setup: TrainingSetup, flat: ParallelLayout, mode: str, device: str,
    ring: Ring | None,
) -> StepMemory:  # fmt: skip
    """The op library's replay of ``flat``'s rank (``ops.predict_step``; FSDP2: its rank, ``ops.fsdp``; else one
    GPU's program, which DDP and ZeRO-1 only shift by a constant; TP: the TP-local model's; HSDP: its shard group's
    FSDP2 rank, ``analytic.parallel`` rule 8) with ``ring`` installed (``ops.aten_ring``; None: the fused kernel
    alone)."""
    from .ops import predict_step

    local = local_config(cfg, flat)  # TP: the rank's h/tp heads (``analytic.parallel`` rule 1)
    group = flat.shard_group()  # HSDP: the replicas' all-reduce runs in place (rule 8)
    fsdp = dataclasses.replace(group, tp=1, sequence_parallel=False) if flat.fsdp and flat.dp > 1 else None
    with installed(ring):
        step = predict_step(local, s, setup, impl="course", batch=batch, mode=mode, device=device, layout=fsdp)
    return step.at(batch)


def cp_rank_step(
    cfg: ModelConfig,
    seq: int,
    batch: int,
    setup: TrainingSetup,
    layout: ParallelLayout,
    mode: str = "plain",
    rank: int | None = None,
    device: str = "meta",
    cpu_threads: int = 1,
    rotate: str = "allgather",
) -> tuple[StepMemory, ModelStates, int]:
    """(per-phase bytes, model states, saved activations) of global rank ``rank`` (default the worst) on the
    (dp, cp, tp) mesh: ``flat``'s data-parallel rank rank // tp (dp rank k, cp rank c: k·cp + c) at s positions
    (``analytic.parallel.rank_step``), each peak the higher of its and ``op_library_step``'s with cp rank c's ring,
    shifted to the rank's baseline (module docstring, 2-3); beside sequence or vocab parallel, ``rank_step``'s own
    replay with that ring installed.  The load-balanced branches differ by cp rank: the
    default is each phase's worst over the cp ranks."""
    s = check(cfg, seq, setup, layout, rotate)
    flat = layout.flat_cp()
    if device == "cuda":  # the ring is replayed around the CPU flash kernel (``ops.aten_flash``) only
        raise AccountingError("context parallel on a CUDA target is not replayed: its ring runs CUDA's kernels")
    flat_rank = None if rank is None else rank // layout.tp
    step, st, act = rank_step(cfg, s, batch, setup, flat, mode, flat_rank, device, cpu_threads)
    peaks: dict[str, int] = {}
    for c in range(layout.cp) if rank is None else (flat_rank % layout.cp,):
        if layout.sequence_parallel or layout.vocab_parallel:  # the rank's own replay with the ring (docstring, 3)
            with installed(Ring(layout.cp, c, rotate)):
                ring = rank_step(cfg, s, batch, setup, flat, mode, flat_rank, device, cpu_threads)[0]
        else:
            ring = op_library_step(cfg, s, batch, setup, flat, mode, device, Ring(layout.cp, c, rotate))
        shift = step.baseline - ring.baseline  # DDP, ZeRO-1: the rank's states beside one GPU's (rank_step)
        for p in ("forward", "backward"):  # the ring's phases; the optimizer step is the rank's own (rank_step)
            peaks[p] = max(peaks.get(p, 0), getattr(step, p).peak, getattr(ring, p).peak + shift)
    peaks["optimizer_step"] = step.optimizer_step.peak  # no ring; the op library's AdamW is rank 0's (docstring, 3)
    return StepMemory(step.baseline, *(PhaseBytes(peaks[p], getattr(step, p).end) for p in PHASES)), st, act


def cp_rank_flops(
    cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup, layout: ParallelLayout, rank: int = 0
) -> StepFlops:
    """Module docstring, 4: the s-position model's, its QKᵀ and AV cp times."""
    from .flops import forward_flops

    s = check(cfg, seq, setup, layout)
    flops = rank_flops(cfg, s, batch, setup, layout.flat_cp(), rank)
    fwd = forward_flops(local_config(cfg, layout), s, batch)  # TP: the rank's h/tp heads
    attention = sum(fwd[k].total for k in ("layers.*.attn.qk", "layers.*.attn.av") if k in fwd)
    extra = (layout.cp - 1) * attention
    return dataclasses.replace(
        flops,
        forward=flops.forward + extra,
        recompute=flops.recompute + (extra if setup.checkpoint == "full" else 0),
        attention_recompute=flops.attention_recompute * layout.cp,
    )
