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
            raise AccountingError("--device cuda: no CUDA GPU is available on this machine (try --device meta)")
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


def required_bytes(cfg: ModelConfig, seq: int, batch: int, training: bool) -> int:
    """A lower bound on the live run's peak: fp32 weights (+ gradients when training) plus the
    largest single activation (one layer's attention scores or the logits)."""
    from ..analytic.params import parameter_breakdown

    weights = 4 * parameter_breakdown(cfg).total
    largest = 4 * batch * max(cfg.num_heads * seq * seq, seq * cfg.vocab_size)
    return weights * (2 if training else 1) + largest


def check_device_fits(cfg: ModelConfig, seq: int, batch: int, device: str, training: bool) -> None:
    free = available_bytes(device)
    if free is None:
        return
    need = required_bytes(cfg, seq, batch, training)
    if need > free:
        raise AccountingError(
            f"--device {device}: this run needs at least {fmt_bytes(need)} but only {fmt_bytes(free)} is free; "
            "use --device meta (counts FLOPs with no memory) or a smaller --context/--batch"
        )
