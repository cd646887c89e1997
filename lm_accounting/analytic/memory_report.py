"""Everything the ``memory`` command reports for one config, as one plain object."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..breakdown import Breakdown
from ..config import ModelConfig
from .activations import saved_activation_breakdown
from .capacity import LinearPeak, max_batch_that_fits, max_context_that_fits, peak_linear_in_batch
from .course import CoursePeak, course_linear_in_batch, course_peak, korthikanti_activation_bytes, max_batch
from .memory import adamw_step_temporary_bytes, kv_cache_bytes, model_state_breakdown
from ..phases import StepMemory
from .replay import predict_training_step


@dataclass(frozen=True)
class MemoryAccount:
    config: ModelConfig
    seq: int
    batch: int
    dtype: str
    optimizer: str
    budget: int
    states: Breakdown
    step_temporaries: int
    saved: Breakdown
    step: StepMemory
    linear: LinearPeak
    max_batch: int
    max_context: int
    course: CoursePeak
    course_linear: tuple[int, int]
    course_max_batch: int
    korthikanti: int
    kv_cache: int

    def to_frame(self):
        """One row per phase of the training step: predicted peak and end bytes (pandas imported here)."""
        import pandas as pd

        rows = [{"phase": name, "peak": p.peak, "end": p.end} for name, p in self.step.phases().items()]
        return pd.DataFrame([{"phase": "baseline", "peak": self.step.baseline, "end": self.step.baseline}, *rows])

    def to_dict(self) -> dict[str, Any]:
        phases = {name: {"peak": p.peak, "end": p.end} for name, p in self.step.phases().items()}
        return {
            "schema": "lm-accounting/memory/1",
            "config": self.config.resolved(),
            "context": self.seq,
            "batch": self.batch,
            "dtype": self.dtype,
            "optimizer": self.optimizer,
            "budget_bytes": self.budget,
            "model_states": self.states.to_dict(),
            "adamw_step_temporaries": self.step_temporaries,
            "activations_exact": self.saved.to_dict(),
            "step": {"baseline": self.step.baseline, "peak": self.step.peak, **phases},
            "peak_linear_in_batch": {"a": self.linear.a, "b": self.linear.b, "exact_to_batch": self.linear.exact_to},
            "max_batch": self.max_batch,
            "max_context_at_batch_1": self.max_context,
            "course_convention": {**self.course.to_dict(), "a": self.course_linear[0], "b": self.course_linear[1],
                                  "max_batch": self.course_max_batch},
            "korthikanti_activations": self.korthikanti,
            "inference": {"weights": self.states["parameters"].total, "kv_cache": self.kv_cache},
        }


def memory_account(cfg: ModelConfig, seq: int, batch: int, dtype: str = "fp32", optimizer: str = "foreach",
                   budget: int = 80 * 10**9) -> MemoryAccount:
    a, b = course_linear_in_batch(cfg, seq)
    return MemoryAccount(
        config=cfg, seq=seq, batch=batch, dtype=dtype, optimizer=optimizer, budget=budget,
        states=model_state_breakdown(cfg, dtype),
        step_temporaries=adamw_step_temporary_bytes(cfg, dtype, optimizer),
        saved=saved_activation_breakdown(cfg, seq, batch, dtype),
        step=predict_training_step(cfg, seq, batch, dtype, optimizer),
        linear=peak_linear_in_batch(cfg, seq, dtype, optimizer),
        max_batch=max_batch_that_fits(cfg, seq, budget, dtype, optimizer),
        max_context=max_context_that_fits(cfg, budget, 1, dtype, optimizer),
        course=course_peak(cfg, seq, batch),
        course_linear=(a, b),
        course_max_batch=max_batch(a, b, budget),
        korthikanti=korthikanti_activation_bytes(cfg, seq, batch),
        kv_cache=kv_cache_bytes(cfg, seq, batch, dtype),
    )
