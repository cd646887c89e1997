"""The op library (issue 26): the memory of one training step of a program, replayed without torch.

Layers (each its own module):

* ``engine``: the evaluation engine (``Affine`` a·B + b, ``PeakEnvelope``, ``Replay``, ``PhaseInBatch``,
  ``StepInBatch``, ``repeat``, ``apply_segment``);
* ``tensors``: symbolic tensors whose storages charge the active ``Run``, and torch's autograd engine
  (``record``, ``backward``, ``checkpoint``, ``no_grad``);
* ``aten``: aten-level primitives, each with its forward allocations, saved tensors and backward;
* ``step``: one training step of a program (``training_step``: forward, backward, AdamW, zero_grad);
* programs written like the code they follow: ``transformers`` (transformers 5.24's modeling code),
  ``course`` (our own model).

Entry points: ``predict_step`` (the step as a function of the micro-batch B) and ``unsupported``.  No torch.
"""

from __future__ import annotations

from ...config import ModelConfig
from ...setup import TrainingSetup
from .engine import StepInBatch

IMPLS = ("course", "transformers")
TARGETS = ("meta", "cpu")  # the storage tracker's traced run on meta, and on cpu tensors (AdamW's counters there)


def _programs(impl: str):
    if impl == "transformers":
        from . import transformers

        return transformers
    if impl == "course":
        from . import course  # helper H5's programs

        return course
    raise ValueError(f"unknown implementation {impl!r} (valid: {', '.join(IMPLS)})")


def unsupported(cfg: ModelConfig, setup: TrainingSetup, impl: str) -> list[str]:
    """Why ``predict_step`` cannot give ``cfg`` under ``setup`` with implementation ``impl`` (one reason a
    line); empty: it can."""
    if impl not in IMPLS:
        return [f"unknown implementation {impl!r} (valid: {', '.join(IMPLS)})"]
    try:
        programs = _programs(impl)
    except ImportError:
        return [f"--impl {impl} has no programs yet"]
    return programs.unsupported(cfg, setup)


def predict_step(
    cfg: ModelConfig,
    seq: int,
    setup: TrainingSetup,
    *,
    impl: str,
    batch: int = 1,
    mode: str = "traced",
    device: str = "meta",
) -> StepInBatch:
    """One training step of implementation ``impl``'s model of ``cfg`` at context ``seq`` under ``setup``,
    as an exact function of the micro-batch B (``.at(B)`` is the ``StepMemory`` the tracker measures).

    ``mode`` "traced" is the storage tracker's run (every meta run); ``device`` "meta" the target.  ``batch``
    is a hint for programs whose op sequence depends on B (none so far).  Raises ``ValueError`` with the
    reasons of ``unsupported`` when it cannot."""
    reasons = unsupported(cfg, setup, impl)
    if mode != "traced" or device not in TARGETS:
        reasons.append(f"only the traced run on {', '.join(TARGETS)} is modelled (not {mode} on {device})")
    if reasons:
        raise ValueError("; ".join(reasons))
    return _programs(impl).predict_step(cfg, seq, setup, batch=batch, mode=mode, device=device)
