"""One place for every name and default the tool accepts; the CLI's choices derive from here.

No torch, no pandas.  The GPU table (with a source per figure) is ``gpus.GPUS``;
component keys, labels and groups are ``components.REGISTRY``.
"""

from __future__ import annotations

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1}
"""Bytes per element of each storage type we account for (IEEE 754 binary32/binary16, bfloat16, int8)."""

TRAINING_DTYPES = ("fp32", "bf16", "fp16")
"""Floating-point types a parameter (and so its gradient and AdamW moments) can have."""

CLI_TRAINING_DTYPES = ("fp32", "bf16")
"""The training dtypes offered on the command line (fp16 needs loss scaling, not modelled)."""

WEIGHT_DTYPES = ("fp32", "bf16", "int8")
"""Storage types the headline command prices the weights in."""

KV_CACHE_DTYPES = ("fp32", "bf16")
"""Storage types the headline command prices the KV cache in."""

TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
"""Our dtype names -> ``torch`` attribute names (resolved with ``getattr(torch, ...)`` where torch is loaded)."""

ADAMW_IMPLS = ("foreach", "for-loop", "fused")
"""torch.optim.AdamW implementations: ``foreach=True``, ``foreach=False`` and ``fused=True``."""

DEFAULT_ADAMW = "foreach"
"""torch's default AdamW on CUDA (the for-loop is its default on CPU and meta)."""

ADAMW_KWARGS = {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
"""The ``torch.optim.AdamW`` keyword arguments that select each implementation."""

DEVICES = ("meta", "cpu", "cuda")
"""Where the live model can be built: ``meta`` holds no memory."""

MEASURE_CHOICES = ("none", *DEVICES)
"""``--measure`` of ``memory`` and ``infer``: no measurement, or where the live model runs."""

MEASURE_METHODS = ("tracker", "allocator")
"""``memory --measure-method``: the storage tracker (a dispatch mode: the traced run) or the CPU
allocator's own events (no dispatch mode: the plain run; ``--measure cpu`` only)."""

COUNTERS = ("fvcore", "flop_counter")
"""The independent FLOP counters of a cross-check: fvcore's FlopCountAnalysis and torch's FlopCounterMode."""

FORMATS = ("table", "markdown", "csv", "json")
"""Output formats of every command."""

STEP_FLOPS_METHODS = ("3x", "6nd", "palm")
"""Training-step FLOPs conventions: 3 × forward, 6·N·D (Kaplan) and the PaLM formula."""
