"""Tables of the course answers, built from ``Answers`` (shared by the markdown and the table files)."""

from __future__ import annotations

from ..analytic.memory_report import batch_span
from ..sweep import GROUPS
from ..views.memory import COURSE, EXACT
from ..views.tables import Column, Table, render_markdown
from .answers import BUDGETS, LONG, TRAIN, Answers


def _md(*tables: Table) -> str:
    """Tables to embed in the answers: bold captions, not headings."""
    return render_markdown(list(tables), caption=True).strip()


def size_table(ans: Answers) -> Table:
    rows = []
    for name, acc in ans.sizes.items():
        g = acc.forward.groups()
        rows.append((name, acc.params.total, acc.forward.total, *[g[k] / acc.forward.total for k in GROUPS]))
    return Table(
        "Forward FLOPs by component group at S = 1,024 (d_ff = 4·d_model)",
        [
            Column("model"),
            Column("parameters", "int"),
            Column("forward FLOPs", "int"),
            *[Column(k, "share") for k in GROUPS],
        ],
        rows,
    )


def long_context_table(ans: Answers) -> Table:
    a, b = ans.at_1024.forward, ans.at_long.forward
    rows = [
        (it.label, it.total, b[it.key].total, b[it.key].total // it.total, a.share(it.key), b.share(it.key)) for it in a
    ]
    rows.append(("total", a.total, b.total, None, 1.0, 1.0))
    return Table(
        f"GPT-2 XL forward FLOPs at S = 1,024 and S = {LONG:,}",
        [
            Column("component"),
            Column("S = 1,024", "int"),
            Column(f"S = {LONG:,}", "int"),
            Column("growth ×", "int"),
            Column("share @1,024", "share"),
            Column(f"share @{LONG:,}", "share"),
        ],
        rows,
    )


def convention_table(ans: Answers) -> Table:
    rows = [
        (r["logits"], r["ffn_matrices"], r["a"], r["b"], *[r[f"max batch ({u})"] for u in BUDGETS])
        for r in ans.course_conventions
    ]
    return Table(
        f"{COURSE}: adamwAccounting (b) under each convention (fp32; a = bytes per sequence, b = 16·N)",
        [
            Column("cross-entropy activations"),
            Column("FFN matrices in N", "int"),
            Column("a", "int"),
            Column("b", "int"),
            *[Column(f"max batch in {u}", "int") for u in BUDGETS],
        ],
        rows,
    )


def adamw_table(ans: Answers) -> Table:
    return Table(
        "adamwAccounting (c): AdamW FLOPs per step for GPT-2 XL under each counting convention",
        [
            Column("convention"),
            Column("FLOPs / parameter", "int"),
            Column("FLOPs per step", "int"),
            Column("how it counts"),
        ],
        [(r["convention"], r["flops_per_param"], r["flops_per_step"], r["derivation"]) for r in ans.adamw],
    )


def training_table(ans: Answers) -> Table:
    return Table(
        f"adamwAccounting (d): {TRAIN['steps']:,} steps, batch {TRAIN['batch']:,}, context {TRAIN['seq']:,}, "
        f"one A100, MFU {TRAIN['mfu']:.0%}",
        [
            Column("step FLOPs convention"),
            Column("FLOPs per step", "int"),
            Column("total FLOPs", "int"),
            Column("peak FLOP/s", "int"),
            Column("days", "float"),
        ],
        [
            (r["convention"], r["flops_per_step"], r["total_flops"], int(r["peak_flops"]), r["days"])
            for r in ans.training
        ],
    )


def exact_memory_table(ans: Answers) -> Table:
    step, got = ans.exact_step, ans.measured_step
    rows = [("baseline", step.baseline, got and got.baseline)]
    for phase, p in step.phases().items():
        rows.append((f"{phase} peak", p.peak, got and got.phase(phase).peak))
    return Table(
        f"{EXACT}: GPT-2 XL, B = 1, S = 1,024, fp32, AdamW foreach: prediction vs meta",
        [Column("phase"), Column("predicted bytes", "int"), Column("measured on meta", "int")],
        rows,
    )


def exact_lines_table(ans: Answers) -> Table:
    """Each phase's peak as exact lines in B, and which phase sets the step's peak where."""
    lines = ans.exact_lines
    rows = [(name, batch_span(line), line.a, line.b) for name, phase in lines.phases().items() for line in phase.lines]
    rows += [(f"step (set by {name})", batch_span(line), line.a, line.b) for name, line in lines.step_lines()]
    return Table(
        f"{EXACT}: GPT-2 XL, S = 1,024, fp32, AdamW foreach: peak(B) = max over phases of a_i·B + b_i",
        [Column("phase"), Column("batches"), Column("a (bytes per sequence)", "int"), Column("b (bytes)", "int")],
        rows,
    )
