"""Everything the ``memory`` command reports for one config: one ``Result``.

Two answers to "how much memory does training take", kept apart on purpose:

* ``course_convention``: the CS336 adamwAccounting bookkeeping (fp32, the handout's list of
  activations, peak = 16·N + activations).  This is what the assignment asks for.
* ``implementation_exact``: what our live model allocates, replayed op by op (equal to the
  storage tracker byte for byte): model states, saved activations, each phase's peak, and
  each phase's peak as exact lines a_i·B + b_i in the batch.  This is what a real run needs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

from ..breakdown import Breakdown
from ..config import ModelConfig
from ..phases import PHASE_LABELS, StepMemory
from ..result import Result
from .activations import saved_activation_breakdown
from .capacity import StepPeakLines, max_context_that_fits, peak_lines_in_batch
from .course import CoursePeak, course_linear_in_batch, course_peak, korthikanti_activation_bytes, max_batch
from .memory import adamw_step_counter_bytes, adamw_step_temporary_bytes, kv_cache_bytes, model_state_breakdown
from .replay import check_device, predict_training_step

COURSE_SOURCE = "CS336 (Stanford, spring 2025) assignment 1, adamwAccounting (a) and (b)"
COURSE_ASSUMPTIONS = (
    "every tensor fp32; peak = 4·N parameters + 4·N gradients + 8·N AdamW m and v "
    "+ the handout's list of activations (logits counted twice)"
)
EXACT_ASSUMPTIONS = (
    "our live model's ops replayed in order (torch 2.13), equal to the storage tracker "
    "byte for byte; steady-state step, the AdamW state already exists"
)


@dataclass(frozen=True)
class MemoryAccount(Result):
    SCHEMA: ClassVar[str] = "lm-accounting/memory/2"

    config: ModelConfig
    seq: int
    batch: int
    dtype: str
    optimizer: str
    budget: int
    device: str  # the device the implementation-exact prediction is for
    # course convention (CS336 adamwAccounting)
    course: CoursePeak
    course_linear: tuple[int, int]  # (a, b): peak = a·B + b under the course convention
    course_max_batch: int
    # implementation-exact (our live model)
    states: Breakdown
    step_temporaries: int
    step_counters: int
    saved: Breakdown
    step: StepMemory
    peak_lines: StepPeakLines
    max_batch: int
    max_context: int
    # for comparison, and inference
    korthikanti: int
    kv_cache: int
    measured: StepMemory | None = None
    measured_on: str | None = None

    def with_measurement(self, step: StepMemory, device: str) -> MemoryAccount:
        """This account with a measured step attached.  The prediction is redone for ``device``
        when it differs (on the CPU, AdamW's step counters sit beside the model), so the two
        compare byte for byte."""
        base = (
            self
            if device == self.device
            else memory_account(self.config, self.seq, self.batch, self.dtype, self.optimizer, self.budget, device)
        )
        return replace(base, measured=step, measured_on=device)

    def to_dict(self) -> dict[str, Any]:
        a, b = self.course_linear
        return {
            "schema": self.SCHEMA,
            "config": self.config.resolved(),
            "context": self.seq,
            "batch": self.batch,
            "dtype": self.dtype,
            "optimizer": self.optimizer,
            "budget_bytes": self.budget,
            "course_convention": {
                "source": COURSE_SOURCE,
                "assumptions": COURSE_ASSUMPTIONS,
                "peak_at_batch": self.course.to_dict(),
                "a_bytes_per_sequence": a,
                "b_bytes": b,
                "max_batch": self.course_max_batch,
            },
            "implementation_exact": {
                "device": self.device,
                "assumptions": EXACT_ASSUMPTIONS,
                "model_states": self.states.to_dict(),
                "adamw_step_temporaries": self.step_temporaries,
                "adamw_step_counters": self.step_counters,
                "activations": self.saved.to_dict(),
                "step": {**self.step.to_dict(), "peak_phase": self.step.peak_phase},
                "peak_lines": self.peak_lines.to_dict(),
                "max_batch": self.max_batch,
                "max_context_at_batch_1": self.max_context,
            },
            "korthikanti_activations": self.korthikanti,
            "inference": {"weights": self.states["parameters"].total, "kv_cache": self.kv_cache},
            "measured": None if self.measured is None else {"device": self.measured_on, **self.measured.to_dict()},
        }

    def records(self) -> list[dict[str, Any]]:
        """Tidy rows, one fact each, the same keys on every row:
        section, key, label, quantity, predicted, measured, unit."""
        rows: list[dict[str, Any]] = []

        def add(section, key, label, quantity, predicted, unit="bytes", measured=None):
            rows.append(
                dict(
                    section=section,
                    key=key,
                    label=label,
                    quantity=quantity,
                    predicted=predicted,
                    measured=measured,
                    unit=unit,
                )
            )

        a, b = self.course_linear
        sec = "course_convention"
        for key, value in self.course.to_dict().items():
            add(sec, key, f"{key} at batch {self.batch} (course convention)", "bytes", value)
        add(sec, "a", "peak = a·B + b: a, bytes per sequence (course convention)", "a", a, "bytes/sequence")
        add(sec, "b", "peak = a·B + b: b = 16·N (course convention)", "b", b)
        add(
            sec,
            "max_batch",
            "largest batch within the budget (course convention)",
            "max_batch",
            self.course_max_batch,
            "sequences",
        )

        sec = "implementation_exact.model_states"
        for it in self.states:
            add(sec, it.key, it.label, "bytes", it.total)
        add(sec, "adamw.step_temporaries", f"AdamW step temporaries ({self.optimizer})", "bytes", self.step_temporaries)
        add(sec, "adamw.step_counters", f"AdamW step counters on {self.device}", "bytes", self.step_counters)
        for it in self.saved:
            add("implementation_exact.activations", it.key, it.label, "bytes", it.total)

        sec, got = "implementation_exact.step", self.measured
        add(sec, "baseline", "live when the step starts", "bytes", self.step.baseline, measured=got and got.baseline)
        for name, p in self.step.phases().items():
            m = got.phase(name) if got else None
            add(sec, name, f"{PHASE_LABELS[name]}: peak", "peak", p.peak, measured=m and m.peak)
            add(sec, name, f"{PHASE_LABELS[name]}: end", "end", p.end, measured=m and m.end)

        sec = "implementation_exact.peak_lines"
        pieces = [(name, i, line) for name, p in self.peak_lines.phases().items() for i, line in enumerate(p.lines, 1)]
        pieces += [("step", i, line) for i, (_, line) in enumerate(self.peak_lines.step_lines(), 1)]
        for name, i, line in pieces:
            key, span = f"{name}.{i}", batch_span(line)
            add(sec, key, f"{name} peak = a·B + b for {span}: a", "a", line.a, "bytes/sequence")
            add(sec, key, f"{name} peak = a·B + b for {span}: b", "b", line.b)
            add(sec, key, f"{name}: first batch of this line", "from_batch", line.first, "sequences")
            add(sec, key, f"{name}: last batch of this line (empty: no end)", "to_batch", line.last, "sequences")

        sec = "implementation_exact.capacity"
        add(
            sec,
            "max_batch",
            f"largest batch that fits (context {self.seq:,})",
            "max_batch",
            self.max_batch,
            "sequences",
        )
        add(sec, "max_context", "largest context that fits at batch 1", "max_context", self.max_context, "tokens")

        add("comparison", "korthikanti.activations", "Korthikanti et al. 2022 activations", "bytes", self.korthikanti)
        add("inference", "weights", f"weights ({self.dtype})", "bytes", self.states["parameters"].total)
        add("inference", "kv_cache", f"KV cache ({self.dtype})", "bytes", self.kv_cache)
        return rows


def batch_span(line) -> str:
    """'B = 1', 'B = 1..2' or 'B ≥ 3'."""
    if line.last is None:
        return f"B ≥ {line.first:,}"
    return f"B = {line.first:,}" if line.last == line.first else f"B = {line.first:,}..{line.last:,}"


def memory_account(
    cfg: ModelConfig,
    seq: int,
    batch: int,
    dtype: str = "fp32",
    optimizer: str = "foreach",
    budget: int = 80 * 10**9,
    device: str = "meta",
) -> MemoryAccount:
    """The memory account of a training step at (seq, batch); the implementation-exact part is
    predicted for ``device`` ("meta" and "cuda" agree; "cpu" adds the AdamW step counters of
    the for-loop and foreach implementations, see ``adamw_step_counter_bytes``)."""
    check_device(device)
    a, b = course_linear_in_batch(cfg, seq)
    lines = peak_lines_in_batch(cfg, seq, dtype, optimizer, device)
    return MemoryAccount(
        config=cfg,
        seq=seq,
        batch=batch,
        dtype=dtype,
        optimizer=optimizer,
        budget=budget,
        device=device,
        course=course_peak(cfg, seq, batch),
        course_linear=(a, b),
        course_max_batch=max_batch(a, b, budget),
        states=model_state_breakdown(cfg, dtype),
        step_temporaries=adamw_step_temporary_bytes(cfg, dtype, optimizer),
        step_counters=adamw_step_counter_bytes(cfg, optimizer, device),
        saved=saved_activation_breakdown(cfg, seq, batch, dtype),
        step=predict_training_step(cfg, seq, batch, dtype, optimizer, device),
        peak_lines=lines,
        max_batch=lines.max_batch(budget),
        max_context=max_context_that_fits(cfg, budget, 1, dtype, optimizer, device),
        korthikanti=korthikanti_activation_bytes(cfg, seq, batch),
        kv_cache=kv_cache_bytes(cfg, seq, batch, dtype),
    )
