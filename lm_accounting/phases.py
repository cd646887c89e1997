"""Bytes at the peak and at the end of each phase of a training step: one type for predicted and measured.

``PhaseBytes`` is what a phase costs; ``StepMemory`` is a whole steady-state step (the bytes live
when it starts, then forward, backward and the optimizer step).  The analytic replay returns one,
and so do the storage tracker (meta, CPU) and the CUDA allocator measurement, so a prediction and
a measurement compare field by field.  No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

PHASES = ("forward", "backward", "optimizer_step")
"""The phases of one training step, in order: model + loss, ``loss.backward()``, ``opt.step()`` + ``zero_grad``."""

PHASE_LABELS = {
    "forward": "forward (model + cross-entropy)",
    "backward": "backward",
    "optimizer_step": "AdamW step + zero_grad",
}


class PhaseBytes(NamedTuple):
    """Live bytes: the highest point inside a phase, and what is still live when it ends."""

    peak: int
    end: int


@dataclass(frozen=True)
class StepMemory:
    """Device bytes of one steady-state training step (the optimizer state already exists)."""

    baseline: int  # live when the step starts: parameters, optimizer state, buffers, inputs
    forward: PhaseBytes
    backward: PhaseBytes
    optimizer_step: PhaseBytes
    # measured on CUDA only: device bytes held beside the program's tensors, each labelled (the cuBLAS
    # workspaces; the caching allocator's rounding and unsplit blocks at the step's peak)
    overheads: tuple[tuple[str, int], ...] = ()

    def phases(self) -> dict[str, PhaseBytes]:
        return {name: getattr(self, name) for name in PHASES}

    def phase(self, name: str) -> PhaseBytes:
        if name not in PHASES:
            raise KeyError(f"unknown phase {name!r} (phases: {', '.join(PHASES)})")
        return getattr(self, name)

    @property
    def peak(self) -> int:
        """The step's peak: the highest phase peak."""
        return max(p.peak for p in self.phases().values())

    @property
    def peak_phase(self) -> str:
        """The phase that sets the step's peak (the first one, on a tie)."""
        return max(PHASES, key=lambda name: (self.phase(name).peak, -PHASES.index(name)))

    def to_dict(self) -> dict[str, Any]:
        d = {
            "baseline": self.baseline,
            "peak": self.peak,
            **{name: {"peak": p.peak, "end": p.end} for name, p in self.phases().items()},
        }
        if self.overheads:
            d["overheads"] = dict(self.overheads)
        return d
