"""A tiny table type and its renderers: aligned text, markdown and CSV (JSON is ``to_dict``).

Cells hold raw values (exact ints, floats, strings); formatting happens only here,
when printing, according to the column's kind.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

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
    return [[fmt_cell(v, c.kind) for v, c in zip(row, table.columns, strict=False)] for row in table.rows]


def render_text(
    tables: Sequence[Table], header: Sequence[str] = (), footer: Sequence[str] = (), width: int | None = None
) -> str:
    """Aligned plain-text tables (rich, no colour, no borders).  With ``width`` (a terminal's
    columns), text columns wrap and headers and notes fold so that no line is wider; without it
    (a pipe or a file) nothing wraps, one row per line, for grep and diff."""
    from rich import box
    from rich.console import Console
    from rich.table import Table as RichTable

    console = Console(
        file=io.StringIO(),
        width=width or 100_000,
        color_system=None,
        highlight=False,
        emoji=False,
        markup=False,
        soft_wrap=width is None,
    )
    for line in header:
        console.print(line)
    for i, table in enumerate(tables):
        if header or i:
            console.print()
        console.print(table.title)
        grid = RichTable(
            box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 1), collapse_padding=True
        )
        for i, column in enumerate(table.columns):
            numeric = column.kind != "str"
            grid.add_column(
                column.name,
                justify="right" if numeric else "left",  # numbers and row keys never wrap
                no_wrap=numeric or i == 0 or width is None,
                overflow="fold",
            )
        for row in _cells(table):
            grid.add_row(*row)
        console.print(grid)
        for note in table.notes:
            console.print(f"  {note}")
    if footer:
        console.print()
        for line in footer:
            console.print(line)
    text = console.file.getvalue()
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"


def render_markdown(
    tables: Sequence[Table], header: Sequence[str] = (), footer: Sequence[str] = (), caption: bool = False
) -> str:
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
            writer.writerow(
                [table.title, *("" if n not in index or row[index[n]] is None else row[index[n]] for n in names)]
            )
    return buf.getvalue()


LIST_SEPARATOR = ";"
"""A list-valued field (a config's ``ignored_fields``, the options ``memory`` does not model) is one CSV
cell: its items joined by ';' (items hold commas, never semicolons; an empty list is an empty cell)."""


def _csv_cell(value: Any) -> Any:
    """A record's value as one CSV cell: None -> empty, a list or tuple -> 'a;b', anything else as is."""
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return LIST_SEPARATOR.join(str(v) for v in value)
    return value


def render_records_csv(records: Sequence[dict[str, Any]]) -> str:
    """Tidy rows -> CSV; the header is the union of their keys in first-seen order (cells: ``_csv_cell``)."""
    buf = io.StringIO()
    if records:
        names = list(dict.fromkeys(k for r in records for k in r))
        writer = csv.DictWriter(buf, fieldnames=names, restval="", lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: _csv_cell(v) for k, v in r.items()} for r in records)
    return buf.getvalue()
