"""The headline answer for one config at (batch, context): parameters, FLOPs, memory basics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .analytic.flops import (
    TrainingFlops,
    causal_attention_flops,
    chunked_attention_flops,
    forward_flops,
    nonmatmul_flops,
    routed_top_k_forward_flops,
    training_flops,
    windowed_attention_flops,
)
from .analytic.memory import kv_cache_bytes, weight_bytes
from .analytic.params import active_parameter_count, parameter_breakdown
from .analytic.sizes import at_context, check_batch_seq
from .breakdown import Breakdown
from .config import ModelConfig
from .names import KV_CACHE_DTYPES, WEIGHT_DTYPES
from .result import Result

CONVENTIONS = (
    "FLOPs: (m×n)@(n×p) = 2·m·n·p; matmuls only in the totals (CS336 A1 transformer_accounting).",
    (
        "Attention QKᵀ and AV count the full S×S square (as the course, fvcore and FlopCounterMode do); "
        "the causal half is shown separately."
    ),
    (
        "Backward = 2 × forward for matmuls, so a training step = 3 × forward; 6·N·D and the PaLM "
        "form are shown for comparison."
    ),
    "Non-matmul FLOPs are an estimate under a stated per-element convention, never added to the totals.",
    "GB = 10^9 bytes, GiB = 2^30 bytes.",
    "Keys are the live model's module paths; layers.* is summed over all layers.",
)

TRAINING_ROWS = (  # key, label, attribute of TrainingFlops
    ("forward", "forward (matmuls)", "forward"),
    ("backward", "backward = 2 × forward", "backward"),
    ("step", "step = 3 × forward", "step"),
    ("six_n_d", "6·N·D, N = all params (active ones for MoE)", "six_nd"),
    ("palm", "PaLM (6·N_matmul + 6·L·h·(d_head + d_v)·S)·D", "palm"),
)


@dataclass(frozen=True)
class Account(Result):
    """Analytic accounting of one model shape at batch B and sequence length S."""

    SCHEMA = "lm-accounting/account/5"

    config: ModelConfig
    batch: int
    seq: int
    preset_context: int  # the context length the preset or file gives (the run may differ)
    params: Breakdown
    active_params: int  # parameters one token uses (= params.total unless a mixture of experts)
    forward: Breakdown
    nonmatmul: Breakdown
    causal_attention: int
    windowed_attention: int | None  # QKᵀ + AV with only the sliding-window band on windowed layers (None: no window)
    training: TrainingFlops

    @property
    def attention_matmuls(self) -> int:
        """QKᵀ + AV over all layers, full square (the group "attention matmuls": DSA's indexer scores too)."""
        return self.forward.groups().get("attention matmuls", 0)  # 0: no attention layer (a pure Mamba2)

    def llama4_attention(self) -> dict[str, int]:
        """Llama 4's chunked attention (``attention_chunk``): QKᵀ + AV over each query's own chunk on the chunked
        layers, a labelled extra (a JSON key only where the model has chunks)."""
        if self.config.attention_chunk is None:
            return {}
        return {"chunked": chunked_attention_flops(self.config, self.seq, self.batch)}

    def llama4_experts(self) -> dict[str, int]:
        """Llama 4 (``all_experts_run``): the forward matmul FLOPs with each token's top-k experts only, beside the
        totals' every expert on every token (a JSON key only for such a model)."""
        if not self.config.all_experts_run:
            return {}
        return {"forward_flops_routed_top_k": routed_top_k_forward_flops(self.config, self.seq, self.batch)}

    def weight_bytes(self) -> dict[str, int]:
        return {dt: weight_bytes(self.params.total, dt) for dt in WEIGHT_DTYPES}

    def kv_cache_bytes(self) -> dict[str, int]:
        return {dt: kv_cache_bytes(self.config, self.seq, self.batch, dt) for dt in KV_CACHE_DTYPES}

    def training_rows(self) -> list[tuple[str, str, int]]:
        return [(key, label, getattr(self.training, attr)) for key, label, attr in TRAINING_ROWS]

    def records(self) -> list[dict[str, Any]]:
        """Tidy rows (section, key, label, group, per_layer, total, share, unit): the CSV form."""
        rows = []
        for section, bd in (
            ("parameters", self.params),
            ("forward_flops", self.forward),
            ("non_matmul_flops", self.nonmatmul),
        ):
            for it in bd:
                rows.append(
                    dict(
                        section=section,
                        key=it.key,
                        label=it.label,
                        group=it.group,
                        per_layer=it.per_layer,
                        total=it.total,
                        share=bd.share(it.key),
                        unit=bd.unit,
                    )
                )

        def whole(section: str, key: str, label: str, total: int, share: float | None, unit: str) -> None:
            """A row that is not a per-component item: no group, no per-layer value."""
            rows.append(
                dict(
                    section=section, key=key, label=label, group="", per_layer=None, total=total, share=share, unit=unit
                )
            )

        n = self.params.total
        whole("parameter_totals", "total", "all parameters", n, 1.0, "params")
        label = "parameters one token uses (MoE: its top-k experts only)"
        whole("parameter_totals", "active", label, self.active_params, self.active_params / n, "params")
        step = self.training.step
        extra = [("attention_causal_halved", "QKᵀ+AV, causal half", self.causal_attention)]
        for key, label, value in [*self.training_rows(), *extra]:
            whole("training_step_flops", key, label, value, value / step, "FLOPs")
        for prefix, sizes in (("weights", self.weight_bytes()), ("kv_cache", self.kv_cache_bytes())):
            for dtype, size in sizes.items():
                whole("memory", f"{prefix}.{dtype}", f"{prefix} in {dtype}", size, None, "bytes")
        return rows

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.SCHEMA,
            "config": self.config.resolved(),
            "batch": self.batch,
            "context": self.seq,
            "preset_context": self.preset_context,
            "parameters": {
                **self.params.to_dict(),
                "active": self.active_params,
                "weight_bytes": self.weight_bytes(),
            },
            "forward_flops": self.forward.to_dict(),
            "attention_matmul_flops": {
                "full": self.attention_matmuls,
                "causal_halved": self.causal_attention,
                "windowed_band": self.windowed_attention,
                **self.llama4_attention(),
            },
            **self.llama4_experts(),
            "non_matmul_flops": self.nonmatmul.to_dict(),
            "training_step_flops": {key: value for key, _, value in self.training_rows()},
            "kv_cache_bytes": self.kv_cache_bytes(),
            "conventions": list(CONVENTIONS),
        }


def account(cfg: ModelConfig, seq: int | None = None, batch: int = 1) -> Account:
    """Everything analytic about ``cfg`` at ``seq`` tokens (default: its context length).

    A ``seq`` other than ``cfg.context_length`` analyses the model built for that context
    (``analytic.sizes.at_context``); ``preset_context`` keeps the config's own."""
    run = at_context(cfg, seq)
    seq = run.context_length
    check_batch_seq(batch, seq)
    return Account(
        config=run,
        batch=batch,
        seq=seq,
        preset_context=cfg.context_length,
        params=parameter_breakdown(run),
        active_params=active_parameter_count(run),
        forward=forward_flops(run, seq, batch),
        nonmatmul=nonmatmul_flops(run, seq, batch),
        causal_attention=causal_attention_flops(run, seq, batch),
        windowed_attention=None if run.sliding_window is None else windowed_attention_flops(run, seq, batch),
        training=training_flops(run, seq, batch),
    )
