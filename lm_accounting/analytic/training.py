"""Training time: AdamW step FLOPs, peak GPU throughput, and days to train.

Conventions:

* a training step's model FLOPs come from ``analytic.flops.training_flops``: ``"3x"``
  = forward + backward with backward = 2 x forward (the course's assumption, and what
  FlopCounterMode measures on the live model), ``"6nd"`` = 6·N·D (Kaplan et al. 2020),
  ``"palm"`` = (6·N_matmul + 6·L·h·(d_head + d_v)·S)·D (Chowdhery et al. 2022, app. B, with d_v = d_head; equal
  to "3x" for this architecture);
* the optimizer's FLOPs (``adamw_step_flops``) are reported on their own; for GPT-2 XL
  they are ~2·10⁻⁶ of a batch-1024 step, so ``training_time`` leaves them out unless the
  caller adds them to ``flops_per_step``;
* time = total FLOPs / (peak FLOP/s x MFU), with peak = the dense (no 2:4 sparsity)
  datasheet figure for the chosen dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..config import AccountingError, ModelConfig, check_positive_int
from ..gpus import ALIASES, gpu
from ..gpus import GPUS as ALL_GPUS
from ..names import STEP_FLOPS_METHODS
from .flops import check_batch_seq, training_flops

# -- peak dense throughput, FLOP/s --------------------------------------------
# The one GPU table is ``lm_accounting.gpus`` (memory, bandwidth, dense FLOP/s per dtype and the
# interconnect, each figure with its datasheet).  ``GPUS`` here is its peak-FLOP/s view under the
# names ``train-time`` has always accepted (a100 = the A100 80GB SXM, h100-sxm = the H100 SXM 80GB;
# the 40 GB A100 has the same compute), plus every other GPU of the table under its own name.
TRAINING_GPU_NAMES = ("a100", "h100-sxm", "h100-pcie", "h200", "v100", "rtx-4090", "l4")
GPUS: dict[str, dict[str, int]] = {
    **{name: dict(gpu(name).peak) for name in TRAINING_GPU_NAMES},
    **{name: dict(g.peak) for name, g in ALL_GPUS.items() if name not in TRAINING_GPU_NAMES},
}
"""gpu -> compute dtype -> peak dense FLOP/s (exact int), from ``lm_accounting.gpus``."""

GPU_ALIASES = dict(ALIASES)
"""Common short names (case does not matter): ``gpus.ALIASES``."""


def gpu_peak_flops(gpu_name: str, dtype: str) -> int:
    """Peak dense FLOP/s of ``gpu_name`` for matmuls in ``dtype`` (``gpus.gpu``; unknown: exit 2)."""
    return gpu(gpu_name).peak_flops(dtype)


# -- AdamW step FLOPs -----------------------------------------------------------
# Convention: every elementwise multiply, add, subtract, divide and sqrt on one
# parameter's element is 1 FLOP; scalars computed once per tensor (1 - lr·λ,
# bias corrections 1 - β^t, step size) are free.  Ops as torch 2.13 runs them
# (torch/optim/adam.py, _single_tensor_adam; _multi_tensor_adam does the same ops
# with _foreach_ kernels), AdamW = Adam with decoupled_weight_decay=True:
ADAMW_TORCH_OPS: tuple[tuple[str, int], ...] = (
    ("param.mul_(1 - lr·λ)                      decoupled weight decay", 1),
    ("exp_avg.lerp_(grad, 1-β1) = m + (1-β1)·(g - m)", 3),
    ("exp_avg_sq.mul_(β2)", 1),
    ("exp_avg_sq.addcmul_(grad, grad, 1-β2)      v + (1-β2)·g·g", 3),
    ("denom = exp_avg_sq.sqrt()", 1),
    ("denom / sqrt(1 - β2^t)                     bias correction of v", 1),
    ("denom.add_(eps)", 1),
    ("param.addcdiv_(exp_avg, denom, -lr/(1-β1^t))  p + s·m/denom", 3),
)
ADAMW_FLOPS_PER_PARAM = sum(n for _, n in ADAMW_TORCH_OPS)
"""14: the per-element FLOPs of one torch AdamW step (``ADAMW_TORCH_OPS``).

