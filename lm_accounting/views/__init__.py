"""Generic views: every command's result rendered as a table, markdown, CSV or JSON.

``render(result, fmt)`` is the one entry point.  JSON is ``result.to_dict()`` and CSV is
``result.records()`` for every result type; the table and markdown forms come from the result
type's view function, registered in ``VIEWS``, which returns a ``View`` (header lines, tables,
footer lines).  The sweep plots are in ``plots.py``.
"""

from __future__ import annotations

import importlib
import json
from typing import Any

from ..config import AccountingError
from ..names import FORMATS
from .tables import View, render_markdown, render_records_csv, render_text

VIEWS = {  # result class name -> "module:function" returning a View (imported on first use)
    "Account": "lm_accounting.views.account:account_view",
    "CrossCheck": "lm_accounting.views.crosscheck:crosscheck_view",
    "MemoryAccount": "lm_accounting.views.memory:memory_view",
    "TrainTime": "lm_accounting.views.training:train_time_view",
    "Sweep": "lm_accounting.views.sweep:sweep_view",
    "PresetList": "lm_accounting.views.presets:presets_view",
    "ParallelMemory": "lm_accounting.views.parallel:parallel_view",
    "Plan": "lm_accounting.views.plan:plan_view",
    "Inference": "lm_accounting.views.infer:infer_view",
}


def view_of(result: Any) -> View:
    """The tables of ``result``, from the view registered for its type."""
    name = type(result).__name__
    if name not in VIEWS:
        raise AccountingError(f"no view for a {name} (known: {', '.join(VIEWS)})")
    module, _, func = VIEWS[name].partition(":")
    return getattr(importlib.import_module(module), func)(result)


def to_json(data: dict[str, Any]) -> str:
    """Strict JSON: exact ints, UTF-8 text, and an error (not ``NaN``/``Infinity``) for a non-finite float."""
    return json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False)


def render(result: Any, fmt: str = "table", *, width: int | None = None) -> str:
    """``result`` as text in ``fmt`` (one of ``names.FORMATS``); ``width`` bounds terminal tables."""
    if fmt not in FORMATS:
        raise AccountingError(f"unknown format '{fmt}' (valid: {', '.join(FORMATS)})")
    if fmt == "json":
        return to_json(result.to_dict()) + "\n"
    if fmt == "csv":
        return render_records_csv(result.records())
    view = view_of(result)
    if fmt == "markdown":
        return render_markdown(view.tables, view.header, view.footer)
    return render_text(view.tables, view.header, view.footer, width=width)
