"""The view of a ``CrossCheck``: analytic vs fvcore vs FlopCounterMode, component by component."""

from __future__ import annotations

import textwrap

from ..measure.crosscheck import CrossCheck
from .account import describe_config
from .tables import Column, Table, View

# Views and metadata ops move no data and do no arithmetic; listing them would bury the rest.
VIEW_OPS = frozenset(
    {
        "view",
        "_unsafe_view",
        "t",
        "transpose",
        "expand",
        "slice",
        "detach",
        "unsqueeze",
        "squeeze",
        "permute",
        "select",
        "alias",
        "as_strided",
        "reshape",
        "_reshape_alias",
        "lift_fresh",
    }
)


def _status(diff: int) -> str:
    return "ok" if diff == 0 else "MISMATCH"


def crosscheck_view(cc: CrossCheck) -> View:
    header = [
        describe_config(cc.config),
        f"context {cc.seq:,} · batch {cc.batch:,} · live model on '{cc.device}' · setup {cc.setup.label}",
    ]
    names = [c.counter for c in cc.counters]
    flop_cols = [
        Column("component"),
        Column("analytic", "int"),
        *[Column(n, "int") for n in names],
        Column("difference", "int"),
        Column("status"),
    ]
    rows = []
    for it in cc.forward:
        counted = [c.by_key.get(it.key, 0) for c in cc.counters]
        diff = max((abs(v - it.total) for v in counted), default=0)
        rows.append((it.key, it.total, *counted, diff, _status(diff)))
    counted_totals = [c.total for c in cc.counters]
    diff = max((abs(v - cc.forward.total) for v in counted_totals), default=0)
    rows.append(("total", cc.forward.total, *counted_totals, diff, _status(diff)))
    flops = Table("Forward FLOPs, matmuls (fvcore MACs × 2; exact match required)", flop_cols, rows)
    flops.notes = [f"{c.counter}: {c.note}" for c in cc.counters]

    prow = []
    for it in cc.params:
        live = cc.live_params.get(it.key, 0)
        prow.append((it.key, it.total, live, abs(live - it.total), _status(live - it.total)))
    live_total = sum(cc.live_params.values())
    prow.append(
        ("total", cc.params.total, live_total, abs(live_total - cc.params.total), _status(live_total - cc.params.total))
    )
    params = Table(
        "Parameters (live: named_parameters(), a tied weight counted once)",
        [
            Column("component"),
            Column("analytic", "int"),
            Column("live model", "int"),
            Column("difference", "int"),
            Column("status"),
        ],
        prow,
    )
    tables = [flops, params]
    if cc.backward is not None:
        fwd = cc.flop_counter.total
        bwd = cc.backward.total - fwd
        want, fwd_total = cc.expected_backward, cc.forward.total
        recompute = "" if want == 2 * fwd_total else " + recompute (hardware FLOPs of this setup)"
        tables.append(
            Table(
                "Backward FLOPs (FlopCounterMode, cross-entropy loss; per-module attribution of backward is "
                "not reliable in FlopCounterMode, so totals are compared)",
                [
                    Column("quantity"),
                    Column("analytic", "int"),
                    Column("FlopCounterMode", "int"),
                    Column("difference", "int"),
                    Column("status"),
                ],
                [
                    (f"backward = 2 × forward{recompute}", want, bwd, abs(bwd - want), _status(bwd - want)),
                    (
                        f"forward + backward = 3 × forward{recompute}",
                        fwd_total + want,
                        cc.backward.total,
                        abs(cc.backward.total - fwd_total - want),
                        _status(cc.backward.total - fwd_total - want),
                    ),
                ],
            )
        )
    skipped = []
    for c in [*cc.counters, *([cc.backward] if cc.backward else [])]:
        ops = ", ".join(
            f"{op} ×{n}" for op, n in sorted(c.skipped_ops.items()) if op.removeprefix("aten::") not in VIEW_OPS
        )
        for i, chunk in enumerate(textwrap.wrap(ops, 90) or ["(none)"]):
            skipped.append((c.counter if i == 0 else "", chunk))
    tables.append(
        Table(
            "Ops each counter did not count (0 FLOPs; elementwise work, views and copies)",
            [Column("counter"), Column("ops skipped (calls)")],
            skipped,
            ["view and metadata ops (view, transpose, expand, slice, detach, ...) are not listed"],
        )
    )
    problems = cc.mismatches()
    footer = (
        ["RESULT: all matmul FLOPs and parameters agree exactly."]
        if not problems
        else [f"RESULT: {len(problems)} mismatch(es):", *[f"  - {p}" for p in problems]]
    )
    return View(header, tables, footer)
