"""Capacity planning from the implementation-exact step model: a·B + b, max batch, max context.

Every figure comes from ``predict_training_step`` (exact for our live model), so the
searches are exact too: memory grows monotonically with the batch and the context.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import AccountingError, ModelConfig
from .replay import predict_training_step

MAX_SEARCH = 1 << 40  # far beyond any real batch or context; keeps the searches finite


@dataclass(frozen=True)
class LinearPeak:
    """peak(B) = a·B + b, fitted through B = 1 and B = 2; ``exact_to`` is the largest
    batch among {3, 4, 8, 64} where the line still equals the replayed peak exactly."""

    a: int
    b: int
    exact_to: int

    def at(self, batch: int) -> int:
        return self.a * batch + self.b


def peak_linear_in_batch(cfg: ModelConfig, seq: int, dtype: str = "fp32", optimizer: str = "for-loop") -> LinearPeak:
    def peak(batch: int) -> int:
        return predict_training_step(cfg, seq, batch, dtype, optimizer).peak

    one, two = peak(1), peak(2)
    a, b = two - one, 2 * one - two
    exact_to = 2
    for batch in (3, 4, 8, 64):
        if peak(batch) != a * batch + b:
            break
        exact_to = batch
    return LinearPeak(a, b, exact_to)


def _largest(fits, start: int = 1) -> int:
    """Largest n >= start with fits(n) (fits monotone decreasing); start - 1 if none."""
    if not fits(start):
        return start - 1
    low, high = start, start * 2
    while fits(high):
        low, high = high, high * 2
        if high > MAX_SEARCH:
            raise AccountingError("the budget is so large that the search did not terminate; give a smaller budget")
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def max_batch_that_fits(cfg: ModelConfig, seq: int, budget: int, dtype: str = "fp32", optimizer: str = "for-loop") -> int:
    """Largest batch whose training-step peak is within ``budget`` bytes (0 if none)."""
    return _largest(lambda b: predict_training_step(cfg, seq, b, dtype, optimizer).peak <= budget)


def max_context_that_fits(cfg: ModelConfig, budget: int, batch: int = 1, dtype: str = "fp32",
                          optimizer: str = "for-loop") -> int:
    """Largest context (tokens) whose training-step peak at ``batch`` fits ``budget`` (0 if none).

    The model is rebuilt at each context (its RoPE tables grow with it)."""
    def fits(seq: int) -> bool:
        return predict_training_step(cfg.with_context(seq), seq, batch, dtype, optimizer).peak <= budget

    return _largest(fits)
