"""The ``train-time`` result: days to train under each step-FLOPs convention at an assumed MFU, the calibrated
step time where the GPU has a calibration table (``analytic.step_time``), and AdamW's FLOPs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .analytic.hardware_flops import StepFlops
from .analytic.hardware_flops import step_flops as hardware_step_flops
from .analytic.params import parameter_breakdown
from .analytic.sizes import at_context
from .analytic.step_time import StepTime
from .analytic.training import (
    ADAMW_FLOPS_ALTERNATIVES,
    AdamWFlopsConvention,
    TrainingTime,
    adamw_step_flops,
    gpu_peak_flops,
    step_flops,
    training_time,
)
from .config import AccountingError, ModelConfig
from .names import STEP_FLOPS_METHODS
from .result import Result
from .setup import TrainingSetup

METHOD_LABELS = {
    "3x": "3 × forward (backward = 2 × forward)",
    "6nd": "6·N·D",
    "palm": "PaLM 6·N_matmul·D + 6·L·h·(d_head + d_v)·S·D",
}


@dataclass(frozen=True)
class Calibrated:
    """The step time ``analytic.step_time`` predicts on a calibrated GPU, divided by ``efficiency`` (1: as
    calibrated), and the utilisation it implies against the GPU's dense peak for the setup's compute dtype."""

    impl: str
    time: StepTime
    efficiency: float
    peak_dtype: str
    peak_flops: int
    flops: StepFlops
    steps: int
    tokens_per_step: int

    @property
    def step_seconds(self) -> float:
        return self.time.seconds / self.efficiency

    @property
    def mfu(self) -> float:
        return self.flops.model / self.step_seconds / self.peak_flops

    @property
    def hfu(self) -> float:
        return self.flops.hardware / self.step_seconds / self.peak_flops

    @property
    def days(self) -> float:
        return self.step_seconds * self.steps / 86_400

    def to_dict(self) -> dict[str, Any]:
        return {
            "impl": self.impl,
            "gpu": self.time.gpu,
            "efficiency": self.efficiency,
            "step_seconds": self.step_seconds,
            "tokens_per_second": self.tokens_per_step / self.step_seconds,
            "model_flops_per_step": self.flops.model,
            "hardware_flops_per_step": self.flops.hardware,
            "peak_dtype": self.peak_dtype,
            "peak_flops": self.peak_flops,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "days": self.days,
            "breakdown": self.time.to_dict(),
        }


@dataclass(frozen=True)
class TrainTime(Result):
    """Training time of ``steps`` steps at ``peak_flops`` × ``mfu``, for every step-FLOPs method."""

    SCHEMA = "lm-accounting/train-time/6"

    config: ModelConfig
    seq: int
    batch: int
    steps: int
    device: str  # "a100 fp32", or "custom peak"
    peak_flops: float
    mfu: float
    method: str  # the chosen step-FLOPs method
    estimates: dict[str, TrainingTime]  # method -> time
    n_params: int
    setup: TrainingSetup
    matmul_flops: StepFlops  # model (3 × forward) and hardware (with the setup's recompute) FLOPs of a step
    calibrated: Calibrated | None = None  # the calibrated step time, where the GPU has a table
    calibration_note: str = ""  # why there is none

    @property
    def chosen(self) -> TrainingTime:
        return self.estimates[self.method]

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilisation at the given MFU: MFU × hardware / model FLOPs of a step
        (the GPU also runs the recompute of checkpointing and of the fused attention backward)."""
        return self.mfu * self.matmul_flops.hardware / self.matmul_flops.model

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
            "mfu": self.mfu,
            "method": self.method,
            "setup": self.setup.to_dict(),
            "model_flops": self.matmul_flops.model,
            "hardware_flops": self.matmul_flops.hardware,
            "hfu": self.hfu,
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
            "calibrated": self.calibrated.to_dict() if self.calibrated else None,
            "calibration_note": self.calibration_note or None,
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
    gpu_dtype: str = "fp32",
    peak_flops: float | None = None,
    mfu: float = 0.5,
    method: str = "3x",
    setup: TrainingSetup | None = None,
    impl: str = "course",
    efficiency: float | None = None,
) -> TrainTime:
    """Days to train ``cfg`` for ``steps`` steps of ``batch`` × ``seq`` tokens on one ``gpu``
    (peak from ``analytic.training.GPUS`` for ``gpu_dtype``, or ``peak_flops``) at ``mfu``.
    The time counts model FLOPs; ``setup`` gives the hardware FLOPs and so the HFU.  Where ``gpu`` has a
    calibration table, also the calibrated step time of ``impl``'s step (``Calibrated``), scaled by
    ``efficiency``; ``efficiency`` on a GPU without one is refused."""
    run = at_context(cfg, seq)
    if method not in STEP_FLOPS_METHODS:
        raise AccountingError(f"unknown step FLOPs method '{method}' (valid: {', '.join(STEP_FLOPS_METHODS)})")
    if peak_flops is None:
        peak, device = gpu_peak_flops(gpu, gpu_dtype), f"{gpu} {gpu_dtype}"
    else:
        peak, device = peak_flops, "custom peak"
    estimates = {
        m: training_time(step_flops(run, run.context_length, batch, m), steps, peak, mfu) for m in STEP_FLOPS_METHODS
    }
    setup = setup or TrainingSetup()
    flops = hardware_step_flops(run, run.context_length, batch, setup)
    calibrated, note = _calibrated(run, batch, steps, gpu, setup, impl, efficiency, flops)
    return TrainTime(
        run,
        run.context_length,
        batch,
        steps,
        device,
        peak,
        mfu,
        method,
        estimates,
        parameter_breakdown(run).total,
        setup,
        flops,
        calibrated,
        note,
    )


def _calibrated(run, batch, steps, gpu_name, setup, impl, efficiency, flops) -> tuple[Calibrated | None, str]:
    from .analytic.step_time import calibrations, predict_step_time
    from .gpus import gpu

    if efficiency is not None and not 0 < efficiency <= 1.5:
        raise AccountingError(f"--efficiency must be in (0, 1.5], got {efficiency}")
    try:
        table = gpu(gpu_name)
    except AccountingError:  # a custom --peak-flops needs no GPU from the table, and then has no calibration
        if efficiency is not None:
            raise
        return None, f"GPU {gpu_name!r} is not in the table"
    if table.name not in calibrations():
        if efficiency is not None:
            raise AccountingError(
                f"--efficiency scales the calibrated step-time model, which has no table for {table.name} "
                f"(have: {', '.join(calibrations())})"
            )
        return None, f"no calibration table for {table.name} (have: {', '.join(calibrations())})"
    try:
        time = predict_step_time(run, run.context_length, setup, impl=impl, batch=batch, gpu=table.name)
    except ValueError as err:  # a step the op library does not model on cuda: said, not raised
        return None, f"the calibrated model cannot price this step: {err}"
    peak_dtype = "fp32" if setup.precision == "fp32" else "bf16"
    tokens = batch * run.context_length
    return Calibrated(impl, time, efficiency or 1.0, peak_dtype, table.peak_flops(peak_dtype), flops, steps, tokens), ""
