"""The view of a ``TrainTime``: days to train under each convention, and AdamW's FLOPs."""

from __future__ import annotations

from ..analytic.training import ADAMW_FLOPS_PER_PARAM, adamw_step_flops
from ..train_time import METHOD_LABELS, TrainTime
from .account import describe_config
from .tables import Column, Table, View
from .words import plural


def train_time_view(r: TrainTime) -> View:
    chosen = r.chosen
    header = [
        describe_config(r.config),
        (
            f"{plural(r.steps, 'step')} · batch {r.batch:,} · context {r.seq:,} · {r.device} at "
            f"{r.peak_flops / 1e12:,.1f} TFLOP/s peak · assumed MFU {100 * r.mfu:g}% · {chosen.days:,.1f} days "
            f"({chosen.hours:,.1f} hours) by {METHOD_LABELS[r.method]}"
        ),
    ]
    time_table = Table(
        "Training time (model FLOPs only; time = FLOPs / (peak × MFU))",
        [
            Column("step FLOPs estimate"),
            Column("FLOPs per step", "int"),
            Column("total FLOPs", "int"),
            Column("hours", "float"),
            Column("days", "float"),
        ],
        [
            (("→ " if m == r.method else "") + METHOD_LABELS[m], t.flops_per_step, t.total_flops, t.hours, t.days)
            for m, t in r.estimates.items()
        ],
    )
    share = adamw_step_flops(r.n_params) / chosen.flops_per_step
    adam = Table(
        f"AdamW step FLOPs for N = {r.n_params:,} parameters (not in the training time: ~{share:.1e} of a step)",
        [Column("convention"), Column("FLOPs/param", "int"), Column("FLOPs per step", "int"), Column("derivation")],
        [
            (
                c.name + (" (default)" if c.name == "torch-ops" and c.flops_per_param == ADAMW_FLOPS_PER_PARAM else ""),
                c.flops_per_param,
                flops,
                c.derivation,
            )
            for c, flops in r.adamw()
        ],
    )
    f = r.matmul_flops
    use = Table(
        f"Utilisation with setup {r.setup.label} (matmul FLOPs of one step)",
        [Column("quantity"), Column("FLOPs per step", "int"), Column("utilisation", "share")],
        [
            ("model FLOPs = 3 × forward (MFU)", f.model, r.mfu),
            ("hardware FLOPs = model + recompute (HFU = MFU × hardware / model)", f.hardware, r.hfu),
        ],
    )
    notes = ["GPU peaks are dense datasheet figures (no 2:4 sparsity)."]
    tables = [time_table, use]
    c = r.calibrated
    if c is None:
        notes.append(f"No calibrated step time: {r.calibration_note}.")
    else:
        header.append(
            f"calibrated ({c.impl}, {c.time.gpu}): {c.step_seconds:,.4f} s per step · MFU {c.mfu:.1%} · "
            f"HFU {c.hfu:.1%} · "
            + (f"{c.days:,.1f} days" if c.days >= 1 else f"{c.days * 24:,.2f} hours")
            + ("" if c.efficiency == 1 else f" (--efficiency {c.efficiency:g} applied)")
        )
        tables.append(calibrated_table(c))
        notes += [
            (
                f"Calibrated: analytic.step_time prices the step's own ops with {c.time.gpu}'s measured rates "
                f"(lm_accounting/calibration/{c.time.gpu}); its error against real steps is "
                f"reports/calibration/{c.time.gpu}.md. MFU and HFU are against the dense {c.peak_dtype} peak."
            ),
            *(f"Calibrated model: {caveat}." for caveat in c.time.caveats),
        ]
    return View(header, [*tables, adam], notes)


def calibrated_table(c) -> Table:
    """The calibrated step by phase and kind of op, then what it implies."""
    t, scale = c.time, 1 / c.efficiency
    rows = [
        (f"{phase}: {kind}", getattr(p, kind) * scale)
        for phase, p in (("forward", t.forward), ("backward", t.backward))
        for kind in ("gemm", "attention", "memory_bound")
    ]
    rows += [
        ("optimizer step (AdamW)", t.optimizer_step * scale),
        ("step", c.step_seconds),
        ("tokens per second", c.tokens_per_step / c.step_seconds),
        ("MFU (model FLOPs / step time / peak)", c.mfu),
        ("HFU (hardware FLOPs / step time / peak)", c.hfu),
        (f"days for {c.steps:,} steps", c.days),
    ]
    title = f"Calibrated step time on {t.gpu} ({c.impl}'s step, seconds unless named)"
    return Table(title, [Column("quantity"), Column("value", "float")], rows)
