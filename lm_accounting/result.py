"""The one shape every command's result has.

Each command returns one frozen dataclass that subclasses ``Result``:

* ``to_dict()``: the JSON form, opening with ``"schema": <SCHEMA>``; exact ints, no NaN or infinity;
* ``records()``: tidy rows, one fact per row (the CSV form);
* ``to_frame()``: ``records()`` as a pandas DataFrame (pandas is imported only here).

Rendering (table, markdown, CSV, JSON) is ``views.render``; the tables and text of each result
type are its view in ``views/``.  Wall-clock timings are never part of a result.
"""

from __future__ import annotations

from typing import Any, ClassVar


class Result:
    """Base of every command's result (see the module docstring)."""

    SCHEMA: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def records(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def to_frame(self):
        """The tidy records as a pandas DataFrame, one row per record.  Columns stay ``object``:
        a column of ints with a ``None`` would become float64, inexact above 2^53."""
        import pandas as pd

        return pd.DataFrame(self.records(), dtype=object)
