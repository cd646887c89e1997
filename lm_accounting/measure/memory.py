"""Measure one steady-state training step of the live model: on meta/cpu with the storage
tracker, on CUDA with the caching allocator's statistics."""

from __future__ import annotations

from ..config import ModelConfig
from ..names import ADAMW_KWARGS, TORCH_DTYPES


def measure_step(cfg: ModelConfig, seq: int, batch: int = 1, dtype: str = "fp32", device: str = "meta",
                 optimizer: str = "for-loop") -> dict:
    """The measured ``StepMemory`` of one steady-state training step of the live model.

    The model is built from ``cfg`` on ``device``; inputs and targets are random token ids;
    the loss is the model's own cross-entropy; one warm-up step creates the AdamW state.
    """
    from .devices import check_live_run

    # Refused before torch builds anything: impossible tensors, deep models beyond the host-memory
    # bound, CPU runs over 80 % of MemAvailable, cuda without a GPU, bad names (see check_live_run).
    check_live_run(cfg, seq, batch, device, "this training step", training=True, dtype=dtype, optimizer=optimizer)

    import torch

    from ..model import build_model, cross_entropy, random_tokens
    from .tracker import measure_training_step, measure_training_step_cuda

    torch.manual_seed(0)
    model = build_model(cfg, device=device, dtype=getattr(torch, TORCH_DTYPES[dtype]))
    inputs = random_tokens(cfg, batch, seq, device=device, seed=0)
    targets = random_tokens(cfg, batch, seq, device=device, seed=1)
    kwargs = {"optimizer_kwargs": ADAMW_KWARGS[optimizer]}
    if device == "cuda":
        return measure_training_step_cuda(model, inputs, targets, cross_entropy, **kwargs)
    return measure_training_step(model, inputs, targets, cross_entropy, **kwargs)
