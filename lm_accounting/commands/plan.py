"""``plan``: which parallel layout trains a model on N GPUs, and how long it takes (analytic; no torch).
``plot`` writes per-GPU memory against GPU count (matplotlib, imported then).

A layout fits when its per-GPU peak is within the budget per GPU, ``gpus.memory_budget``: the GPU's
CUDA total less the allowance, the rule of ``memory`` and ``infer`` too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..analytic.sizes import at_context
from ..config import AccountingError, ModelConfig
from ..gpus import DEFAULT_GPU, MemoryBudget
from ..plan import DEFAULT_INTERNODE, OwnLayout, Plan, check_plan, memory_vs_gpus, plan

NAME_MAX = 255
"""Bytes in one path component (Linux NAME_MAX, macOS too)."""


@dataclass(frozen=True)
class Request:
    config: ModelConfig
    tokens: int  # training tokens D
    gpu: str = DEFAULT_GPU
    gpus: tuple[int, int] = (8, 1024)  # the GPU counts tried, LOW..HIGH
    context: int | None = None
    global_batch_tokens: int = 4 * 1024 * 1024
    price_per_gpu_hour: float | None = None
    efficiency: float = 1.0  # scales the calibrated step-time model (``plan``, step 1)
    internode_bw: int = DEFAULT_INTERNODE
    allowance: int | None = None  # default gpus.DEFAULT_ALLOWANCE
    top: int = 10
    plot_stem: str | None = None  # also write PLOT_STEM.png and .svg
    own: OwnLayout | None = None  # price the user's own layout only (``plan.OwnLayout``)
    run_config: ModelConfig = field(init=False, repr=False)
    budget_basis: MemoryBudget = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.plot_stem is not None:  # a plot that cannot be written fails before any work or output
            check_plot_stem(self.plot_stem)
        run = at_context(self.config, self.context)
        object.__setattr__(self, "run_config", run)
        basis = check_plan(
            run, self.gpu, run.context_length, self.global_batch_tokens, efficiency=self.efficiency, allowance=self.allowance,
            top=self.top,
        )  # fmt: skip
        object.__setattr__(self, "budget_basis", basis)
        low, high = self.gpus
        if not 1 <= low <= high:
            raise AccountingError(f"the GPU counts must be 1 <= LOW <= HIGH, got {low}..{high}")


def check_plot_stem(stem: str) -> None:
    """``output.check_output_stem`` (a name, a folder that can hold it), plus: each file name within
    ``NAME_MAX`` bytes and the folder writable, tried by creating and removing a file there."""
    import tempfile

    from ..output import check_output_stem

    check_output_stem(stem)
    path = Path(stem)
    if len(os.fsencode(path.name + ".png")) > NAME_MAX:
        raise AccountingError(f"plot path '{stem[:60]}…': a file name over {NAME_MAX} bytes")
    folder = path.parent if str(path.parent) else Path(".")
    if folder.is_dir():
        try:
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as err:
            raise AccountingError(f"cannot write the plot into {str(folder)[:60]}: {err.strerror or err}") from None


def run(request: Request) -> Plan:
    r, cfg = request, request.run_config
    return plan(
        cfg, r.gpu, r.gpus, cfg.context_length, r.global_batch_tokens, r.tokens, efficiency=r.efficiency,
        internode_bw=r.internode_bw, allowance=r.allowance, price_per_gpu_hour=r.price_per_gpu_hour, top=r.top,
        own=r.own,
    )  # fmt: skip


def plot(request: Request, result: Plan) -> list[str]:
    """Write ``plot_stem``.png and .svg: per-GPU peak + allowance against GPU count for the main layouts,
    with the GPU's CUDA total as a line.  Returns the paths written (none without ``plot_stem``)."""
    from ..views.plan import plot_memory_vs_gpus

    r, cfg = request, request.run_config
    if r.plot_stem is None:
        return []
    curves = memory_vs_gpus(cfg, cfg.context_length, r.gpus, allowance=r.budget_basis.allowance)
    title = f"{cfg.name} at S = {cfg.context_length:,}, micro-batch 1"  # the setup: plot_memory_vs_gpus adds it
    g = r.budget_basis.gpu
    return list(plot_memory_vs_gpus(curves, g.cuda_total, title, r.plot_stem, memory_label=f"{g.label}: CUDA total"))
