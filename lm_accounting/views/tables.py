"""A tiny table type and its renderers: aligned text, markdown and CSV (JSON is ``to_dict``).

Cells hold raw values (exact ints, floats, strings); formatting happens only here,
when printing, according to the column's kind.
"""

from __future__ import annotations

import csv
import io
import re
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


MIN_TEXT_WIDTH = 16
"""The narrowest a wrapped text column may become.  A table that fits a terminal only with a text column
folded narrower (3-4 characters a line reads as noise), or with a number, a row key or a column name
cut, is printed as stacked records instead: one block per row, every cell whole."""


def render_text(
    tables: Sequence[Table], header: Sequence[str] = (), footer: Sequence[str] = (), width: int | None = None
) -> str:
    """Aligned plain-text tables (rich, no colour, no borders).  With ``width`` (a terminal's columns),
    text columns wrap, prose folds at spaces under its own indent (``fold``), and a table too wide to
    keep every number whole is split beside its row key or stacked (``split_columns``); without
    ``width`` (a pipe or a file) nothing wraps, one row per line, for grep and diff.  No cell is cut."""
    from rich.console import Console

    console = Console(
        file=io.StringIO(),
        width=width or 100_000,
        color_system=None,
        highlight=False,
        emoji=False,
        markup=False,
        soft_wrap=True,
    )
    out: list[str] = [line for text in header for line in fold(text, width)]
    for i, table in enumerate(tables):
        if header or i:
            out.append("")
        out += fold(table.title, width)
        parts = [table] if width is None else split_columns(table, width, console)
        for j, part in enumerate(parts):
            if j:
                out.append("")
            console.print(_grid(part, wrap=width is not None))
            out += console.file.getvalue().splitlines()
            console.file.seek(0)
            console.file.truncate()
        if not parts:
            out += stacked(table, width or 0)
        out += [line for note in table.notes for line in fold(f"  {note}", width)]
    if footer:
        out.append("")
        out += [line for text in footer for line in fold(text, width)]
    return "\n".join(line.rstrip() for line in out) + "\n"


KEEP = "\u00a0"  # a no-break space: textwrap breaks at ASCII whitespace only
BOUND = re.compile(r"(?<=\S) (?=\d[\d,.]*%?(?:$|[ ;,)]))")
"""A space before a number that ends a phrase ('batch 1', 'd_model 1,600'): kept, so a figure stays beside
its name; so is the space before a '·' separator, so no line opens with one."""


def fold(text: str, width: int | None) -> list[str]:
    """``text`` folded at spaces to ``width``, continuation lines under its first word (a leading ``- ``
    bullet's text): never inside a word, so a number stays whole even on a line of its own."""
    import textwrap

    if width is None:
        return text.split("\n")
    body = text.lstrip(" ")
    indent = " " * (len(text) - len(body) + (2 if body.startswith("- ") else 0))
    return [
        line.replace(KEEP, " ")
        for paragraph in BOUND.sub(KEEP, text.replace(" · ", f"{KEEP}· ")).split("\n")
        for line in textwrap.wrap(
            paragraph,
            width,
            subsequent_indent=indent if len(indent) < width // 2 else "",
            break_long_words=False,
            break_on_hyphens=False,
        )
        or [""]
    ]


def _grid(table: Table, wrap: bool) -> Any:
    """``table`` as a rich table: numbers right-aligned; numbers, row keys and (``wrap`` off) every cell unwrapped."""
    from rich import box
    from rich.table import Table as RichTable

    grid = RichTable(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 1), collapse_padding=True)
    for i, column in enumerate(table.columns):
        numeric = column.kind != "str"
        grid.add_column(
            column.name,
            justify="right" if numeric else "left",
            no_wrap=numeric or i == 0 or not wrap,
            overflow="fold",
        )
    for row in _cells(table):
        grid.add_row(*row)
    return grid


