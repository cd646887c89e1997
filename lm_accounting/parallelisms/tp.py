"""Tensor parallel (``tp``): Megatron's layout through ``parallelize_module``: q/k/v and w1/w3 column-wise (dim 0
of the (out, in) weight split), output_proj and w2 row-wise (dim 1); norms replicated (``analytic.collectives``
rules 3, 10; ``analytic.tensor_parallel``)."""

from __future__ import annotations

from ..config import AccountingError


class TensorParallel:
    name = "TP"
    fields = ("tp",)

    def validate(self, layout) -> None:
        return None

    def check(self, layout, cfg, seq) -> None:
        m = layout.tp
        for what, n in (("heads", cfg.num_heads), ("kv heads", cfg.kv_heads), ("d_ff", cfg.d_ff)):
            if n % m:
                raise AccountingError(f"tp={m} does not divide the {what} ({n})")

    def label(self, layout) -> str:
        return f"·tp{layout.tp}" if layout.tp > 1 else ""

    def groups(self, layout) -> dict[str, tuple[int, int]]:
        """The tp ranks: consecutive (the innermost mesh dim)."""
        return {"tp": (layout.tp, 1)} if layout.tp > 1 else {}


TP = TensorParallel()
