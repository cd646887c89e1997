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
            f"{r.peak_flops / 1e12:,.1f} TFLOP/s peak · MFU {100 * r.mfu:g}% · {chosen.days:,.1f} days "
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
    return View(header, [time_table, use, adam], ["GPU peaks are dense datasheet figures (no 2:4 sparsity)."])
