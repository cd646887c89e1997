"""Tables and files of a sweep: CSV and JSON with every column, markdown with the key ones."""

from __future__ import annotations

import re
from pathlib import Path

from ..config import AccountingError
from ..implementations import ATTENTION_WORDS
from ..output import SAFE_NAME, atomic_dir, check_output_dir, write_atomic, write_json
from ..sweep import GROUPS, Sweep
from ..units import fmt_bytes
from .tables import Column, Table, View, render_markdown, render_records_csv
from .words import fits_words

SUMMARY = [
    Column("context", "int"),
    Column("forward FLOPs", "int"),
    *[Column(g, "share") for g in GROUPS],
    Column("train step FLOPs", "int"),
    Column("hardware step FLOPs", "int"),
    Column("step peak bytes", "int"),
    Column("measured FLOPs", "int"),
    Column("measured peak", "int"),
]


def sweep_view(s: Sweep) -> View:
    """The sweep on screen: one table per model; mismatches (cross-check FLOPs, measured peaks on meta), if any, in the footer."""
    footer = ["MISMATCHES (cross-check, measured memory):", *[f"  - {m}" for m in s.mismatches]] if s.mismatches else []
    if s.skipped:
        footer += ["Contexts left out (the model cannot run them):", *[f"  - {line}" for line in s.skipped]]
    return View([], sweep_tables(s), footer)


def setup_words(setup, impl: str = "course") -> str:
    """'eager attention, checkpoint full, amp-bf16, AdamW foreach': the training setup in a title, the attention
    named as the implementation calls it (``implementations.ATTENTION_WORDS``)."""
    attention = ATTENTION_WORDS[impl][setup.attention]
    return f"{attention}, checkpoint {setup.checkpoint}, {setup.precision}, AdamW {setup.optimizer}"


def sweep_tables(s: Sweep) -> list[Table]:
    """One table per model: FLOPs, shares by group, training FLOPs, peak memory, measurements."""
    tables = []
    for model in dict.fromkeys(r["model"] for r in s.rows):
        rows = [r for r in s.rows if r["model"] == model]
        tables.append(
            Table(
                f"{model} ({rows[0]['params']:,} parameters), --impl {rows[0]['impl']}, batch {s.batch:,}, "
                f"{setup_words(s.setup, rows[0]['impl'])}",
                SUMMARY,
                [
                    (
                        r["context"],
                        r["flops:total"],
                        *[r[f"share:{g}"] for g in GROUPS],
                        r["flops:train_step"],
                        r["flops:hardware_step"],
                        r["mem:peak"],
                        r["measured:flops"],
                        r["measured:peak"],
                    )
                    for r in rows
                ],
                _largest_context(rows[0]["mem:max_context"], s.batch, rows[0]["impl"], rows[0]["mem:budget"]),
            )
        )
    return tables


def _largest_context(tokens: int | None, batch: int, impl: str, budget: int) -> list[str]:
    """The table's note: the largest context whose plain step fits the budget (``mem:max_context``), and the
    budget's bytes (the GPU's CUDA total − allowance, or --budget: the rule of ``memory``)."""
    if tokens is None:
        why = f"the {impl} program does not model this model; lm-account memory says why"
        return [f"largest context that fits the budget: not predicted ({why})"]
    rule = f"the budget of {fmt_bytes(budget)} per GPU (--gpu, --allowance or --budget)"
    return [f"largest context whose step peak fits {rule} at batch {batch:,}: {fits_words(tokens)}"]


PLOT_STEMS = ("flops_shares", "flops_vs_context", "predicted_vs_measured", "model_comparison")
SWEEP_FILES = (
    r"sweep\.(csv|json|md)|(" + "|".join(PLOT_STEMS) + rf"|memory_vs_context_{SAFE_NAME})\.(png|svg)"
    r"|\.[A-Za-z0-9._+-]+\.[a-z0-9_]{8}\.(csv|json|md|png|svg)"
)
"""The files a sweep writes (the last alternative: a temporary file left by a killed older version)."""
_SWEEP_RE = re.compile(SWEEP_FILES)


def is_sweep_file(rel: str) -> bool:
    """True for a path (relative to the sweep folder) that ``write_sweep`` writes."""
    return _SWEEP_RE.fullmatch(rel) is not None


def is_figure(rel: str) -> bool:
    return is_sweep_file(rel) and rel.endswith((".png", ".svg"))


def check_sweep_out(out: Path | str) -> Path:
    """Refuse a sweep ``--out`` before the sweep runs (``write_sweep`` checks again under its lock).

    A sweep replaces its whole folder, so the folder must be new, empty, or an earlier sweep's
    (every file one ``write_sweep`` writes: ``is_sweep_file``).  A sweep folder inside a report set
    (its parent has ``assignment.md`` and ``answers.json``, as ``reports/sweep`` does) is refused
    too: that set is regenerated as a whole by ``lm-account report``."""
    path = check_output_dir(out)  # the path itself first; what the folder holds below
    if (path.parent / "assignment.md").is_file() and (path.parent / "answers.json").is_file():
        raise AccountingError(
            f"refusing to write a sweep into {out}: it is part of the report in {path.parent} "
            "(regenerate that with `lm-account report`); choose another --out"
        )
    return check_output_dir(out, is_sweep_file)


def write_sweep(
    s: Sweep, out: Path, budget: int, budget_label: str, plots: bool = True, atomic: bool = True
) -> list[Path]:
    """sweep.csv, sweep.json, sweep.md and (``plots``) the figures (``plots.plot_all``).

    With ``atomic`` (the default) the set is written into a temporary folder beside ``out`` and
    swapped in at the end (``output.atomic_dir``): ``out`` must be new, empty or an earlier sweep's
    (``check_sweep_out``); a run without ``plots`` keeps the earlier figures.  ``atomic=False``
    writes straight into ``out``, for a caller that already writes into a temporary set (``report``).
    The paths returned are the final ones, under ``out``."""
    out = Path(out)
    if not atomic:
        return _write_sweep_files(s, out, budget, budget_label, plots)
    check_sweep_out(out)
    with atomic_dir(out, owns=is_sweep_file, keep=None if plots else is_figure) as tmp:
        written = _write_sweep_files(s, tmp, budget, budget_label, plots)
    return [out / p.relative_to(tmp) for p in written]


SWEEP_NOTE = (
    "Context sweep (generated by lm-accounting). Forward FLOPs count matmuls (2mnp, full S² "
    "attention); hardware step FLOPs add the recompute of checkpointing and fused attention; the step "
    "peak is the implementation-exact training-step peak in bytes of the plain run (no dispatch mode, "
    "what a GPU user gets; mem:peak_traced is what the storage tracker sees); every figure is in sweep.csv, "
    "one per row (model, context, batch, setup, quantity, value, unit)."
)


def _write_sweep_files(s: Sweep, out: Path, budget: int, budget_label: str, plots: bool) -> list[Path]:
    paths = [
        write_atomic(out / "sweep.csv", render_records_csv(s.records())),
        write_json(out / "sweep.json", s.to_dict()),
        write_atomic(out / "sweep.md", render_markdown(sweep_tables(s), [SWEEP_NOTE])),
    ]
    if plots:
        from .plots import plot_all

        paths += plot_all(s.to_frame(), out, budget_bytes=budget, budget_label=budget_label)
    return paths
