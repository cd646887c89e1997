"""DDP (``zero=0``): ``DistributedDataParallel`` over ``dp`` ranks; every rank holds every parameter, gradient
and AdamW state, and the gradients are all-reduced in buckets (``analytic.collectives`` rule 2)."""

from __future__ import annotations

from ..config import AccountingError

ZERO_STAGES = (0, 1, 2, 3)


class DataParallel:
    """DDP, ZeRO-1 and FSDP2 select one ``zero`` stage each over the same dp ranks: ``stages``."""

    fields = ("dp", "zero", "tp")

    def __init__(self, name: str, stages: tuple[int, ...]):
        self.name, self.stages = name, stages

    def runs(self, layout) -> bool:
        return layout.zero in self.stages

    def validate(self, layout) -> None:
        if layout.zero not in ZERO_STAGES:
            raise AccountingError(f"zero stage must be 0, 1, 2 or 3, got {layout.zero!r}")

    def check(self, layout, cfg, seq) -> None:
        return None

    def label(self, layout) -> str:
        return f"·zero{layout.zero}" if self.runs(layout) else ""

    def groups(self, layout) -> dict[str, tuple[int, int]]:
        """The dp group: dp ranks, tp apart (the mesh is (pp, dp, tp))."""
        return {"dp": (layout.dp, layout.tp)} if self.runs(layout) else {}


DDP = DataParallel("DDP", (0,))
