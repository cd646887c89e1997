"""The op library (issue 26): the memory of one training step of a program, replayed without torch.

Layers (each its own module):

* ``engine``: the evaluation engine (``Affine`` a·B + b, ``PeakEnvelope``, ``Replay``, ``PhaseInBatch``,
  ``StepInBatch``, ``repeat``, ``apply_segment``);
* ``tensors``: symbolic tensors whose storages charge the active ``Run``, and torch's autograd engine
  (``record``, ``backward``, ``checkpoint``, ``no_grad``);
* ``aten``: aten-level primitives, each with its forward allocations, saved tensors and backward;
* ``step``: one training step of a program (``training_step``: forward, backward, AdamW, zero_grad);
* programs written like the code they follow: ``transformers`` (transformers 5.24's modeling code),
  ``course`` (our own model), ``llmfoundry`` (llm-foundry's MPT on a GPU, for its published benchmarks).

Entry points: ``predict_step`` (the step as a function of the micro-batch B) and ``unsupported``.  No torch.
"""

from __future__ import annotations

from ...config import ModelConfig
from ...layout import ParallelLayout
from ...setup import TrainingSetup
from .engine import StepInBatch

IMPLS = ("course", "transformers", "llm-foundry")
RUNS = (("traced", "meta"), ("traced", "cpu"), ("plain", "meta"), ("plain", "cpu"), ("plain", "cuda"))
"""(mode, device) pairs predicted (``exactness`` says how each is proven, per implementation).  "traced" is the
storage tracker's run (every meta run; cpu tensors under a dispatch mode); "plain" is a run without a dispatch
mode (in-place gradient sums): on "cpu" what the CPU allocator sees (wrapped Python numbers, kernel scratch), on
"cuda" what the caching allocator is asked for (``ops.cuda``: CUDA's fused attention and kernel scratch; its
rounding to 512-byte blocks and the cuBLAS workspaces are not in any figure, as in the measurements), on "meta"
the plain program with no device's extras."""

EXACTNESS = {
    ("traced", "meta"): "exact: equal to the storage tracker on meta, phase by phase",
    ("traced", "cpu"): "exact: equal to the storage tracker on cpu, phase by phase",
    ("plain", "cpu"): "exact: equal to the CPU allocator at small shapes",
    ("plain", "meta"): "the plain run's program without any device's kernel scratch (no device runs it)",
    ("plain", "cuda", "course"): (
        "exact for the architectures an H200 ran (the course model's Llama-like block and its mixture of experts, "
        "Qwen3-MoE, torchtitan's per-op checkpointing included: 1,624 of 1,624 figures equal, reports/cuda/memory.csv), on a GPU with the H200's kernels, at "
        "the batch asked (the row sums' and the id sort's scratch are no line in B); requested bytes, without the "
        "allocator's 512-byte rounding and the cuBLAS workspaces; other architectures (GPT-2, Gemma, OLMo-2, "
        "sliding windows, MLA): a prediction from the same kernel facts, not validated on a GPU "
        "(``memory_report.cuda_exactness``)"
    ),
    ("plain", "cuda", "transformers"): (
        "exact where a GPU ran transformers' own model (an H200, reports/cuda-h200/hf_memory.csv: 2,856 of 2,856 "
        "figures, eager attention in 35 families and sdpa in 33; an H100, reports/cuda-h100: 623 of 623; "
        "``provenance.HF_CUDA_RUNS``); elsewhere the same CUDA facts, not validated"
    ),
}
"""How each run (``RUNS``) is proven, per (mode, device) or, where it differs by implementation, (mode, device,
impl): ``exactness``."""


def _programs(impl: str):
    if impl == "transformers":
        from . import transformers

        return transformers
    if impl == "course":
        from . import course  # helper H5's programs

        return course
    if impl == "llm-foundry":  # MPT as llm-foundry's benchmarks ran it, on cuda only (published_runs)
        from . import llmfoundry

        return llmfoundry
    raise ValueError(f"unknown implementation {impl!r} (valid: {', '.join(IMPLS)})")


