"""ZeRO-1 (``zero=1``): DDP plus ``ZeroRedundancyOptimizer`` (AdamW); whole parameters are assigned to ranks
(largest first, to the least-loaded rank), each keeps its own parameters' AdamW state, and the updated parameters
are broadcast from their owner after the step (``analytic.collectives`` rule 2)."""

from __future__ import annotations

from .ddp import DataParallel

ZERO1 = DataParallel("ZeRO-1", (1,))
