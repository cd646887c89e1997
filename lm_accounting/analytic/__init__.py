"""Analytic accounting: exact integer formulas, no torch, no pandas."""

from .flops import (
    TrainingFlops,
    causal_attention_flops,
    forward_flops,
    nonmatmul_flops,
    training_flops,
)
from .params import matmul_params, parameter_breakdown

__all__ = [
    "TrainingFlops",
    "causal_attention_flops",
    "forward_flops",
    "matmul_params",
    "nonmatmul_flops",
    "parameter_breakdown",
    "training_flops",
]
