"""Sequence parallel (``sequence_parallel``, beside TP): norms and the residual stream split along the sequence
between the blocks, the TP all-reduces become all-gathers and reduce-scatters (``analytic.collectives`` rule 4)."""

from __future__ import annotations

from ..config import AccountingError


class SequenceParallel:
    name = "SP"
    fields = ("sequence_parallel", "tp")

    def validate(self, layout) -> None:
        if layout.sequence_parallel and layout.tp == 1:
            raise AccountingError("sequence parallel needs tp > 1")

    def check(self, layout, cfg, seq) -> None:
        m = layout.tp
        if layout.sequence_parallel and seq is not None and seq % m:
            # the job's ``Shard(1)`` of (B, S, d): the positions split evenly (Megatron splits S too)
            raise AccountingError(f"sequence parallel splits the {seq:,} positions over tp={m}: use a multiple of {m}")

    def label(self, layout) -> str:
        return "+sp" if layout.sequence_parallel else ""

    def groups(self, layout) -> dict[str, tuple[int, int]]:
        return {}  # TP's group


SP = SequenceParallel()
