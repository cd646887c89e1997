"""One training step of the live model under a ``TrainingSetup``, and its FLOPs under FlopCounterMode.

A step is: forward (the setup's attention, checkpointing and autocast live inside the model),
the model's cross-entropy on the (fp32 under amp-bf16) logits, ``loss.backward()``, the AdamW
step of the setup's implementation, and ``zero_grad()`` (grads set to None).
"""

from __future__ import annotations

import torch

from ..config import ModelConfig
from ..names import ADAMW_KWARGS
from ..setup import TrainingSetup


def build_step(cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup, device: str = "meta", seed: int = 0):
    """(model, inputs, targets, optimizer) for ``setup`` on ``device``, with seeded weights off meta."""
    from ..model import build_model, random_tokens

    torch.manual_seed(seed)
    model = build_model(cfg, device=device, setup=setup)
    inputs = random_tokens(cfg, batch, seq, device=device, seed=seed)
    targets = random_tokens(cfg, batch, seq, device=device, seed=seed + 1)
    optimizer = torch.optim.AdamW(model.parameters(), **ADAMW_KWARGS[setup.optimizer])
    return model, inputs, targets, optimizer


def training_step(
    model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor, optimizer: torch.optim.Optimizer | None = None
) -> torch.Tensor:
    """Forward, cross-entropy, backward and (if given) the optimizer step; returns the loss."""
    from ..model import cross_entropy

    loss = cross_entropy(model(inputs), targets)
    loss.backward()
    if optimizer is not None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def step_flops(
    cfg: ModelConfig, seq: int, batch: int = 1, setup: TrainingSetup | None = None, device: str = "meta"
) -> int:
    """FlopCounterMode's total over one whole training step (with the fused-attention formulas).

    AdamW's elementwise ops have no formula there, so this is forward + backward (+ recompute)."""
    from torch.utils.flop_counter import FlopCounterMode

    from .attention_flops import install

    install()
    setup = setup or TrainingSetup()
    model, inputs, targets, optimizer = build_step(cfg, seq, batch, setup, device)
    with FlopCounterMode(display=False) as counter:
        training_step(model, inputs, targets, optimizer)
    return int(counter.get_total_flops())
