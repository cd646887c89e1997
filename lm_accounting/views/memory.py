"""Printable tables for the ``memory`` command: predicted vs measured, capacity, conventions."""

from __future__ import annotations

from typing import Any

from ..analytic.memory_report import MemoryAccount
from ..units import fmt_bytes
from .account import BREAKDOWN_COLUMNS, breakdown_table, describe_config
from .tables import Column, Table

PHASE_LABELS = {
    "forward": "forward (model + cross-entropy)",
    "backward": "backward",
    "optimizer_step": "AdamW step",
}


def _rel(measured: int | None, predicted: int) -> float | None:
    return None if not measured else (predicted - measured) / measured


def phase_table(m: MemoryAccount, measured: dict[str, Any] | None, where: str) -> Table:
    step = m.step
    rows = [("baseline: params, AdamW m/v, RoPE tables, tokens", step.baseline,
             measured and measured.baseline, _rel(measured and measured.baseline, step.baseline), None, None)]
    for name, pred in step.phases().items():
        got = measured.phase(name) if measured else None
        rows.append((f"{PHASE_LABELS[name]}: peak", pred.peak, got and got.peak, _rel(got and got.peak, pred.peak), None, None))
        rows.append((f"{PHASE_LABELS[name]}: end", pred.end, got and got.end, _rel(got and got.end, pred.end), None, None))
    rows = [(label, p, g, r, fmt_bytes(p), None if g is None else fmt_bytes(g)) for label, p, g, r, _, _ in rows]
    return Table(
        f"Training step by phase: predicted (implementation-exact) vs measured ({where})",
        [Column("phase"), Column("predicted bytes", "int"), Column("measured bytes", "int"),
         Column("rel. error", "pct"), Column("predicted"), Column("measured")],
        rows,
        [f"step peak {fmt_bytes(step.peak)}; steady state (AdamW state exists), optimizer '{m.optimizer}', "
         "the step's gradients are freed by zero_grad(set_to_none=True)"],
    )


def memory_tables(m: MemoryAccount, measured: dict[str, Any] | None = None,
                  where: str = "not measured") -> tuple[list[str], list[Table], list[str]]:
    cfg = m.config
    header = [describe_config(cfg),
              f"context {m.seq:,} · batch {m.batch:,} · {m.dtype} · AdamW ({m.optimizer}) · budget {fmt_bytes(m.budget)}"]
    states = Table(
        f"Model states ({m.dtype}; gradients and AdamW moments in the parameter dtype, as torch.optim.AdamW)",
        [Column("component"), Column("bytes", "int"), Column("size")],
        [(it.label, it.total, fmt_bytes(it.total)) for it in m.states]
        + [(f"AdamW step temporaries ({m.optimizer})", m.step_temporaries, fmt_bytes(m.step_temporaries))],
    )
    saved = breakdown_table("Activations saved for backward, implementation-exact (bytes)", m.saved, cfg.num_layers)
    saved.columns = [*BREAKDOWN_COLUMNS[:2], Column("per layer", "int"), Column("bytes", "int"), Column("share", "share")]
    a, b = m.course_linear
    compare = Table(
        "Other activation models (same B and S; for comparison, not predictions of this model)",
        [Column("model"), Column("activation bytes", "int"), Column("size")],
        [
            ("implementation-exact (this model, saved for backward)", m.saved.total, fmt_bytes(m.saved.total)),
            ("course convention (CS336 adamwAccounting, fp32, logits twice)", m.course.activations,
             fmt_bytes(m.course.activations)),
            ("Korthikanti et al. 2022, sbh(34 + 5as/h) (16-bit, dropout)", m.korthikanti, fmt_bytes(m.korthikanti)),
        ],
        [f"course peak = 16·N + activations = {fmt_bytes(m.course.total)}"],
    )
    cap = Table(
        f"Capacity for a budget of {fmt_bytes(m.budget)}",
        [Column("quantity"), Column("value", "int"), Column("note")],
        [
            ("peak = a·B + b: a (bytes per sequence)", m.linear.a, fmt_bytes(m.linear.a)),
            ("peak = a·B + b: b (bytes)", m.linear.b, f"{fmt_bytes(m.linear.b)}; exact up to B={m.linear.exact_to} at least"),
            ("largest batch that fits (exact model)", m.max_batch, f"at context {m.seq:,}"),
            ("largest context that fits at batch 1 (exact model)", m.max_context, "tokens"),
            ("course convention: a", a, fmt_bytes(a)),
            ("course convention: b = 16·N", b, fmt_bytes(b)),
            ("course convention: largest batch", m.course_max_batch, "floor((budget − b) / a)"),
        ],
    )
    weights = m.states["parameters"].total
    infer = Table(
        "Inference (no gradients or optimizer)",
        [Column("item"), Column("bytes", "int"), Column("size")],
        [(f"weights ({m.dtype})", weights, fmt_bytes(weights)),
         (f"KV cache at S={m.seq:,}, B={m.batch} ({m.dtype})", m.kv_cache, fmt_bytes(m.kv_cache)),
         ("total", weights + m.kv_cache, fmt_bytes(weights + m.kv_cache))],
    )
    footer = [
        "Conventions:",
        "  - implementation-exact: the allocation sequence of our live model's ops, replayed; "
        "equal to the storage tracker's count on meta byte for byte (torch 2.13).",
        "  - CUDA adds allocator rounding (512-byte blocks) and cuBLAS workspaces; meta and CPU do not.",
        "  - GB = 10^9 bytes, GiB = 2^30 bytes.",
    ]
    return header, [states, saved, phase_table(m, measured, where), compare, cap, infer], footer


def memory_records(m: MemoryAccount, measured: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Tidy rows (section, key, label, predicted, measured), all in bytes except the counts: the CSV form."""
    rows = [("model_states", it.key, it.label, it.total) for it in m.states]
    rows.append(("model_states", "adamw.step_temporaries", f"AdamW step temporaries ({m.optimizer})", m.step_temporaries))
    rows += [("activations_exact", it.key, it.label, it.total) for it in m.saved]
    out = [dict(section=s, key=k, label=label, predicted=v, measured=None) for s, k, label, v in rows]
    out.append(dict(section="step", key="baseline", label="baseline", predicted=m.step.baseline,
                    measured=measured and measured.baseline))
    for name, p in m.step.phases().items():
        got = measured.phase(name) if measured else None
        out.append(dict(section="step", key=f"{name}.peak", label=f"{name} peak", predicted=p.peak, measured=got and got.peak))
        out.append(dict(section="step", key=f"{name}.end", label=f"{name} end", predicted=p.end, measured=got and got.end))
    a, b = m.course_linear
    for key, label, value in (
        ("a", "peak = a·B + b: a (bytes)", m.linear.a), ("b", "peak = a·B + b: b (bytes)", m.linear.b),
        ("max_batch", "largest batch that fits (count)", m.max_batch),
        ("max_context", "largest context at batch 1 (tokens)", m.max_context),
        ("course.a", "course convention a (bytes)", a), ("course.b", "course convention b (bytes)", b),
        ("course.max_batch", "course convention largest batch (count)", m.course_max_batch),
        ("course.activations", "course convention activations (bytes)", m.course.activations),
        ("korthikanti.activations", "Korthikanti et al. activations (bytes)", m.korthikanti),
        ("inference.kv_cache", f"KV cache ({m.dtype}, bytes)", m.kv_cache),
    ):
        out.append(dict(section="capacity", key=key, label=label, predicted=value, measured=None))
    return out
