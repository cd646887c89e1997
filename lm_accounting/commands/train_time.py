"""``train-time``: one GPU's calibrated step time, its MFU and HFU, days to train; the AdamW step FLOPs
(analytic)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..analytic.sizes import at_context, check_batch_seq
from ..analytic.training import gpu_peak_flops
from ..config import AccountingError, ModelConfig
from ..gpus import gpu
from ..implementations import check_impl
from ..layout import ParallelLayout
from ..names import STEP_FLOPS_METHODS
from ..parallelisms.cp import check_attention
from ..plan import check_efficiency
from ..setup import TrainingSetup
from ..train_time import TrainTime, train_time


@dataclass(frozen=True)
class Request:
    config: ModelConfig
    context: int | None = None
    batch: int = 1
    steps: int = 400_000
    gpu: str = "a100"
    gpu_dtype: str | None = None  # the peak MFU is quoted against (default: the setup's compute dtype)
    peak_flops: float | None = None  # overrides the GPU's peak for gpu_dtype
    method: str = "3x"
    setup: TrainingSetup = field(default_factory=TrainingSetup)
    impl: str = "course"
    efficiency: float = 1.0  # scales the calibrated step time (1: as calibrated)
    layout: ParallelLayout | None = None  # a parallel job, ``batch`` sequences a micro-batch (``plan``'s price)

    def __post_init__(self) -> None:
        check_batch_seq(self.batch, at_context(self.config, self.context).context_length)
        if self.method not in STEP_FLOPS_METHODS:
            raise AccountingError(f"unknown step FLOPs method '{self.method}' (valid: {', '.join(STEP_FLOPS_METHODS)})")
        if self.peak_flops is None:
            if self.gpu_dtype is not None:
                gpu_peak_flops(self.gpu, self.gpu_dtype)  # an unknown GPU or dtype is refused here
        elif not 0 < self.peak_flops:
            raise AccountingError(f"--peak-flops must be positive, got {self.peak_flops}")
        if not 1 <= self.steps:
            raise AccountingError(f"--steps must be at least 1, got {self.steps}")
        check_efficiency(self.efficiency)
        gpu(self.gpu)  # an unknown GPU is refused here
        check_impl(self.config, self.impl)
        if self.layout is not None:
            if self.impl != "course":
                raise AccountingError("train-time prices a parallel layout with --impl course (plan's program)")
            self.layout.check(self.config, at_context(self.config, self.context).context_length)
            check_attention(self.layout, self.setup.attention)


def run(request: Request) -> TrainTime:
    r = request
    return train_time(
        r.config, r.context, r.batch, r.steps, gpu=r.gpu, gpu_dtype=r.gpu_dtype, peak_flops=r.peak_flops,
        method=r.method, setup=r.setup, impl=r.impl, efficiency=r.efficiency, layout=r.layout,
    )  # fmt: skip
