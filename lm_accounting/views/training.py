"""The view of a ``TrainTime``: days to train under each convention, and AdamW's FLOPs."""

from __future__ import annotations

from ..analytic.training import ADAMW_FLOPS_PER_PARAM, adamw_step_flops
from ..plan import StepEstimate
from ..train_time import METHOD_LABELS, TrainTime
from .account import describe_config
from .plan import efficiency_words
from .tables import Column, Table, View
from .words import plural


def train_time_view(r: TrainTime) -> View:
    chosen, e = r.chosen, r.estimate
    whose = r.impl + ("'" if r.impl.endswith("s") else "'s")  # transformers' step, course's step
    header = [
        describe_config(r.config),
        (
            f"{plural(r.steps, 'step')} · batch {r.batch:,} · context {r.seq:,} · {e.step_seconds:,.4f} s per step · "
            f"MFU {e.mfu:.1%} · HFU {e.hfu:.1%} · {chosen.days:,.1f} days ({chosen.hours:,.1f} hours)"
        ),
        f"step time: {efficiency_words(e.calibration, e.efficiency)} ({whose} step, setup {r.setup.label})",
    ]
    lay = r.layout
    if lay is not None:
        header.insert(
            2,
            f"layout {lay.label} on {plural(lay.world, 'GPU')} · batch {r.batch:,} a micro-batch × "
            f"{lay.micro_batches:,} per data-parallel rank × dp {lay.dp:,} = {r.global_batch:,} sequences a step "
            "(plan's price of this layout)"
            + (
                "; context parallel runs the fused kernel as ring attention, sdpa its only attention"
                if lay.cp > 1
                else ""
            ),
        )
    time_table = Table(
        f"Training time at the calibrated step's {r.mfu:.1%} of {'' if lay is None else f'{lay.world:,} × '}"
        f"{r.device} ({r.peak_flops / 1e12:,.1f} TFLOP/s),"
        " by step FLOPs convention",
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
        f"AdamW step FLOPs for N = {r.n_params:,} parameters (~{share:.1e} of a step's FLOPs)",
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
    hardware = ("hardware FLOPs = model + recompute (HFU = MFU × hardware / model)", f.hardware, r.hfu)
    if lay is not None:  # the job's model FLOPs over its GPUs, the busiest GPU's hardware FLOPs (plan's MFU, HFU)
        hardware = ("hardware FLOPs of the busiest GPU (HFU = hardware / (step × peak))", e.hardware_flops, r.hfu)
    use = Table(
        f"Utilisation with setup {r.setup.label} (matmul FLOPs of one step)",
        [Column("quantity"), Column("FLOPs per step", "int"), Column("utilisation", "share")],
        [("model FLOPs = 3 × forward (MFU)", f.model if lay is None else e.model_flops, r.mfu), hardware],
    )
    notes = [
        "GPU peaks are dense datasheet figures (no 2:4 sparsity).",
        (
            "The step: analytic.step_time prices the step's own ops (GEMMs at measured rates, fused attention,"
            " memory-bound kernels, AdamW) on the GPU's calibration (lm_accounting/calibration/); its error against"
            " real steps is in reports/calibration/, against published runs in reports/published/."
        ),
    ]
    return View(header, [step_table(e), time_table, use, adam], notes)


def step_table(e: StepEstimate) -> Table:
    """One step by the time model's breakdown (``plan.StepEstimate``)."""
    d = e.to_dict()
    b = d["breakdown"]
    rows = [
        ("compute: GEMM", b["compute"]["gemm"]),
        ("compute: fused attention", b["compute"]["attention"]),
        ("compute: other (memory-bound kernels, AdamW)", b["compute"]["other"]),
        ("pipeline bubble", b["bubble"]),
        ("exposed communication", b["exposed_communication"]),
        ("step", e.step_seconds),
    ]
    return Table("Step time (seconds unless named)", [Column("quantity"), Column("value", "float")], rows)
