"""The ``memory`` command's view: the course answer first, then this implementation, labelled apart.

A student copying a number for CS336 adamwAccounting takes it from the first table, titled
"Course answer"; every table of the implementation-exact model is titled "This implementation".
"""

from __future__ import annotations

from ..analytic.capacity import context_limit
from ..analytic.memory_report import MemoryAccount, batch_span
from ..analytic.program_report import step_unmodelled
from ..implementations import ATTENTION_WORDS, model_class, program_label
from ..phases import PHASE_LABELS
from ..provenance import CPU_TORCH, CUDA
from ..units import fmt_bytes
from .account import BREAKDOWN_COLUMNS, breakdown_table, describe_config
from .tables import Column, Table, View
from .words import NONE_FITS

COURSE = "Course answer (CS336 adamwAccounting convention)"
EXACT = "This implementation (our live model, exact)"


def inexact(m: MemoryAccount) -> str | None:
    """Why the step is not exact for its device, a few words (``MemoryAccount.exactness``: e.g. a cuda step of an
    architecture no GPU ran, or for a GPU whose kernels were not measured), or None."""
    how = m.exactness
    return None if how is None or how.exact else how.reason


def exact(m: MemoryAccount) -> str:
    """The title of the implementation-exact tables: ``EXACT`` for our model, else the class predicted; for
    a step not exact on its device, "not exact on <device>" instead of "exact"."""
    if m.impl == "course" and not inexact(m):
        return EXACT
    how = f"not exact on {m.device}" if inexact(m) else "exact"
    who = "our live model" if m.impl == "course" else model_class(m.config, m.impl)
    return f"This implementation ({who}, {how})"


def setup_label(m: MemoryAccount) -> str:
    """The setup's short name with the attention as the implementation calls it: 'eager+none+fp32+foreach'
    for transformers' eager path, 'naive+none+fp32+foreach' for ours."""
    s = m.setup
    attention = ATTENTION_WORDS[m.impl][s.attention].split()[0]
    return f"{attention}+{s.checkpoint}+{s.precision}+{s.optimizer}"


def prediction_words(m: MemoryAccount) -> str:
    """The header's word on the step predicted: exact for the device, not exact (see Conventions), or none."""
    if m.step is None:
        return "model states only (see the note)"
    if inexact(m):
        return f"prediction for {m.device}, not exact there: {inexact(m)} (see Conventions; meta and cpu: --measure)"
    return f"exact prediction for {m.device}"


def _rel(measured: int | None, predicted: int) -> float | None:
    return None if not measured else (predicted - measured) / measured


def course_table(m: MemoryAccount) -> Table:
    a, b = m.course_linear
    c = m.course
    rows = [
        ("parameters (fp32)", "4·N", c.parameters, fmt_bytes(c.parameters)),
        ("gradients (fp32)", "4·N", c.gradients, fmt_bytes(c.gradients)),
        ("AdamW m and v (fp32)", "8·N", c.optimizer, fmt_bytes(c.optimizer)),
        (f"activations at B = {m.batch:,} (the handout's list, fp32)", "a·B", c.activations, fmt_bytes(c.activations)),
        (f"peak at B = {m.batch:,}", "a·B + b", c.total, fmt_bytes(c.total)),
        ("a: bytes per sequence", "a", a, fmt_bytes(a)),
        ("b: model states", "b = 16·N", b, fmt_bytes(b)),
        (f"largest batch in {fmt_bytes(m.budget)}", "⌊(budget − b) / a⌋", m.course_max_batch, "sequences"),
    ]
    return Table(
        f"{COURSE}: peak = a·B + b",
        [Column("quantity"), Column("formula"), Column("value", "int"), Column("size")],
        rows,
        [
            (
                "The answer to adamwAccounting (a) and (b): a bookkeeping convention (every tensor fp32, the "
                "handout's activations), not a measurement of any model."
            )
        ],
    )


