"""Analytic memory: weights and the inference KV cache.

Sources: bytes per element from IEEE 754 / bfloat16 storage sizes; the KV cache holds
one key and one value vector of ``kv_heads * d_head`` per layer per cached token
(DESIGN.md section 4: 2 · layers · n_kv · head_dim · S · batch · bytes).
"""

from __future__ import annotations

from ..config import ModelConfig
from ..units import DTYPE_BYTES


def weight_bytes(n_params: int, dtype: str) -> int:
    """Bytes to hold ``n_params`` parameters in ``dtype``."""
    return n_params * DTYPE_BYTES[dtype]


def kv_cache_bytes(cfg: ModelConfig, seq: int, batch: int, dtype: str) -> int:
    """K and V for every layer and cached token: 2 · L · kv_heads · d_head · S · B · bytes."""
    return 2 * cfg.num_layers * cfg.kv_dim * seq * batch * DTYPE_BYTES[dtype]
