"""The memory account of one implementation (``--impl``): which predictor gives the step, in one rule.

* ``course`` on an architecture the legacy replay models (``replay.replay_unsupported`` empty): the
  replay, ``memory_report.memory_account``, as before issue 26;
* ``course`` on any other architecture, and ``transformers``: the op library's program for that
  implementation (``analytic.ops.predict_step``) where it models the config (``ops.unsupported`` empty);
* otherwise (a setup the live model refuses, a config.json the programs lack) the exact model states only,
  naming what the implementation's program does not model.

The op library's step is a ``StepInBatch`` (sizes a·B + b), so one plain and one traced run give the step
at the batch, the traced − plain gap, and the peak lines in B; the largest context is a search over it.
No torch here.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

from ..config import AccountingError, ModelConfig
from ..gpus import MemoryBudget, as_budget
from ..phases import StepMemory
from ..setup import TrainingSetup
from .capacity import StepPeakLines, lines_with_one, max_context_that_fits
from .course import course_linear_in_batch, course_peak, korthikanti_activation_bytes, max_batch
from .memory import adamw_step_counter_bytes, adamw_step_temporary_bytes, model_state_breakdown
from .memory_report import MemoryAccount, legacy_misses, memory_account, states_only_account
from .ops.engine import StepInBatch
from .replay import predict_training_step, replay_unsupported


def program_unsupported(cfg: ModelConfig, setup: TrainingSetup, impl: str) -> list[str]:
    """What ``impl``'s program in the op library does not model for ``cfg`` under ``setup`` (empty: it
    predicts the step; ``analytic.ops.unsupported``)."""
    from . import ops

    return ops.unsupported(cfg, setup, impl)


def replayed(cfg: ModelConfig, setup: TrainingSetup, impl: str, device: str | None = None) -> bool:
    """Whether the legacy replay gives ``impl``'s step: our own model, on an architecture it models, except where
    its CUDA step is known to differ from the H200's (``memory_report.legacy_misses``: the op library's course
    program, which equals every H200 figure, predicts it)."""
    return impl == "course" and not replay_unsupported(cfg, setup) and not legacy_misses(cfg, setup, device)


def step_unmodelled(cfg: ModelConfig, setup: TrainingSetup, impl: str) -> list[str]:
    """What neither predictor of ``impl`` models for ``cfg`` (empty: the step is predicted): what the
    implementation's program lacks (the legacy replay models less than the course program)."""
    return [] if replayed(cfg, setup, impl) else program_unsupported(cfg, setup, impl)


def predicted_steps(
    cfg: ModelConfig, seq: int, batch: int, *, impl: str, setup: TrainingSetup, device: str
) -> tuple[StepMemory, StepMemory] | None:
    """The plain step on ``device`` and the traced step on meta (what the storage tracker sees) at ``batch``,
    from ``impl``'s predictor (the rule above); None where neither models ``cfg``."""
    if replayed(cfg, setup, impl, device):
        plain = predict_training_step(cfg, seq, batch, setup=setup, device=device, mode="plain")
        return plain, predict_training_step(cfg, seq, batch, setup=setup, mode="traced")
    if program_unsupported(cfg, setup, impl):
        return None
    from .ops import predict_step

    plain = predict_step(cfg, seq, setup, impl=impl, batch=batch, mode="plain", device=device)
    traced = predict_step(cfg, seq, setup, impl=impl, batch=batch, mode="traced", device=tracker_device(device))
    return plain.at(batch), traced.at(batch)


def largest_context(
    cfg: ModelConfig, budget: int, batch: int, *, impl: str, setup: TrainingSetup, device: str
) -> int | None:
    """The largest context whose plain step at ``batch`` on ``device`` fits ``budget`` (0 if none), from
    ``impl``'s predictor; None where neither models ``cfg``."""
    if replayed(cfg, setup, impl, device):
        return max_context_that_fits(cfg, budget, batch, setup=setup, device=device, mode="plain")
    if program_unsupported(cfg, setup, impl):
        return None
    from .ops import predict_step

    def at_context(run: ModelConfig, s: int) -> StepMemory:
        return predict_step(run, s, setup, impl=impl, batch=batch, mode="plain", device=device).at(batch)

    return max_context_that_fits(cfg, budget, batch, predict=at_context)


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
    if replayed(cfg, setup, impl, device):
        return memory_account(cfg, seq, batch, budget=budget, device=device, setup=setup, cpu_threads=cpu_threads)
    missing = step_unmodelled(cfg, setup, impl)
    if not missing and impl == "transformers" and device == "cuda":  # a kernel the GPU target does not model
        from .ops.cuda import transformers_unsupported

        missing = transformers_unsupported(cfg, setup, seq)
    if missing:
        states = implementation_states(cfg, seq, batch, impl, setup, as_budget(budget), device, cpu_threads)
        return replace(states, impl=impl, unmodelled=tuple(missing))
    return program_account(cfg, seq, batch, impl=impl, setup=setup, budget=budget, device=device)


