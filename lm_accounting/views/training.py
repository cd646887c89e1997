"""Printable tables for the ``train-time`` command."""

from __future__ import annotations

from typing import Any

from ..analytic.params import parameter_breakdown
from ..analytic.training import (
    ADAMW_FLOPS_ALTERNATIVES,
    ADAMW_FLOPS_PER_PARAM,
    STEP_FLOPS_METHODS,
    adamw_step_flops,
    step_flops,
    training_time,
)
from ..config import ModelConfig
from .account import describe_config
from .tables import Column, Table

METHOD_LABELS = {"3x": "3 × forward (backward = 2 × forward)", "6nd": "6·N·D", "palm": "PaLM 6·N_matmul·D + 12·L·h·d_head·S·D"}


def training_report(cfg: ModelConfig, seq: int, batch: int, steps: int, peak: float, mfu: float, method: str,
                    device_label: str) -> tuple[dict[str, Any], list[str], list[Table], list[str]]:
    chosen = training_time(step_flops(cfg, seq, batch, method), steps, peak, mfu)
    rows, data = [], {}
    for m in STEP_FLOPS_METHODS:
        t = training_time(step_flops(cfg, seq, batch, m), steps, peak, mfu)
        rows.append((("→ " if m == method else "") + METHOD_LABELS[m], t.flops_per_step, t.total_flops, t.hours, t.days))
        data[m] = {"flops_per_step": t.flops_per_step, "total_flops": t.total_flops, "seconds": t.seconds,
                   "hours": t.hours, "days": t.days}
    header = [describe_config(cfg),
              f"{steps:,} steps · batch {batch:,} · context {seq:,} · {device_label} at {peak / 1e12:,.1f} TFLOP/s peak · "
              f"MFU {100 * mfu:g}% · {chosen.days:,.1f} days ({chosen.hours:,.1f} hours) by {METHOD_LABELS[method]}"]
    time_table = Table(
        "Training time (model FLOPs only; time = FLOPs / (peak × MFU))",
        [Column("step FLOPs estimate"), Column("FLOPs per step", "int"), Column("total FLOPs", "int"),
         Column("hours", "float"), Column("days", "float")],
        rows,
    )
    n = parameter_breakdown(cfg).total
    adam_rows = [(f"{c.name}{' (default)' if c.flops_per_param == ADAMW_FLOPS_PER_PARAM and c.name == 'torch-ops' else ''}",
                  c.flops_per_param, adamw_step_flops(n, c.flops_per_param), c.derivation)
                 for c in ADAMW_FLOPS_ALTERNATIVES]
    adam = Table(
        f"AdamW step FLOPs for N = {n:,} parameters (not in the training time: ~{adamw_step_flops(n) / chosen.flops_per_step:.1e} of a step)",
        [Column("convention"), Column("FLOPs/param", "int"), Column("FLOPs per step", "int"), Column("derivation")],
        adam_rows,
    )
    data = {"schema": "lm-accounting/train-time/1", "config": cfg.resolved(), "context": seq, "batch": batch,
            "steps": steps, "peak_flops": peak, "mfu": mfu, "method": method, "methods": data,
            "adamw_step_flops": {c.name: adamw_step_flops(n, c.flops_per_param) for c in ADAMW_FLOPS_ALTERNATIVES}}
    return data, header, [time_table, adam], ["GPU peaks are dense datasheet figures (no 2:4 sparsity)."]