def states_table(m: MemoryAccount) -> Table:
    rows = [(it.label, it.total, fmt_bytes(it.total)) for it in m.states]
    rows.append(
        (
            f"AdamW step temporaries ({m.optimizer}, during the step only)",
            m.step_temporaries,
            fmt_bytes(m.step_temporaries),
        )
    )
    rows.append(
        (
            f"AdamW step counters on {m.device} (4 bytes per parameter tensor"
            + (f"; {m.optimizer} keeps them on the CPU)" if m.device != "cpu" and m.optimizer != "fused" else ")"),
            m.step_counters,
            fmt_bytes(m.step_counters),
        )
    )
    return Table(
        f"{exact(m)}: model states ({m.dtype}; gradients and AdamW moments in the parameter dtype, as torch.optim.AdamW)",
        [Column("component"), Column("bytes", "int"), Column("size")],
        rows,
    )


def saved_table(m: MemoryAccount) -> Table:
    table = breakdown_table(
        f"{exact(m)}: activations saved for backward at B = {m.batch:,} (bytes)", m.saved, m.config.num_layers
    )
    table.columns = [
        *BREAKDOWN_COLUMNS[:2],
        Column("per layer", "int"),
        Column("bytes", "int"),
        Column("share", "share"),
    ]
    return table


def _position_buffers(m: MemoryAccount) -> str:
    """The baseline's position buffers: our RoPE tables; transformers' rotary inverse frequencies (it computes
    the tables in each forward); none for learned positions (a parameter)."""
    if m.config.positions != "rope":
        return ""
    return "RoPE tables, " if m.impl == "course" else "RoPE inverse frequencies, "


def phase_table(m: MemoryAccount) -> Table:
    """Each phase: the plain run (what a user gets), the traced run (what the storage tracker sees),
    and, if measured, the measurement beside the prediction it compares with."""
    plain, traced, got = m.step, m.step_traced or m.step, m.measured
    where = f"measured on {m.measured_on} ({m.measured_method})" if got else "not measured"
    ref = m.compared if got else plain
    rows = [
        (
            f"baseline: params, AdamW m/v (and step counters), {_position_buffers(m)}tokens",
            plain.baseline,
            traced.baseline,
            got and got.baseline,
            ref.baseline,
        )
    ]
    for name in plain.phases():
        p, t, g = plain.phase(name), traced.phase(name), got.phase(name) if got else None
        r = ref.phase(name)
        rows.append((f"{PHASE_LABELS[name]}: peak", p.peak, t.peak, g and g.peak, r.peak))
        rows.append((f"{PHASE_LABELS[name]}: end", p.end, t.end, g and g.end, r.end))
    rows = [(label, p, t, g, _rel(g, r), fmt_bytes(p), fmt_bytes(t)) for label, p, t, g, r in rows]
    compared = "the traced run" if m.measured_method == "tracker" else "the plain run"
    notes = [
        (
            f"step peak {fmt_bytes(plain.peak)} ({plain.peak_phase}), plain run; steady state (AdamW state exists), "
            f"{setup_label(m)}, the step's gradients are freed by zero_grad(set_to_none=True)"
        ),
        (
            "plain: no dispatch mode (a GPU run; on cpu, the CPU allocator's own events); traced: under any "
            "dispatch mode or on meta, autograd copies where a plain run works in place (gradient "
            "accumulation, gather and index backward): traced − plain = "
            + ", ".join(f"{n} {fmt_bytes(v)}" for n, v in (m.gap or {}).items())
        ),
    ]
    if got:
        notes.append(f"rel. error: the measurement against {compared}")
    if got and got.overheads:
        notes.append(
            "measured on cuda: the bytes the step's tensors requested from the caching allocator (requested_bytes), "
            "less the cuBLAS workspaces; also held on the device, not in the figures: "
            + "; ".join(f"{k}: {fmt_bytes(v)}" for k, v in got.overheads)
        )
    return Table(
        f"{exact(m)}: training step by phase at B = {m.batch:,}, predicted for {m.device} vs {where}",
        [
            Column("phase"),
            Column("plain bytes", "int"),
            Column("traced bytes", "int"),
            Column("measured bytes", "int"),
            Column("rel. error", "pct"),
            Column("plain"),
            Column("traced"),
        ],
        rows,
        notes,
    )


