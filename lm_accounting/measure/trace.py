"""Every allocation and free of one measured training step, with its aten op and phase.

``trace_step`` runs the step exactly as ``tracker.measure_training_step`` measures it (the same warm-up,
the same phases, the same ``StorageTracker``) and records what the tracker charges and releases, in
order: the raw material for writing an op sequence of the analytic replay (``analytic/ops``) byte for
byte.  ``format_trace`` prints it, one line an event::

    forward         mm                           +131,072      1,234,560
    forward         mm                            -65,536      1,169,024

(phase, op, bytes charged (+) or released (−), live bytes on that device after it).  A charge names the op
whose output it is; a release names the last op dispatched before the storage died (autograd releasing a
saved tensor after the backward node that used it, a Python reference dropped after an op).  The bytes
live when the step starts (parameters, optimizer state, inputs and targets) are the "setup" events.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..phases import StepMemory


@dataclass(frozen=True)
class Event:
    """One charge (``delta`` > 0) or release (< 0) of a storage, and the live bytes after it."""

    phase: str
    op: str
    delta: int
    live: int
    device: str


def trace_step(model, inputs, targets, loss_fn, optimizer) -> tuple[StepMemory, list[Event]]:
    """(the ``StepMemory`` of ``measure_training_step``, every event of the step in order).

    ``model(inputs)`` then ``loss_fn(output, targets)`` is the forward; the rest as in
    ``measure_training_step``.  Use it on meta for a model of any size, e.g. transformers' model through
    ``measure.hf.trace_hf_step``::

        from lm_accounting.measure.hf import trace_hf_step
        memory, events = trace_hf_step(cfg, seq=64, batch=1, setup=TrainingSetup(attention="sdpa"))
        print(format_trace(events))
    """
    from .tracker import measure_training_step

    events: list[Event] = []
    live: dict[str, int] = {}

    def listen(phase: str, op: str, delta: int, device) -> None:
        dev = str(device)
        live[dev] = live.get(dev, 0) + delta
        events.append(Event(phase, op or "(tracked before the step)", delta, live[dev], dev))

    memory = measure_training_step(model, inputs, targets, loss_fn, optimizer=optimizer, listener=listen)
    return memory, events


def format_trace(events: list[Event], device: str | None = None) -> str:
    """One line an event (``device``: only that device's, e.g. "meta"; AdamW's step counters live on cpu)."""
    return "\n".join(
        f"{e.phase:<15} {e.op:<45} {e.delta:>+15,} {e.live:>16,}  {e.device}"
        for e in events
        if device is None or e.device == device
    )