def implementation_states(cfg, seq, batch, impl, setup, basis, device, cpu_threads) -> MemoryAccount:
    """The states-only account with AdamW's step counters and for-loop temporaries over ``impl``'s own parameter
    tensors (transformers' GPT-2: 148 tensors, fused c_attn; ours 196; ``analytic.hf_tensors``)."""
    states = states_only_account(cfg, seq, batch, setup.param_dtype, setup, basis, device, cpu_threads)
    from .ops.transformers import fp32_kept_parameters

    kept = fp32_kept_parameters(cfg) if impl == "transformers" else 0  # DeepSeek's fp32 routers
    temporaries = adamw_step_temporary_bytes(
        cfg, setup.param_dtype, setup.optimizer, implementation=impl, fp32_kept=kept
    )
    return replace(
        states,
        states=model_state_breakdown(cfg, setup.param_dtype, kept) if kept else states.states,
        step_temporaries=temporaries,
        step_counters=adamw_step_counter_bytes(cfg, setup.optimizer, device, implementation=impl),
    )


def predicted(impl: str, run):
    """``run()`` (an op-library prediction) with its ``ValueError`` (a setup the program refuses for the
    device, e.g. fused attention CUDA has no kernel for) as the one-line ``AccountingError``."""
    try:
        return run()
    except ValueError as err:
        raise AccountingError(f"--impl {impl}: {err}") from None


def checked_max_batch(n: int, budget: int, plain) -> int:
    """The largest batch ``n`` the lines give, confirmed on the step replayed at n and n + 1 themselves
    (``plain(b).at(b)``, exact at b) and moved one batch at a time until they agree: a cuda step's kernel
    scratch (row sums, the id sort) is no line in B, so its lines can be off by a few bytes."""

    def fits(b: int) -> bool:
        return plain(b).at(b).peak <= budget

    while n > 0 and not fits(n):
        n -= 1
    while fits(n + 1):
        n += 1
    return n


def tracker_device(device: str) -> str:
    """Where the traced run a program predicts is measured: the storage tracker's meta run for a cuda
    target (the op library models no traced cuda run, ``ops.RUNS``), else ``device`` itself."""
    return "meta" if device == "cuda" else device


def batch_lines(lines: StepInBatch, one: StepMemory) -> StepPeakLines | None:
    """The step's peak lines in B from a replay exact for every B >= 2 (``lines``) and the exact step at B = 1
    (``one``); None where the replay is flat in B (a mixture of experts whose split is no line in B is
    replayed at one batch: every size a constant)."""
    phases = lines.phases()
    if all(a == 0 for p in phases.values() for a, _ in p.peak.lines):
        return None
    return StepPeakLines(*(lines_with_one(name, p.peak, one.phase(name).peak) for name, p in phases.items()))


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
    base = implementation_states(cfg, seq, batch, impl, setup, basis, device, 1)

    @cache  # the step at the asked batch, at 1 and 2 for the lines, at n and n + 1 to check the largest batch
    def plain(b: int):
        return predicted(impl, lambda: predict_step(cfg, seq, setup, impl=impl, batch=b, mode="plain", device=device))

    step = plain(batch).at(batch)
    traced = predict_step(cfg, seq, setup, impl=impl, batch=batch, mode="traced", device=tracker_device(device))
    step_traced = traced.at(batch)
    lines = batch_lines(plain(2), plain(1).at(1))
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
        max_batch=None if lines is None else checked_max_batch(lines.max_batch(basis.usable), basis.usable, plain),
        max_context=largest_context(cfg, basis.usable, 1, impl=impl, setup=setup, device=device),
        impl=impl,
        predicted_by="ops",
    )
