"""``crosscheck``: the live model's FLOPs and parameters, counted by fvcore and FlopCounterMode, beside
the analytic ones.  The command is a measurement: ``run`` builds the live model (torch, imported then)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..analytic.sizes import at_context, check_batch_seq
from ..config import AccountingError, ModelConfig
from ..names import DEVICES
from ..setup import TrainingSetup


@dataclass(frozen=True)
class Request:
    config: ModelConfig
    context: int | None = None
    batch: int = 1
    device: str = "meta"
    backward: bool = False
    setup: TrainingSetup = field(default_factory=TrainingSetup)
    allow_long: bool = False  # a run estimated past measure.devices.MAX_LIVE_SECONDS

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise AccountingError(f"unknown device '{self.device}' (valid: {', '.join(DEVICES)})")
        check_batch_seq(self.batch, at_context(self.config, self.context).context_length)


def run(request: Request) -> Any:
    """The ``CrossCheck`` (its ``mismatches()`` name any component whose count differs)."""
    from ..measure.crosscheck import crosscheck
    from ..measure.devices import long_runs_allowed

    r = request
    with long_runs_allowed(r.allow_long):
        return crosscheck(r.config, r.context, r.batch, device=r.device, backward=r.backward, setup=r.setup)
