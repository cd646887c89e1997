"""The memory account of one implementation (``--impl``): which predictor gives the step, in one rule.

* ``course`` on an architecture the legacy replay models (``replay.replay_unsupported`` empty): the
  replay, ``memory_report.memory_account``, as before issue 26;
* ``course`` on any other architecture, and ``transformers``: the op library's program for that
  implementation (``analytic.ops.predict_step``) where it models the config (``ops.unsupported`` empty);
* otherwise the exact model states only, naming what the implementation's program does not model.

The op library's step is a ``StepInBatch`` (sizes a·B + b), so one plain and one traced run give the step
at the batch, the traced − plain gap, and the peak lines in B; the largest context is a search over it.
No torch here.
"""

from __future__ import annotations

from dataclasses import replace

from ..config import ModelConfig
from ..gpus import MemoryBudget, as_budget
from ..setup import TrainingSetup
from .capacity import StepPeakLines, max_context_that_fits, phase_peak_lines
from .course import course_linear_in_batch, course_peak, korthikanti_activation_bytes, max_batch
from .memory_report import MemoryAccount, memory_account, states_only_account
from .replay import replay_unsupported


def program_unsupported(cfg: ModelConfig, setup: TrainingSetup, impl: str) -> list[str]:
    """What ``impl``'s program in the op library does not model for ``cfg`` under ``setup`` (empty: it
    predicts the step; ``analytic.ops.unsupported``)."""
    from . import ops

    if not hasattr(ops, "unsupported"):  # the op library's entry point lands with issue 26's programs
        return ["this config (the op library's programs have not landed)"]
    return ops.unsupported(cfg, setup, impl)


def implementation_account(
    cfg: ModelConfig,
    seq: int,
    batch: int,
    *,
    impl: str,
    setup: TrainingSetup,
    budget: int | MemoryBudget | None = None,
    device: str = "meta",
    cpu_threads: int = 1,
) -> MemoryAccount:
    """The memory account of ``impl``'s training step at (seq, batch) on ``device`` (the rule above)."""
    if impl == "course" and not replay_unsupported(cfg, setup):
        return memory_account(cfg, seq, batch, budget=budget, device=device, setup=setup, cpu_threads=cpu_threads)
    missing = program_unsupported(cfg, setup, impl)
    if missing:
        states = states_only_account(
            cfg, seq, batch, setup.param_dtype, setup, as_budget(budget), device, cpu_threads
        )  # fmt: skip
        return replace(states, impl=impl, unmodelled=tuple(missing))
    return program_account(cfg, seq, batch, impl=impl, setup=setup, budget=budget, device=device)


def program_account(
    cfg: ModelConfig,
    seq: int,
    batch: int,
    *,
    impl: str,
    setup: TrainingSetup,
    budget: int | MemoryBudget | None = None,
    device: str = "meta",
) -> MemoryAccount:
    """The account of a step the op library predicts: the states-only account's exact model states, plus the
    plain and traced steps, the peak lines in B (plain), the largest batch and context, and, for the course
    architecture, the course convention beside it.  No per-component activation table (``saved``): the
    programs give phase peaks, not the replay's component breakdown."""
    from .ops import predict_step

    basis = as_budget(budget)
    base = states_only_account(cfg, seq, batch, setup.param_dtype, setup, basis, device, 1)
    plain = predict_step(cfg, seq, setup, impl=impl, batch=batch, mode="plain", device=device)
    traced = predict_step(cfg, seq, setup, impl=impl, batch=batch, mode="traced", device=device)
    step, step_traced = plain.at(batch), traced.at(batch)
    lines = StepPeakLines(*(phase_peak_lines(name, p.peak) for name, p in plain.phases().items()))

    def at_context(run: ModelConfig, s: int):
        return predict_step(run, s, setup, impl=impl, batch=1, mode="plain", device=device).at(1)

    course = cfg.course_architecture
    a, b = course_linear_in_batch(cfg, seq) if course else (None, None)
    return replace(
        base,
        course=course_peak(cfg, seq, batch) if course else None,
        course_linear=(a, b) if course else None,
        course_max_batch=max_batch(a, b, basis.usable) if course else None,
        korthikanti=korthikanti_activation_bytes(cfg, seq, batch) if course else None,
        step=step,
        step_traced=step_traced,
        gap={name: step_traced.phase(name).peak - p.peak for name, p in step.phases().items()},
        peak_lines=lines,
        max_batch=lines.max_batch(basis.usable),
        max_context=max_context_that_fits(cfg, basis.usable, 1, predict=at_context),
        impl=impl,
        predicted_by="ops",
    )
