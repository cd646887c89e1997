"""The ``presets`` result: every shipped preset with its dimensions, architecture family and parameter count."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .analytic.params import active_parameter_count, parameter_breakdown
from .config import ModelConfig, load_config, preset_names
from .result import Result


@dataclass(frozen=True)
class PresetList(Result):
    """The presets, smallest first, each with its exact parameter count."""

    SCHEMA = "lm-accounting/presets/5"

    presets: tuple[tuple[ModelConfig, int, int], ...]  # (config, parameters, active parameters)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": self.SCHEMA, "presets": self.records()}

    def records(self) -> list[dict[str, Any]]:
        return [
            {
                **cfg.resolved(),
                "family": cfg.family,
                "architecture": cfg.architecture,
                "parameters": n,
                "active_parameters": active,
            }
            for cfg, n, active in self.presets
        ]


def list_presets() -> PresetList:
    configs = [load_config(name) for name in preset_names()]
    counted = [(cfg, parameter_breakdown(cfg).total, active_parameter_count(cfg)) for cfg in configs]
    return PresetList(tuple(sorted(counted, key=lambda pair: pair[1])))
