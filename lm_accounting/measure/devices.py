"""Refuse a live run that cannot fit, before it dies with an out-of-memory error."""

from __future__ import annotations

from ..config import AccountingError, ModelConfig
from ..units import fmt_bytes


def available_bytes(device: str) -> int | None:
    """Free memory on ``device``: CUDA from the driver, CPU from /proc/meminfo; None for meta."""
    if device == "meta":
        return None
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise AccountingError("cuda: no CUDA GPU is available on this machine (use meta)")
        free, _total = torch.cuda.mem_get_info()
        return int(free)
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def counting_run_bytes(cfg: ModelConfig, seq: int, batch: int, backward: bool) -> int:
    """Upper bound for a FLOP-counting run (forward, or forward + backward, no optimizer):
    the exact training-step peak of ``predict_training_step`` minus the AdamW moments."""
    from ..analytic.memory import model_state_breakdown
    from ..analytic.replay import predict_training_step

    step = predict_training_step(cfg, seq, batch)
    peak = max(step.forward.peak, step.backward.peak) if backward else step.forward.peak
    states = model_state_breakdown(cfg)
    return peak - states["adamw.exp_avg"].total - states["adamw.exp_avg_sq"].total


def check_device_fits(device: str, need: int, what: str) -> None:
    """Raise a one-line error when ``need`` bytes exceed what ``device`` has free."""
    free = available_bytes(device)
    if free is not None and need > free:
        raise AccountingError(
            f"{what} on {device} needs {fmt_bytes(need)} but only {fmt_bytes(free)} is free; "
            "use meta (counts with no memory) or a smaller --context/--batch"
        )