def lines_table(m: MemoryAccount) -> Table:
    rows = []
    for name, phase in m.peak_lines.phases().items():
        for line in phase.lines:
            rows.append((name, batch_span(line), line.a, line.b, fmt_bytes(line.a), fmt_bytes(line.b)))
    for name, line in m.peak_lines.step_lines():
        rows.append((f"step (set by {name})", batch_span(line), line.a, line.b, fmt_bytes(line.a), fmt_bytes(line.b)))
    at = m.peak_lines.phase_at(m.batch)
    return Table(
        f"{exact(m)}: peak(B) = max over phases of a_i·B + b_i, at context {m.seq:,}",
        [
            Column("phase"),
            Column("batches"),
            Column("a (bytes per sequence)", "int"),
            Column("b (bytes)", "int"),
            Column("a"),
            Column("b"),
        ],
        rows,
        [
            (
                "Each line equals the replayed peak exactly for its batches; an open range (B ≥ n) holds for "
                "every larger batch (no other candidate line of the replay overtakes it)."
            ),
            f"At B = {m.batch:,} the {at} phase sets the peak: {fmt_bytes(m.peak_lines.at(m.batch))}.",
        ],
    )


def capacity_table(m: MemoryAccount) -> Table:
    return Table(
        f"{exact(m)}: capacity for a budget of {fmt_bytes(m.budget)}",
        [Column("quantity"), Column("value", "int"), Column("note")],
        [
            (
                "largest batch that fits",
                m.max_batch,
                "not given: the peak is no line in B here (see the note)"
                if m.max_batch is None
                else ("" if m.max_batch else f"{NONE_FITS}: ")
                + f"at context {m.seq:,}; smallest ⌊(budget − b_i) / a_i⌋",
            ),
            (
                "largest context that fits at batch 1",
                m.max_context,
                ("tokens" if m.max_context else NONE_FITS)
                + (
                    ": every learned position (max_position_embeddings; the model runs no longer context)"
                    if m.max_context and m.max_context == context_limit(m.config)
                    else " (exact search over the replay)"
                ),
            ),
        ],
    )


def compare_table(m: MemoryAccount) -> Table:
    return Table(
        f"Activation models at B = {m.batch:,}, S = {m.seq:,} (for comparison)",
        [Column("model"), Column("activation bytes", "int"), Column("size")],
        [
            ("this implementation (saved for backward)", m.saved.total, fmt_bytes(m.saved.total)),
            (
                "course convention (CS336 adamwAccounting, fp32, logits twice)",
                m.course.activations,
                fmt_bytes(m.course.activations),
            ),
            ("Korthikanti et al. 2022, sbh(34 + 5as/h) (16-bit, dropout)", m.korthikanti, fmt_bytes(m.korthikanti)),
        ],
    )


def inference_table(m: MemoryAccount) -> Table:
    weights = m.states["parameters"].total
    return Table(
        "Inference (no gradients or optimizer)",
        [Column("item"), Column("bytes", "int"), Column("size")],
        [
            (f"weights ({m.dtype})", weights, fmt_bytes(weights)),
            (f"KV cache at S={m.seq:,}, B={m.batch} ({m.dtype})", m.kv_cache, fmt_bytes(m.kv_cache)),
            ("total", weights + m.kv_cache, fmt_bytes(weights + m.kv_cache)),
        ],
    )


RECOMPUTE = {
    "none": "no checkpointing: every block's tensors are kept until its backward",
    "selective": "selective checkpointing keeps each block's matmul outputs and recomputes the rest in backward",
    "full": (
        "full checkpointing keeps each block's input only and reruns one block at a time in backward, so a "
        "block's own tensors are in the backward transient, not in that table"
    ),
}


def largest_saved(m: MemoryAccount, n: int = 3) -> str:
    """The ``n`` largest components of the activations saved for backward (``m.saved``), with their
    shares, in the words of the saved-activations table."""
    total = m.saved.total
    parts = sorted(m.saved, key=lambda it: -it.total)[:n]
    return ", ".join(f"{it.label} {it.total / total:.1%}" for it in parts)


