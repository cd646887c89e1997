"""A tiny table type and its renderers: aligned text, markdown and CSV (JSON is ``to_dict``).

Cells hold raw values (exact ints, floats, strings); formatting happens only here,
when printing, according to the column's kind.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..units import fmt_bytes, fmt_share


@dataclass(frozen=True)
class Column:
    name: str
    kind: str = "str"  # str | int | share | pct | bytes | float


@dataclass
class Table:
    title: str
    columns: Sequence[Column]
    rows: list[tuple[Any, ...]]
    notes: list[str] = field(default_factory=list)


@dataclass
class View:
    """What a result looks like on screen: header lines, tables, footer lines."""

    header: list[str]
    tables: list[Table]
    footer: list[str] = field(default_factory=list)


def fmt_cell(value: Any, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "int":
        return f"{value:,}"
    if kind == "share":
        return fmt_share(value)
    if kind == "bytes":
        return fmt_bytes(value)
    if kind == "pct":
        return f"{100 * value:+.4f}%"
    if kind == "float":
        return f"{value:,.3f}"
    return str(value)


def _cells(table: Table) -> list[list[str]]:
    return [[fmt_cell(v, c.kind) for v, c in zip(row, table.columns)] for row in table.rows]


def render_text(tables: Sequence[Table], header: Sequence[str] = (), footer: Sequence[str] = (),
                width: int | None = None) -> str:
    out = list(header)
    for table in tables:
        cells = _cells(table)
        widths = [max([len(c.name)] + [len(r[i]) for r in cells]) for i, c in enumerate(table.columns)]
        right = [c.kind != "str" for c in table.columns]

        def line(values: Sequence[str]) -> str:
            parts = [v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right)]
            return "  " + "  ".join(parts).rstrip()

        out += ["", table.title, line([c.name for c in table.columns]), "  " + "  ".join("-" * w for w in widths)]
        out += [line(r) for r in cells]
        out += [f"  {note}" for note in table.notes]
    if footer:
        out += ["", *footer]
    return "\n".join(out) + "\n"


def render_markdown(tables: Sequence[Table], header: Sequence[str] = (), footer: Sequence[str] = (),
                    caption: bool = False) -> str:
    """Markdown tables, each under a ``###`` heading, or (``caption``) a bold caption line."""
    out = ["  \n".join(header)] if header else []
    for table in tables:
        right = [c.kind != "str" for c in table.columns]
        out += ["", f"**{table.title}**" if caption else f"### {table.title}", ""]
        out.append("| " + " | ".join(c.name for c in table.columns) + " |")
        out.append("|" + "|".join("---:" if r else "---" for r in right) + "|")
        out += ["| " + " | ".join(_md_escape(v) for v in r) + " |" for r in _cells(table)]
        if table.notes:
            out += ["", *[f"- {n}" for n in table.notes]]
    if footer:
        out += ["", *footer]
    return "\n".join(out) + "\n"


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("*", "\\*")


def render_csv(tables: Sequence[Table]) -> str:
    """One CSV: a ``section`` column (the table title) plus the union of all tables' columns."""
    names: list[str] = []
    for table in tables:
        names += [c.name for c in table.columns if c.name not in names]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["section", *names])
    for table in tables:
        index = {c.name: i for i, c in enumerate(table.columns)}
        for row in table.rows:
            writer.writerow([table.title, *("" if n not in index or row[index[n]] is None else row[index[n]] for n in names)])
    return buf.getvalue()


def render_records_csv(records: Sequence[dict[str, Any]]) -> str:
    """Tidy rows -> CSV; the header is the union of their keys in first-seen order (None -> empty)."""
    buf = io.StringIO()
    if records:
        names = list(dict.fromkeys(k for r in records for k in r))
        writer = csv.DictWriter(buf, fieldnames=names, restval="", lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in records)
    return buf.getvalue()