def unsupported(cfg: ModelConfig, setup: TrainingSetup, impl: str) -> list[str]:
    """Why ``predict_step`` cannot give ``cfg`` under ``setup`` with implementation ``impl`` (one reason a
    line); empty: it can."""
    if impl not in IMPLS:
        return [f"unknown implementation {impl!r} (valid: {', '.join(IMPLS)})"]
    try:
        programs = _programs(impl)
    except ImportError:
        return [f"--impl {impl} has no programs yet"]
    if impl != "course" and setup.checkpoint == "op":  # torchtitan's policy, programmed on our model only
        return [f"--impl {impl} has no torchtitan per-op selective checkpointing (--checkpoint op: --impl course)"]
    return programs.unsupported(cfg, setup)


def exactness(impl: str, mode: str, device: str) -> str:
    """How ``predict_step(impl=impl, mode=mode, device=device)`` is proven (``EXACTNESS``)."""
    check_run(mode, device)
    return EXACTNESS.get((mode, device, impl)) or EXACTNESS[mode, device]


def check_run(mode: str, device: str) -> None:
    """Refuse (``ValueError``) a run the library does not model (see ``RUNS``)."""
    if (mode, device) not in RUNS:
        runs = ", ".join(f"{m} on {d}" for m, d in RUNS)
        raise ValueError(f"the {mode} run on {device} is not modelled (modelled: {runs})")


def predict_step(
    cfg: ModelConfig,
    seq: int,
    setup: TrainingSetup,
    *,
    impl: str,
    batch: int = 1,
    mode: str = "traced",
    device: str = "meta",
    cpu_threads: int = 1,
    layout: ParallelLayout | None = None,
    optimizer_step: bool = True,
    replicate=None,
) -> StepInBatch:
    """One training step of implementation ``impl``'s model of ``cfg`` at context ``seq`` under ``setup``,
    as an exact function of the micro-batch B: ``.at(B)`` is the ``StepMemory`` that
    ``measure.tracker.measure_training_step`` (``mode`` "traced", ``device`` "meta" or "cpu") or the CPU
    allocator (``mode`` "plain", ``device`` "cpu", ``cpu_threads`` = ``torch.get_num_threads()`` of the run)
    measures.  ``batch``: 1 gives the step at B = 1 (a batch of one lets torch view what it copies at B >= 2);
    any other value the lines in B, exact for every B >= 2.  Raises ``ValueError`` with the reasons of
    ``unsupported`` (or ``check_run``'s) when it cannot.

    ``layout``: rank 0 (the worst) of an FSDP2 data-parallel job (``layout.dp`` >= 2, ``zero`` 2 or 3;
    ``batch`` the rank's micro-batch), ``fully_shard`` on every layer then the root (``ops.fsdp``), or of a DDP
    job (``zero`` 0, transformers' programs: ``ops.ddp``), or of transformers' own tensor parallel (``tp`` >= 2 alone,
    the Llama-plan families: ``ops.tp``); what ``measure.hf.measure_hf_step(..., layout=layout)``
    measures on the fake process group (``replicate``: the DDP rank's ``ddp.Replicate``, to read its bucket
    all-reduces after; without one, ``find_unused_parameters`` is the HF Trainer's, ``ddp.trainer_find_unused``).  Without
    ``optimizer_step`` the step stops after the backward (``step.training_step``; ``step_time``'s programs)."""
    reasons = unsupported(cfg, setup, impl)
    if reasons:
        raise ValueError("; ".join(reasons))
    check_run(mode, device)
    threads = {"cpu_threads": cpu_threads} if cpu_threads != 1 else {}  # a plain CPU run's per-thread scratch
    if layout is not None and not layout.single:
        from . import ddp, fsdp, tp

        if layout.tp > 1:
            if impl != "transformers":
                raise ValueError(
                    f"TP over --impl {impl}'s program is analytic.parallel.rank_step's, not the op library's"
                )
            return tp.predict_rank(cfg, seq, setup, layout, batch=batch, mode=mode, device=device)
        if layout.fsdp:
            return fsdp.predict_rank(
                cfg, seq, setup, layout, impl=impl, batch=batch, mode=mode, device=device, **threads
            )
        return ddp.predict_rank(
            cfg, seq, setup, layout, impl=impl, batch=batch, mode=mode, device=device, replicate=replicate, **threads
        )
    return _programs(impl).predict_step(
        cfg, seq, setup, batch=batch, mode=mode, device=device, optimizer_step=optimizer_step, **threads
    )
