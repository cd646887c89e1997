"""One data-parallel rank of our model under torchtitan's per-op selective checkpointing (``--checkpoint op``),
from the op library's course program (``course.sac``) under FSDP2 (``fsdp.FullyShard``) or DDP and ZeRO-1
(``ddp.Replicate``).  No torch.

The legacy per-rank replay (``analytic.parallel.rank_step``) has no per-op policy (``replay.replay_unsupported``);
it hands ``op`` here (``op_rank_step``), with its own signature and result, so ``memory``, ``plan`` and the
measurement's size check price ``op`` as they price the other policies.  The course program under these layouts is
the legacy replay's byte for byte for ``none``, ``full`` and ``selective`` (tests/test_ops_data_parallel.py), and
under ``op`` the fake-PG job's (``measure.distributed.measure_rank``).
"""

from __future__ import annotations

import functools

from ...config import AccountingError, ModelConfig
from ...layout import ParallelLayout
from ...phases import StepMemory
from ...setup import TrainingSetup
from ..parallel import ModelStates, model_states

OP_LAYOUTS = (
    "torchtitan's per-op checkpointing (--checkpoint op) is modelled under data parallel alone (DDP, ZeRO-1, "
    "FSDP2 ZeRO-2/3), not under {what}"
)


def op_layout_unmodelled(layout: ParallelLayout) -> str | None:
    """Why ``op_rank_step`` does not model ``layout`` (one line), None where it does."""
    other = [
        name
        for name, on in (
            ("TP", layout.tp > 1), ("PP", layout.pp > 1), ("EP", layout.ep > 1), ("CP", layout.cp > 1),
            ("HSDP", layout.replicate > 1),
        )
        if on
    ]  # fmt: skip
    if layout.dp < 2 and not other:  # one GPU: the single-GPU step (``memory`` without a layout) models op
        other = ["one rank (give --dp 2 or more, or no layout)"]
    return OP_LAYOUTS.format(what=" or ".join(other)) if other else None


def op_rank_step(
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
    """``analytic.parallel.rank_step`` under ``--checkpoint op``: (per-phase bytes, model states, saved activations)
    of data-parallel rank ``rank`` (None: the worst; FSDP2's rank 0, whose chunks are all full, is the one
    replayed).  The saved activations are the ZeRO-3 rank's forward end less its baseline (every unit resharded
    after its forward, the root's all-gather output freed: only what the forward saves is left; ZeRO-2 saves the
    same and keeps its units unsharded besides, DDP and ZeRO-1 add nothing in forward), traced on meta."""
    layout.check(cfg, seq)
    why = op_layout_unmodelled(layout)
    if why:
        raise AccountingError(why)
    st = model_states(cfg, setup, layout, rank=rank)
    if layout.fsdp and st.rank != 0:
        raise AccountingError(f"--checkpoint op under FSDP2 is replayed for rank 0 (the worst), not rank {st.rank}")

    def step(lay: ParallelLayout, mode: str, device: str) -> StepMemory:
        threads = cpu_threads if mode == "plain" and device == "cpu" else 1
        try:
            lines = _rank_lines(cfg, seq, setup, lay, mode, device, min(batch, 2), st.rank, threads)
        except ValueError as e:
            raise AccountingError(f"--checkpoint op under {lay.label}: {e}") from None
        except ArithmeticError:  # the rank's lines in B need every split even for all B (``engine.Affine``)
            raise AccountingError(
                f"--checkpoint op under {lay.label} at micro-batch {batch}: the op library's rank program needs the "
                "routed slots (S·k a sequence) split evenly over the experts; use --batch 1"
            ) from None
        return lines.at(batch)

    saver = ParallelLayout(dp=layout.dp, zero=3) if layout.fsdp else layout
    traced = step(saver, "traced", "meta")
    act = traced.forward.end - traced.baseline
    return step(layout, mode, device), st, act


@functools.lru_cache(maxsize=64)
def _rank_lines(cfg, seq, setup, layout, mode, device, batch, rank, cpu_threads):
    """The op library's rank as lines in the micro-batch B (``predict_step``: ``batch`` 1 gives B = 1, 2 every
    B >= 2), once per layout, not per micro-batch: ``plan`` asks for several micro-batches of one layout."""
    from . import predict_step
    from .ddp import Replicate

    rep = None if layout.fsdp else Replicate(layout, rank=rank)  # ZeRO-1's ranks differ (``ddp`` rule 4)
    threads = {"cpu_threads": cpu_threads} if cpu_threads != 1 else {}
    return predict_step(
        cfg, seq, setup, impl="course", batch=batch, layout=layout, mode=mode, device=device, replicate=rep, **threads
    )