def difference_note(m: MemoryAccount) -> str:
    """Why the course's a and this implementation's a_i differ, in one note built from the result: the
    per-sequence slope of the forward or backward line (whichever grows faster) at the requested batch,
    the largest saved components at that batch (``m.saved``), and what the setup's checkpointing keeps."""
    a = m.course_linear[0]
    phase, line = max(((p, m.peak_lines.phase(p).line_at(m.batch)) for p in ("forward", "backward")),
                      key=lambda pl: pl[1].a)  # fmt: skip
    return (
        f"Note: the course's a = {fmt_bytes(a)} per sequence is a convention (the handout's list of "
        f"activations, fp32); this implementation's a = {fmt_bytes(line.a)} per sequence (the {phase} "
        f"line at B = {m.batch:,}) is what our live model allocates under {m.setup.label}: of the "
        f"{fmt_bytes(m.saved.total)} it saves for backward at B = {m.batch:,}, the largest parts are "
        f"{largest_saved(m)} (the saved-activations table); {RECOMPUTE[m.setup.checkpoint]}; and the line also "
        f"counts the transient tensors at the {phase} phase's highest point.  Copy the course answer for the "
        "assignment; use this implementation's lines to plan a run of this model."
    )


def budget_verdict(need: int, budget: int) -> str:
    """'fits the budget, X to spare' or 'does NOT fit the budget: X over': the one wording of memory's
    verdict, with and without a layout."""
    spare = budget - need
    return (
        f"fits the budget, {fmt_bytes(spare)} to spare"
        if spare >= 0
        else f"does NOT fit the budget: {fmt_bytes(-spare)} over"
    )


def fit_line(m: MemoryAccount) -> str:
    """The header's verdict on the requested batch against --budget, in the layout view's words ("fits
    the budget" / "does NOT fit the budget"), with the margin; where the step is not modelled, what the
    exact model states alone say (``MemoryAccount.fits``)."""
    if m.step is not None:
        return (
            f"batch {m.batch:,}: step peak {fmt_bytes(m.step.peak)} ({m.step.peak_phase}) "
            + budget_verdict(m.step.peak, m.budget)
            + ("" if m.max_batch is None else f"; largest batch that fits: {f'{m.max_batch:,}' if m.max_batch else NONE_FITS}")
        )  # fmt: skip
    states, spare = m.states.total, m.budget - m.states.total
    if m.fits is False:
        return (
            f"batch {m.batch:,}: the model states alone (parameters, gradients, AdamW m and v; exact) are "
            f"{fmt_bytes(states)}: {budget_verdict(states, m.budget)}; the step peak is not predicted"
        )
    return (
        f"batch {m.batch:,}: whether it fits the budget is not known: the step peak is not predicted (see the "
        f"note); the model states alone (exact) are {fmt_bytes(states)}, {fmt_bytes(spare)} under it"
    )


def states_only_note(m: MemoryAccount) -> str:
    """Why only the model states are given: what the implementation's predictor does not model, and the
    implementation that does predict the step, if any."""
    missing = ", ".join(m.not_modelled)
    who = (
        f"Our live model (TransformerLM) does not run {missing}"
        if m.impl == "course"
        else f"The {m.impl} program ({model_class(m.config, m.impl)}) does not model {missing} yet"
    )
    other = (
        "  --impl course predicts our own model's step for this config."
        if m.impl != "course" and not step_unmodelled(m.config, m.setup, "course")
        else ""
    )
    return (
        f"{who}: activations, phase peaks and capacity are not predicted for this model (and the "
        "course convention describes the course model only). The model states above are exact for it, every "
        f"expert included.{other}"
    )


