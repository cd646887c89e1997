"""The numbers behind the course answers (CS336 assignment 1: transformer_accounting and
adamwAccounting), computed once from the calculator, the exact memory model and the
live cross-check.  ``assignment.py`` turns them into ``reports/assignment.md``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..account import Account, account
from ..analytic.capacity import StepPeakLines, peak_lines_in_batch
from ..analytic.course import course_linear_in_batch, max_batch
from ..analytic.params import parameter_breakdown
from ..analytic.replay import predict_training_step
from ..analytic.training import (
    ADAMW_FLOPS_ALTERNATIVES,
    ADAMW_FLOPS_PER_PARAM,
    adamw_step_flops,
    gpu_peak_flops,
    step_flops,
    training_time,
)
from ..config import ModelConfig, load_config
from ..phases import StepMemory
from ..sweep import Sweep, sweep

SIZES = ("gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl")
CONTEXTS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
LONG = 16384
BUDGETS = {"80 GB": 80 * 10**9, "80 GiB": 80 * 2**30}
TRAIN = {"steps": 400_000, "batch": 1024, "seq": 1024, "gpu": "a100", "dtype": "fp32", "mfu": 0.5}


@dataclass
class Answers:
    xl: ModelConfig
    at_1024: Account
    at_long: Account
    sizes: dict[str, Account]
    sweep: Sweep
    crosschecks: dict[int, Any]  # context -> CrossCheck (live model on meta)
    course_conventions: list[dict[str, Any]]
    exact_lines: StepPeakLines  # our live model: each phase's peak as exact lines in B
    exact_max_batch: int
    exact_step: StepMemory
    measured_step: StepMemory | None
    adamw: list[dict[str, Any]]
    training: list[dict[str, Any]]

    @property
    def adamw_default(self) -> dict[str, Any]:
        """The AdamW FLOPs row of our default convention (torch's ops, 14 per parameter)."""
        return next(r for r in self.adamw if r["flops_per_param"] == ADAMW_FLOPS_PER_PARAM)

    def mismatches(self) -> list[str]:
        out = list(self.sweep.mismatches)
        for seq, cc in self.crosschecks.items():
            out += [f"gpt2-xl @ {seq}: {m}" for m in cc.mismatches()]
        if self.measured_step is not None:
            for phase, p in self.exact_step.phases().items():
                if self.measured_step.phase(phase) != p:
                    out.append(f"memory: gpt2-xl {phase}: measured on meta differs from the exact prediction")
        return out


def course_convention_rows(cfg: ModelConfig, seq: int) -> list[dict[str, Any]]:
    """adamwAccounting (b) under each published convention and budget unit."""
    rows = []
    for logits_twice in (True, False):
        for ffn_matrices in (3, 2):
            a, b = course_linear_in_batch(cfg, seq, logits_twice=logits_twice, ffn_matrices=ffn_matrices)
            row = {
                "logits": "twice (logits + cross-entropy)" if logits_twice else "once",
                "ffn_matrices": ffn_matrices,
                "a": a,
                "b": b,
            }
            row.update({f"max batch ({unit})": max_batch(a, b, budget) for unit, budget in BUDGETS.items()})
            rows.append(row)
    return rows


def training_rows(cfg: ModelConfig) -> list[dict[str, Any]]:
    """adamwAccounting (d) under the step-FLOPs conventions published answers use."""
    t, peak = TRAIN, gpu_peak_flops(TRAIN["gpu"], TRAIN["dtype"])
    three = step_flops(cfg, t["seq"], t["batch"], "3x")
    forward = three // 3
    n_adamw = adamw_step_flops(parameter_breakdown(cfg).total)
    variants = [
        ("3 × forward (backward = 2 × forward) — the handout's assumption", three, peak),
        ("6·N·D (Kaplan et al. 2020), N = all parameters", step_flops(cfg, t["seq"], t["batch"], "6nd"), peak),
        ("2 × forward (backward counted = forward)", 2 * forward, peak),
        ("3 × forward + AdamW step (14 FLOPs/param)", three + n_adamw, peak),
        ("3 × forward on A100 bf16 tensor cores (312 TFLOP/s) instead of fp32", three, gpu_peak_flops("a100", "bf16")),
    ]
    rows = []
    for label, per_step, peak_flops in variants:
        tt = training_time(per_step, t["steps"], peak_flops, t["mfu"])
        rows.append(
            {
                "convention": label,
                "flops_per_step": per_step,
                "total_flops": tt.total_flops,
                "peak_flops": peak_flops,
                "days": tt.days,
            }
        )
    return rows


def collect(live: bool = True, progress: bool = False) -> Answers:
    """Every number of the report.  ``live`` runs the cross-checks and meta measurements."""
    xl = load_config("gpt2-xl")
    configs = [load_config(name) for name in SIZES]
    small, *rest = configs
    budget = BUDGETS["80 GB"]
    measured = sweep(
        [small], CONTEXTS, budget=budget, crosscheck=live, measure="meta" if live else None, progress=progress
    )
    analytic = sweep(rest, CONTEXTS, budget=budget)
    measured.rows += analytic.rows
    crosschecks, measured_step = {}, None
    if live:
        from ..measure.crosscheck import crosscheck
        from ..measure.memory import measure_step

        crosschecks = {seq: crosscheck(xl.with_context(seq), seq) for seq in (1024, LONG)}
        measured_step = measure_step(xl, 1024, 1, "fp32", "meta", "foreach")
    n = parameter_breakdown(xl).total
    # traced: the report sets these beside the storage tracker on meta (measured_step)
    exact_lines = peak_lines_in_batch(xl, 1024, "fp32", "foreach", mode="traced")
    return Answers(
        xl=xl,
        at_1024=account(xl, 1024),
        at_long=account(xl.with_context(LONG), LONG),
        sizes={c.name: account(c, 1024) for c in configs},
        sweep=measured,
        crosschecks=crosschecks,
        course_conventions=course_convention_rows(xl, 1024),
        exact_lines=exact_lines,
        exact_max_batch=exact_lines.max_batch(BUDGETS["80 GB"]),
        exact_step=predict_training_step(xl, 1024, 1, "fp32", "foreach", mode="traced"),
        measured_step=measured_step,
        adamw=[
            {
                "convention": c.name,
                "flops_per_param": c.flops_per_param,
                "flops_per_step": adamw_step_flops(n, c.flops_per_param),
                "derivation": c.derivation,
            }
            for c in ADAMW_FLOPS_ALTERNATIVES
        ],
        training=training_rows(xl),
    )
