"""Plain result types: a per-component breakdown of one quantity (parameters, FLOPs, bytes).

Keys are the live model's module paths with the layer index replaced by ``*``
(``layers.*.attn.q_proj``), so an analytic figure and a counted one can be compared
key for key.  Every figure is an exact Python ``int``; shares are derived on demand.
pandas is imported only by ``to_frame``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Item:
    """One component.  ``per_layer`` is set for components repeated in every block."""

    key: str
    label: str
    group: str
    total: int
    per_layer: int | None = None
    formula: str = ""


@dataclass(frozen=True)
class Breakdown:
    """An ordered set of components of one quantity, in one unit."""

    quantity: str
    unit: str
    items: tuple[Item, ...]

    def __iter__(self) -> Iterator[Item]:
        return iter(self.items)

    def __getitem__(self, key: str) -> Item:
        for item in self.items:
            if item.key == key:
                return item
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return any(item.key == key for item in self.items)

    @property
    def total(self) -> int:
        return sum(item.total for item in self.items)

    @property
    def per_layer_total(self) -> int:
        """Sum over one block's components."""
        return sum(item.per_layer for item in self.items if item.per_layer is not None)

    def share(self, key: str) -> float:
        total = self.total
        return self[key].total / total if total else 0.0

    def groups(self) -> dict[str, int]:
        """Totals per group (e.g. ``attention matmuls``), in first-seen order."""
        out: dict[str, int] = {}
        for item in self.items:
            out[item.group] = out.get(item.group, 0) + item.total
        return out

    def totals(self) -> dict[str, int]:
        return {item.key: item.total for item in self.items}

    def to_dict(self) -> dict[str, Any]:
        total = self.total
        return {
            "quantity": self.quantity,
            "unit": self.unit,
            "total": total,
            "per_layer_total": self.per_layer_total,
            "components": [
                {
                    "key": it.key,
                    "label": it.label,
                    "group": it.group,
                    "per_layer": it.per_layer,
                    "total": it.total,
                    "share": it.total / total if total else 0.0,
                    "formula": it.formula,
                }
                for it in self.items
            ],
            "groups": self.groups(),
        }

    def to_frame(self):
        """One row per component: key, label, group, per_layer, total, share, formula."""
        import pandas as pd

        return pd.DataFrame(self.to_dict()["components"]).set_index("key")
