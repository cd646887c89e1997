"""``sweep``: a context-length sweep of one or more models: tables (CSV, markdown, JSON) and plots
written to ``out``.  ``run`` computes (live work only with ``crosscheck`` or ``measure``); ``write``
replaces ``out`` as a whole."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import AccountingError, ModelConfig, check_positive_int
from ..gpus import DEFAULT_GPU, MemoryBudget, memory_budget
from ..implementations import check_impl, check_measurable
from ..names import DEVICES
from ..setup import TrainingSetup
from ..units import parse_size

DEFAULT_CONTEXTS = "128:16384:x2"


@dataclass(frozen=True)
class Request:
    configs: tuple[ModelConfig, ...]
    contexts: str | Sequence[int] = DEFAULT_CONTEXTS  # a list (128,256) or a range (128:16384:x2)
    batch: int = 1
    setup: TrainingSetup = field(default_factory=TrainingSetup)
    budget: str | int | None = None  # usable bytes per GPU (text with a unit, or bytes), as given; None: the GPU's
    gpu: str = DEFAULT_GPU  # without --budget, the budget is this GPU's CUDA total less the allowance, as in memory
    allowance: int | None = None  # default gpus.DEFAULT_ALLOWANCE
    crosscheck: bool = False
    measure: str | None = None  # meta, cpu or cuda: measure every point's training step
    allow_long: bool = False
    out: str = "lm-account-sweep"
    plots: bool = True
    impls: tuple[str, ...] | None = None  # each config's implementation (None: course for all)
    context_list: tuple[int, ...] = field(init=False, repr=False)
    budget_basis: MemoryBudget = field(init=False, repr=False)

    def __post_init__(self) -> None:
        from ..sweep import parse_contexts
        from ..views.sweep import check_sweep_out

        check_sweep_out(self.out)  # a bad --out fails before any computation
        if not self.configs:
            raise AccountingError("sweep needs at least one model")
        check_positive_int("batch", self.batch)
        impls = self.impls or ("course",) * len(self.configs)
        if len(impls) != len(self.configs):
            raise AccountingError(f"sweep got {len(impls)} implementations for {len(self.configs)} models")
        for cfg, impl in zip(self.configs, impls, strict=True):  # refused before any point is computed
            check_impl(cfg, impl)
            check_measurable(impl, self.measure or "none")
        if self.measure is not None and self.measure not in DEVICES:
            raise AccountingError(f"unknown --measure-memory '{self.measure}' (valid: {', '.join(DEVICES)})")
        given = self.contexts
        contexts = parse_contexts(given) if isinstance(given, str) else [int(c) for c in given]
        object.__setattr__(self, "context_list", tuple(contexts))
        given = parse_size(self.budget) if isinstance(self.budget, str) else self.budget
        object.__setattr__(self, "budget_basis", memory_budget(self.gpu, self.allowance, given))

    @property
    def budget_bytes(self) -> int:
        return self.budget_basis.usable

    @property
    def budget_label(self) -> str:
        """The budget line's label in the plots: as given, or the GPU's."""
        from ..units import size_label

        basis = self.budget_basis
        if basis.given:
            return size_label(self.budget) if isinstance(self.budget, str) else f"{basis.usable / 1e9:g} GB"
        return f"{basis.usable / 1e9:.3f} GB ({basis.gpu.name})"


def run(request: Request, progress: bool = False) -> Any:
    """The ``Sweep`` (its ``mismatches`` name any live count that differs)."""
    from ..sweep import sweep

    r = request
    return sweep(
        list(r.configs), list(r.context_list), r.batch, setup=r.setup, budget=r.budget_bytes, crosscheck=r.crosscheck,
        measure=r.measure, progress=progress, allow_long=r.allow_long, impls=r.impls,
    )  # fmt: skip


def write(request: Request, result: Any) -> list[Path]:
    """sweep.csv, sweep.json, sweep.md and (``plots``) the figures into ``out``, replaced as a whole."""
    from ..views.sweep import write_sweep

    r = request
    return write_sweep(result, Path(r.out), r.budget_bytes, r.budget_label, plots=r.plots)
