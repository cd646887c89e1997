"""Pipeline parallel (``pp`` stages, ``micro_batches`` m per step): 1F1B, or interleaved 1F1B with
``virtual_stages`` v (torch 2.13's ``ScheduleInterleaved1F1B``; Narayanan et al. 2021, §2.2.2): the model split
into pp·v stages (``analytic.parallel.stage_layers``), pipeline rank r holding chunks r, r + pp, ... The mesh is
(pp, dp, tp), stages outermost (``analytic.pipeline``; ``analytic.collectives`` rules 8-11)."""

from __future__ import annotations

from ..config import MAX_WORLD, AccountingError


class PipelineParallel:
    name = "PP"
    fields = ("pp", "micro_batches", "virtual_stages", "dp", "tp")

    def validate(self, layout) -> None:
        if layout.pp > 1 and layout.micro_batches < layout.pp:
            raise AccountingError(
                f"1F1B with pp={layout.pp} needs at least {layout.pp} micro-batches, got {layout.micro_batches}"
            )
        if layout.virtual_stages > 1:
            self._check_interleaved(layout)

    @staticmethod
    def _check_interleaved(layout) -> None:
        """torch 2.13's ``ScheduleInterleaved1F1B.__init__``: rounds = max(1, m // pp) must divide m."""
        v, m, pp = layout.virtual_stages, layout.micro_batches, layout.pp
        if pp == 1:
            raise AccountingError(f"virtual stages (v={v}) need pipeline parallel (pp > 1)")
        if v * pp > MAX_WORLD:
            raise AccountingError(f"pp·v = {pp:,}·{v:,} stages is beyond the supported {MAX_WORLD:,}")
        rounds = max(1, m // pp)
        if m % rounds:
            raise AccountingError(
                f"interleaved 1F1B runs m // pp = {rounds} rounds of micro-batches: {m} micro-batches are not a "
                f"whole number of them (torch's ScheduleInterleaved1F1B refuses it); use a multiple of {pp}"
            )

    def check(self, layout, cfg, seq) -> None:
        if layout.pp > cfg.num_layers:
            raise AccountingError(f"pp={layout.pp} exceeds the {cfg.num_layers} layers")
        if layout.stages > cfg.num_layers:
            raise AccountingError(
                f"pp·v = {layout.pp}·{layout.virtual_stages} = {layout.stages} stages exceed the {cfg.num_layers} layers"
            )

    def label(self, layout) -> str:
        if layout.pp == 1:
            return ""
        v = f"v{layout.virtual_stages}" if layout.virtual_stages > 1 else ""
        return f"·pp{layout.pp}x{layout.micro_batches}{v}"

    def groups(self, layout) -> dict[str, tuple[int, int]]:
        """Neighbouring stages' ranks: dp·tp apart."""
        return {"pp": (2, layout.dp * layout.tp)} if layout.pp > 1 else {}


PP = PipelineParallel()
