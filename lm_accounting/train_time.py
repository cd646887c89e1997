"""The ``train-time`` result: one GPU's step from the calibrated step-time model (``plan.estimate_step``, the
model ``plan`` and ``memory`` with a layout print: the step's ops priced on the GPU's calibration, or on the H100's
scaled to the GPU where it has none), its MFU and HFU; days to train under each step-FLOPs convention at the
rate that step reaches; and AdamW's FLOPs.  No MFU is an input: the course's question, which assumes one, is
answered in ``course.answers``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .analytic.hardware_flops import StepFlops
from .analytic.hardware_flops import step_flops as hardware_step_flops
from .analytic.params import parameter_breakdown
from .analytic.sizes import at_context
from .analytic.training import (
    ADAMW_FLOPS_ALTERNATIVES,
    SECONDS_PER_DAY,
    SECONDS_PER_HOUR,
    AdamWFlopsConvention,
    TrainingTime,
    adamw_step_flops,
    gpu_peak_flops,
    step_flops,
)
from .config import AccountingError, ModelConfig
from .layout import ParallelLayout
from .names import STEP_FLOPS_METHODS
from .plan import StepEstimate, estimate_step
from .result import Result
from .setup import TrainingSetup

METHOD_LABELS = {
    "3x": "3 × forward (backward = 2 × forward)",
    "6nd": "6·N·D",
    "palm": "PaLM 6·N_matmul·D + 6·L·h·(d_head + d_v)·S·D",
}


@dataclass(frozen=True)
class TrainTime(Result):
    """Training time of ``steps`` calibrated steps (``estimate``), and under every step-FLOPs method at the model
    FLOP/s that step reaches (``mfu`` of ``peak_flops``)."""

    SCHEMA = "lm-accounting/train-time/8"

    config: ModelConfig
    seq: int
    batch: int
    steps: int
    device: str  # "a100 fp32", or "custom peak"
    peak_flops: float
    mfu: float  # the calibrated step's model FLOPs / step time / ``peak_flops``
    method: str  # the chosen step-FLOPs method
    estimates: dict[str, TrainingTime]  # method -> time
    n_params: int
    setup: TrainingSetup
    matmul_flops: StepFlops  # model (3 × forward) and hardware (with the setup's recompute) FLOPs of a step
    estimate: StepEstimate  # the calibrated step (``plan.estimate_step``)
    impl: str = "course"
    layout: ParallelLayout | None = None  # a parallel job (``batch`` sequences a micro-batch); None: one GPU

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step: ``batch``, or under a layout batch × its micro-batches × dp."""
        lay = self.layout
        return self.batch if lay is None else self.batch * lay.micro_batches * lay.dp

    @property
    def chosen(self) -> TrainingTime:
        return self.estimates[self.method]

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilisation: MFU × hardware / model FLOPs of a step (the GPU also runs the recompute of
        checkpointing and of the fused attention backward); under a layout MFU × GPUs × the busiest GPU's hardware /
        the job's model FLOPs (``StepEstimate.hfu``'s, at ``peak_flops``)."""
        if self.layout is None:
            return self.mfu * self.matmul_flops.hardware / self.matmul_flops.model
        return self.mfu * self.estimate.gpus * self.estimate.hardware_flops / self.estimate.model_flops

    def adamw(self) -> list[tuple[AdamWFlopsConvention, int]]:
        """Each AdamW FLOPs convention and its FLOPs per step for this model."""
        return [(c, adamw_step_flops(self.n_params, c.flops_per_param)) for c in ADAMW_FLOPS_ALTERNATIVES]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.SCHEMA,
            "config": self.config.resolved(),
            "context": self.seq,
            "batch": self.batch,
            "steps": self.steps,
            "device": self.device,
            "peak_flops": self.peak_flops,
            "method": self.method,
            "setup": self.setup.to_dict(),
            "methods": {
                m: {
                    "flops_per_step": t.flops_per_step,
                    "total_flops": t.total_flops,
                    "seconds": t.seconds,
                    "hours": t.hours,
                    "days": t.days,
                }
                for m, t in self.estimates.items()
            },
            "parameters": self.n_params,
            "adamw_step_flops": {c.name: flops for c, flops in self.adamw()},
            "impl": self.impl,
            "layout": None if self.layout is None else self.layout.to_dict(),
            "global_batch": self.global_batch,
            **self.estimate.to_dict(),
            "days": self.estimate.step_seconds * self.steps / SECONDS_PER_DAY,
        }

    def records(self) -> list[dict[str, Any]]:
        """Tidy rows: one per (method, quantity) and one per AdamW convention."""
        rows = []
        for m, t in self.estimates.items():
            for quantity, value in (
                ("flops_per_step", t.flops_per_step),
                ("total_flops", t.total_flops),
                ("hours", t.hours),
                ("days", t.days),
            ):
                rows.append(
                    dict(section="training_time", key=m, quantity=quantity, value=value, chosen=m == self.method)
                )
        rows += [
            dict(section="adamw_step_flops", key=c.name, quantity="flops_per_step", value=flops, chosen=None)
            for c, flops in self.adamw()
        ]
        rows += [
            dict(section="utilisation", key=key, quantity=key, value=value, chosen=None)
            for key, value in (
                ("model_flops", self.matmul_flops.model),
                ("hardware_flops", self.matmul_flops.hardware),
                ("mfu", self.mfu),
                ("hfu", self.hfu),
            )
        ]
        return rows


def train_time(
    cfg: ModelConfig,
    seq: int | None = None,
    batch: int = 1,
    steps: int = 400_000,
    *,
    gpu: str = "a100",
    gpu_dtype: str | None = None,
    peak_flops: float | None = None,
    method: str = "3x",
    setup: TrainingSetup | None = None,
    impl: str = "course",
    efficiency: float = 1.0,
    layout: ParallelLayout | None = None,
) -> TrainTime:
    """Days to train ``cfg`` for ``steps`` steps of ``batch`` × ``seq`` tokens on one ``gpu``: the calibrated step
    of ``impl``'s program (``plan.estimate_step`` on one GPU, scaled by ``efficiency``), and each step-FLOPs
    method's FLOPs at the model FLOP/s it reaches.  MFU is quoted against ``peak_flops``, or ``gpu``'s dense peak
    for ``gpu_dtype`` (default: the setup's compute dtype, bf16 unless fp32).  A step the model cannot price
    (a GPU lacking a figure it needs, a program the op library does not model) is refused in one line.
    ``layout``: the parallel job's step instead, ``plan``'s price of that layout (``plan.estimate_step``, the figure
    ``plan`` and ``memory`` print for it), ``batch`` sequences a micro-batch, its micro-batches per data-parallel
    rank; MFU over its GPUs' peaks."""
    run = at_context(cfg, seq)
    if method not in STEP_FLOPS_METHODS:
        raise AccountingError(f"unknown step FLOPs method '{method}' (valid: {', '.join(STEP_FLOPS_METHODS)})")
    setup = setup or TrainingSetup()
    from .gpus import gpu as gpu_named

    g = gpu_named(gpu)
    dtype = gpu_dtype or ("fp32" if setup.precision == "fp32" else "bf16")
    if peak_flops is None:
        peak, device = gpu_peak_flops(g.name, dtype), f"{g.name} {dtype}"
    else:
        peak, device = peak_flops, "custom peak"
    job = layout or ParallelLayout()
    estimate = estimate_step(run, g.name, run.context_length, batch, setup, job, efficiency=efficiency, impl=impl)
    rate = estimate.model_flops / estimate.step_seconds  # model FLOP/s of the calibrated step
    sequences, peak_all = batch * job.micro_batches * job.dp, peak * job.world  # the job's step and GPUs
    estimates = {
        m: _at_rate(step_flops(run, run.context_length, sequences, m), steps, peak_all, rate)
        for m in STEP_FLOPS_METHODS
    }
    flops = hardware_step_flops(run, run.context_length, sequences, setup)
    return TrainTime(
        run,
        run.context_length,
        batch,
        steps,
        device,
        peak,
        rate / peak_all,
        method,
        estimates,
        parameter_breakdown(run).total,
        setup,
        flops,
        estimate,
        impl,
        layout,
    )


def _at_rate(flops_per_step: int, steps: int, peak: float, rate: float) -> TrainingTime:
    """``analytic.training.training_time`` at ``rate`` FLOP/s (MFU = rate / peak, which an --efficiency may take
    past 1)."""
    total = flops_per_step * steps
    seconds = total / rate
    return TrainingTime(
        flops_per_step, steps, total, peak, rate / peak, seconds, seconds / SECONDS_PER_HOUR, seconds / SECONDS_PER_DAY
    )
