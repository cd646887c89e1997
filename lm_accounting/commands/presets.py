"""``presets``: the presets with their dimensions and exact parameter counts (analytic)."""

from __future__ import annotations

from dataclasses import dataclass

from ..catalog import PresetList, list_presets


@dataclass(frozen=True)
class Request:
    """Nothing to choose: every preset is listed."""


def run(request: Request) -> PresetList:
    return list_presets()
