"""Writing report files: each file appears complete or not at all (temp file + os.replace)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

from .config import AccountingError
from .views.tables import Table, render_csv, render_markdown, render_records_csv


def write_atomic(path: Path, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same directory."""
    return write_with(path, lambda tmp: Path(tmp).write_bytes(data.encode() if isinstance(data, str) else data))


def write_with(path: Path, writer: Callable[[str], Any]) -> Path:
    """Call ``writer(temp_path)`` and move the result onto ``path`` atomically."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=path.suffix)
    except OSError as err:
        raise AccountingError(f"cannot write {path}: {err.strerror or err}") from None
    os.close(fd)
    try:
        writer(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path: Path, data: dict[str, Any]) -> Path:
    return write_atomic(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def write_table_files(stem: Path, tables: Sequence[Table], records: list[dict[str, Any]] | None = None) -> list[Path]:
    """``<stem>.md`` and ``<stem>.csv`` for a list of tables (CSV from ``records`` when given)."""
    csv_text = render_records_csv(records) if records is not None else render_csv(tables)
    return [write_atomic(stem.with_suffix(".md"), render_markdown(tables)),
            write_atomic(stem.with_suffix(".csv"), csv_text)]
