"""FSDP2 (``zero=2``: ``fully_shard(..., reshard_after_forward=False)``; ``zero=3``: full shard) on every block and
the root: parameters, gradients and AdamW state sharded on dim 0 over dp; under ``precision="amp-bf16"`` a
``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` (``analytic.collectives`` rules 1, 5, 9)."""

from __future__ import annotations

from .ddp import DataParallel

FSDP2 = DataParallel("FSDP2", (2, 3))