def fits(table: Table, width: int, console: Any) -> bool:
    """Whether ``table`` fits ``width`` terminal cells with every number, row key and column name whole and
    every other text column at least ``MIN_TEXT_WIDTH`` wide (or its natural width, if narrower).

    rich shrinks only the wrapping columns, widest first, so when the sum below fits, each of them keeps
    at least its floor.  The sum: (1) each column's natural width (its widest cell or name); (2) the
    wrapping columns lowered to their floor; (3) the gaps between columns, measured from rich itself as
    the unwrapped table's width less the sum of (1)."""
    from rich.cells import cell_len
    from rich.measure import Measurement

    cells = _cells(table)
    natural = [max([cell_len(c.name)] + [cell_len(r[i]) for r in cells]) for i, c in enumerate(table.columns)]
    unbounded = console.options.update(width=1_000_000, max_width=1_000_000)
    gaps = Measurement.get(console, unbounded, _grid(table, wrap=False)).maximum - sum(natural)
    need = [
        n
        if column.kind != "str" or i == 0
        else min(n, max(MIN_TEXT_WIDTH, _longest_word([column.name, *(r[i] for r in cells)])))
        for i, (column, n) in enumerate(zip(table.columns, natural, strict=True))
    ]
    return sum(need) + gaps <= width


MAX_PARTS = 3
"""A table too wide for the terminal is split into at most this many side-by-side parts, each repeating the
row key; past that, one block per row (``stacked``) reads better."""


def split_columns(table: Table, width: int, console: Any) -> list[Table]:
    """``table`` whole if it ``fits``; else its columns cut into consecutive groups that each fit beside
    the first column (the row key), at most ``MAX_PARTS`` of them; else none (print it ``stacked``)."""
    if fits(table, width, console):
        return [table]
    parts: list[list[int]] = [[]]
    for i in range(1, len(table.columns)):
        trial = _columns(table, [0, *parts[-1], i])
        if parts[-1] and not fits(trial, width, console):
            parts.append([])
        parts[-1].append(i)
    tables = [_columns(table, [0, *part]) for part in parts]
    if len(tables) > MAX_PARTS or not all(fits(t, width, console) for t in tables):
        return []
    return tables


def _columns(table: Table, keep: Sequence[int]) -> Table:
    """``table`` with only the columns at ``keep`` (its notes stay with the whole table)."""
    return Table(table.title, [table.columns[i] for i in keep], [tuple(row[i] for i in keep) for row in table.rows])


def _longest_word(texts: Sequence[str]) -> int:
    """The widest space-separated word in ``texts``: rich folds inside a word only when it must."""
    from rich.cells import cell_len

    return max((cell_len(word) for text in texts for word in text.split()), default=0)


def stacked(table: Table, width: int) -> list[str]:
    """``table`` as one block per row: the row's first cell, then ``name  value`` for each other column,
    names padded to one width and numbers right-aligned under each other.  A value that does not fit
    beside its name goes under it; text folds at spaces; a number is never cut (one wider than the
    terminal is printed whole on its own line)."""
    import textwrap

    from rich.cells import cell_len

    cells = _cells(table)
    names = [c.name for c in table.columns[1:]]
    pad = max((cell_len(n) for n in names), default=0)
    numbers = [c.kind != "str" for c in table.columns[1:]]
    wide = max((cell_len(r[i + 1]) for r in cells for i in range(len(names)) if numbers[i]), default=0)
    beside = pad + 4 + max(wide, MIN_TEXT_WIDTH) <= width  # values start at column pad + 4
    out: list[str] = []
    for row in cells:
        out += fold(f"{table.columns[0].name}: {row[0]}", width)
        for name, value, numeric in zip(names, row[1:], numbers, strict=True):
            indent = " " * (pad + 4 if beside else 4)
            lines = [value.rjust(wide)] if numeric else textwrap.wrap(value, width - len(indent)) or [""]
            if beside:
                out.append(f"  {name.ljust(pad)}  {lines[0]}")
                out += [indent + line for line in lines[1:]]
            else:
                out += [f"  {name}", *(indent + line.strip() for line in lines)]
    return out


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
