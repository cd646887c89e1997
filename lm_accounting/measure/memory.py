"""Measure one steady-state training step of the live model: on meta/cpu with the storage
tracker, on CUDA with the caching allocator's statistics."""

from __future__ import annotations

from ..config import ModelConfig
from ..setup import TrainingSetup


def measure_step(
    cfg: ModelConfig,
    seq: int,
    batch: int = 1,
    dtype: str | None = None,
    device: str = "meta",
    optimizer: str | None = None,
    *,
    setup: TrainingSetup | None = None,
    method: str = "tracker",
):
    """The measured ``StepMemory`` of one steady-state training step of the live model.

    The model is built from ``cfg`` on ``device`` with ``setup`` (or, as before, ``dtype`` and
    ``optimizer``: naive attention, no checkpointing; the default optimizer is for-loop); inputs and
    targets are random token ids; the loss is the model's own cross-entropy; AdamW's state is
    created before the measured step.  ``method``: "tracker" (``StorageTracker``, a dispatch mode:
    the *traced* run, meta or cpu), "allocator" (cpu only: the CPU allocator's own events, no
    dispatch mode: the *plain* run, ``measure.allocator``); cuda always reads the caching
    allocator's counters (a plain run).
    """
    from ..analytic.replay import as_setup
    from .devices import check_live_run

    setup, dtype = as_setup(setup, dtype, optimizer)
    if method not in ("tracker", "allocator"):
        raise ValueError(f"unknown method {method!r} (tracker or allocator)")
    if method == "allocator" and device != "cpu":
        raise ValueError("the allocator measurement reads the CPU allocator: device must be 'cpu'")
    # Refused before torch builds anything: impossible tensors, deep models beyond the host-memory
    # bound, CPU runs over 80 % of MemAvailable, cuda without a GPU, bad names (see check_live_run).
    check_live_run(cfg, seq, batch, device, "this training step", training=True, dtype=dtype, optimizer=setup.optimizer)

    from ..model import cross_entropy
    from .step import build_step
    from .tracker import init_optimizer_state, measure_training_step, measure_training_step_cuda

    model, inputs, targets, opt = build_step(cfg, seq, batch, setup, device)
    if device == "cuda":
        return measure_training_step_cuda(model, inputs, targets, cross_entropy, optimizer=opt)
    if method == "allocator":
        from .allocator import measure_training_step_plain

        init_optimizer_state(opt)
        return measure_training_step_plain(model, inputs, targets, cross_entropy, opt)
    return measure_training_step(model, inputs, targets, cross_entropy, optimizer=opt)