The CS336 handout's AdamW algorithm counted the same way gives 14 as well:
m = β1·m + (1-β1)·g (3), v = β2·v + (1-β2)·g² (4), θ -= α_t·m/(√v + ε) (5: sqrt,
add, divide, multiply, subtract), θ -= α·λ·θ (2)."""


@dataclass(frozen=True)
class AdamWFlopsConvention:
    name: str
    flops_per_param: int
    derivation: str


ADAMW_FLOPS_ALTERNATIVES: tuple[AdamWFlopsConvention, ...] = (
    AdamWFlopsConvention(
        "fma-as-one",
        10,
        "a fused multiply-add counts 1: m 2 ((1-β1)·g, fma), v 3 (g·g, ·(1-β2), fma), "
        "update 4 (sqrt, +ε, divide, fma), decay 1",
    ),
    AdamWFlopsConvention(
        "no-weight-decay",
        12,
        "plain Adam: the handout's count 3 + 4 + 5 without its decay term θ -= α·λ·θ (2); "
        "by torch's ops the decay is one multiply, which would give 13",
    ),
    AdamWFlopsConvention(
        "torch-ops", ADAMW_FLOPS_PER_PARAM, "default: torch's ops one by one, = the handout's algorithm (3 + 4 + 5 + 2)"
    ),
    AdamWFlopsConvention(
        "per-element-bias-correction",
        15,
        "Kingma & Ba's algorithm as written: m 3, v 4, m̂ = m/(1-β1^t) 1, v̂ = v/(1-β2^t) 1, "
        "sqrt 1, +ε 1, divide 1, ·lr 1, subtract 1, decay as one multiply θ·(1-lr·λ) 1",
    ),
    AdamWFlopsConvention("per-element-bias-correction-unfolded-decay", 16, "as above but decay as θ - (lr·λ)·θ: 2"),
)
"""Other per-parameter counts; published answers to adamwAccounting (c) use 10 to 15."""


def adamw_step_flops(n_params: int, flops_per_param: int = ADAMW_FLOPS_PER_PARAM) -> int:
    """FLOPs of one AdamW step: n_params · flops_per_param (14 by default, ``ADAMW_TORCH_OPS``)."""
    check_positive_int("n_params", n_params, limit=None)
    check_positive_int("flops_per_param", flops_per_param)
    return n_params * flops_per_param


# -- step FLOPs and training time -------------------------------------------------


def step_flops(cfg: ModelConfig, seq: int, batch: int, method: str = "3x") -> int:
    """Model FLOPs of one training step on ``batch`` sequences of ``seq`` tokens.

    ``"3x"``: 3 x the matmul forward FLOPs (backward = 2 x forward);
    ``"6nd"``: 6 · N · batch · seq with N = the active parameters (all of them for a dense model);
    ``"palm"``: (6·N_matmul + 6·L·h·(d_head + d_v)·S) · batch · seq.
    """
    if method not in STEP_FLOPS_METHODS:
        raise AccountingError(f"unknown step FLOPs method '{method}' (valid: {', '.join(STEP_FLOPS_METHODS)})")
    check_batch_seq(batch, seq)
    t = training_flops(cfg, seq, batch)
    return {"3x": t.step, "6nd": t.six_nd, "palm": t.palm}[method]


SECONDS_PER_HOUR = 3_600
SECONDS_PER_DAY = 86_400


@dataclass(frozen=True)
class TrainingTime:
    """Wall-clock time of ``steps`` steps at ``peak_flops`` x ``mfu`` achieved FLOP/s."""

    flops_per_step: int
    steps: int
    total_flops: int
    peak_flops: float
    mfu: float
    seconds: float
    hours: float
    days: float


def training_time(flops_per_step: int, steps: int, peak_flops: float, mfu: float) -> TrainingTime:
    """seconds = flops_per_step · steps / (peak_flops · mfu); hours = /3600; days = /86400.

    The FLOP total is an exact int; only the final division is floating point.
    """
    check_positive_int("flops_per_step", flops_per_step, limit=None)
    check_positive_int("steps", steps)
    if isinstance(peak_flops, bool) or not isinstance(peak_flops, (int, float)) or not 1 <= peak_flops < math.inf:
        raise AccountingError(
            f"peak FLOP/s must be a finite number >= 1, got {peak_flops!r} (known GPUs: {', '.join(GPUS)})"
        )
    if isinstance(mfu, bool) or not isinstance(mfu, (int, float)) or not 0 < mfu <= 1:
        raise AccountingError(f"mfu must be in (0, 1], e.g. 0.5 for 50%, got {mfu!r}")
    total = flops_per_step * steps
    seconds = total / (peak_flops * mfu)
    return TrainingTime(
        flops_per_step=flops_per_step,
        steps=steps,
        total_flops=total,
        peak_flops=peak_flops,
        mfu=mfu,
        seconds=seconds,
        hours=seconds / SECONDS_PER_HOUR,
        days=seconds / SECONDS_PER_DAY,
    )