def exact_convention(m: MemoryAccount) -> str:
    """The footer's line on what 'implementation-exact' means for the predictor used."""
    if m.step is None:
        return (
            "  - implementation-exact: the model states only (parameters, gradients, AdamW m and v, every expert), "
            f"counted from the config's parameter shapes for {model_class(m.config, m.impl)}; the step is not "
            "predicted (see the note)."
        )
    how = m.exactness.words
    if m.predicted_by == "ops":
        return (
            f"  - implementation-exact: {program_label(m.config, m.impl, m.setup)}, simulated tensor by tensor with "
            f"torch {CPU_TORCH}'s autograd order (analytic/ops); --measure meta runs the implementation's own model under "
            f"the storage tracker beside it.  On {m.device}: {how}."
        )
    cuda = f"  On cuda: {how}; the bytes the tensors request from the caching allocator." if m.device == "cuda" else ""
    return (
        "  - implementation-exact: the allocation sequence of our live model's ops, replayed (analytic/replay.py); "
        f"equal to the storage tracker's count on meta and CPU byte for byte (torch {CPU_TORCH}).{cuda}"
    )


def memory_view(m: MemoryAccount) -> View:
    header = [
        describe_config(m.config),
        (
            f"context {m.seq:,} · batch {m.batch:,} · {ATTENTION_WORDS[m.impl][m.setup.attention]} · checkpoint "
            f"{m.setup.checkpoint} · {m.setup.precision} · AdamW ({m.optimizer}) · {prediction_words(m)}"
        ),
        f"--impl {m.impl}: {program_label(m.config, m.impl, m.setup)}",
    ]
    header.append(fit_line(m))
    header.append(m.budget_basis.rule)
    if m.flops is not None:
        header.append(
            f"step FLOPs: model {m.flops.model:,} (3 × forward) · hardware {m.flops.hardware:,} "
            "(+ checkpoint recompute and the fused backward's extra QKᵀ)"
        )
    if m.step is None:  # an architecture the implementation's predictors do not model: the exact model states only
        tables = [states_table(m), inference_table(m)]
        notes = [states_only_note(m), ""]
    elif m.course is None:  # predicted, but not the course architecture (a mixture of experts, GPT-2, ...)
        tables = [
            states_table(m),
            *([saved_table(m)] if m.saved is not None else []),
            phase_table(m),
            *([lines_table(m)] if m.peak_lines else []),
            capacity_table(m),
            inference_table(m),
        ]
        notes = ["The course convention (CS336 adamwAccounting) describes the course model only: not shown.", ""]
        if m.no_lines:
            notes[1:1] = [
                (
                    f"No peak lines in the batch for {m.no_lines}: the experts' split differs from batch to batch,"
                    f" so the step above is exact at B = {m.batch:,} only (and no largest batch is given)."
                ),
                "",
            ]
    elif m.saved is None:  # the op library's program: phase peaks and lines, no per-component activations
        tables = [course_table(m), states_table(m), phase_table(m), lines_table(m), capacity_table(m)]
        notes = [
            (
                f"Note: the course's a = {fmt_bytes(m.course_linear[0])} per sequence is a convention (the handout's "
                f"list of activations, fp32); the lines above are what {model_class(m.config, m.impl)} allocates "
                f"under {setup_label(m)}.  Copy the course answer for the assignment; use these lines to plan a run."
            ),
            "",
        ]
        tables.append(inference_table(m))
    else:
        tables = [
            course_table(m),
            states_table(m),
            saved_table(m),
            phase_table(m),
            lines_table(m),
            capacity_table(m),
            compare_table(m),
            inference_table(m),
        ]
        notes = [difference_note(m), ""]
    footer = [
        *notes,
        "Conventions:",
        exact_convention(m),
        (
            "  - AdamW's step counters count on the device that holds them: on the CPU for the for-loop and "
            "foreach implementations, on the parameters' device for fused."
        ),
        (
            "  - CUDA adds allocator rounding (512-byte blocks, unsplit blocks) and cuBLAS workspaces (64 MiB with a "
            f"backward on {CUDA.gpu}), not in these figures; meta and CPU do not."
        ),
        "  - GB = 10^9 bytes, GiB = 2^30 bytes.",
    ]
    return View(header, tables, footer)
