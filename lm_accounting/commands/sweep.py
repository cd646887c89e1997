"""``sweep``: a context-length sweep of one or more models: tables (CSV, markdown, JSON) and plots
written to ``out``.  ``run`` computes (live work only with ``crosscheck`` or ``measure``); ``write``
replaces ``out`` as a whole."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import AccountingError, ModelConfig, check_positive_int
from ..implementations import check_impl, check_measurable
from ..names import DEFAULT_BUDGET, DEVICES
from ..setup import TrainingSetup
from ..units import parse_size

DEFAULT_CONTEXTS = "128:16384:x2"


@dataclass(frozen=True)
class Request:
    configs: tuple[ModelConfig, ...]
    contexts: str | Sequence[int] = DEFAULT_CONTEXTS  # a list (128,256) or a range (128:16384:x2)
    batch: int = 1
    setup: TrainingSetup = field(default_factory=TrainingSetup)
    budget: str = DEFAULT_BUDGET  # the step peak's budget, with its unit (sets mem:max_context)
    crosscheck: bool = False
    measure: str | None = None  # meta, cpu or cuda: measure every point's training step
    allow_long: bool = False
    out: str = "lm-account-sweep"
    plots: bool = True
    impls: tuple[str, ...] | None = None  # each config's implementation (None: course for all)
    context_list: tuple[int, ...] = field(init=False, repr=False)
    budget_bytes: int = field(init=False, repr=False)

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
        object.__setattr__(self, "budget_bytes", parse_size(self.budget))


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
    from ..units import size_label
    from ..views.sweep import write_sweep

    r = request
    return write_sweep(result, Path(r.out), r.budget_bytes, size_label(r.budget), plots=r.plots)
