"""The op library (issue 26): the memory of one training step of a program, replayed without torch.

Layers (each its own module):

* ``engine``: the evaluation engine (``Affine`` a·B + b, ``PeakEnvelope``, ``Replay``, ``PhaseInBatch``,
  ``StepInBatch``, ``repeat``, ``apply_segment``);
* ``tensors``: symbolic tensors whose storages charge the active ``Run``, and torch's autograd engine
  (``record``, ``backward``, ``checkpoint``, ``no_grad``);
* ``aten``: aten-level primitives, each with its forward allocations, saved tensors and backward;
* ``step``: one training step of a program (``training_step``: forward, backward, AdamW, zero_grad);
* programs written like the code they follow: ``transformers`` (transformers 5.24's modeling code),
  ``course`` (our own model).

Entry points: ``predict_step`` (the step as a function of the micro-batch B) and ``unsupported``.  No torch.
"""

from __future__ import annotations

from ...config import ModelConfig
from ...layout import ParallelLayout
from ...setup import TrainingSetup
from .engine import StepInBatch

IMPLS = ("course", "transformers")
RUNS = (("traced", "meta"), ("traced", "cpu"), ("plain", "meta"), ("plain", "cpu"), ("plain", "cuda"))
"""(mode, device) pairs predicted.  Exact: the storage tracker's traced run (every meta run; cpu tensors under
a dispatch mode) and the CPU allocator's plain run (``device`` "cpu": wrapped Python numbers, kernel
scratch).  "plain" on meta or cuda is the plain run's program (in-place gradient sums) without any device's
kernel extras: on cuda the caching allocator's rounding, cuBLAS workspaces and CUDA kernels' scratch are not
in it."""


def _programs(impl: str):
    if impl == "transformers":
        from . import transformers

        return transformers
    if impl == "course":
        from . import course  # helper H5's programs

        return course
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
    return programs.unsupported(cfg, setup)


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
) -> StepInBatch:
    """One training step of implementation ``impl``'s model of ``cfg`` at context ``seq`` under ``setup``,
    as an exact function of the micro-batch B: ``.at(B)`` is the ``StepMemory`` that
    ``measure.tracker.measure_training_step`` (``mode`` "traced", ``device`` "meta" or "cpu") or the CPU
    allocator (``mode`` "plain", ``device`` "cpu", ``cpu_threads`` = ``torch.get_num_threads()`` of the run)
    measures.  ``batch``: 1 gives the step at B = 1 (a batch of one lets torch view what it copies at B >= 2);
    any other value the lines in B, exact for every B >= 2.  Raises ``ValueError`` with the reasons of
    ``unsupported`` (or ``check_run``'s) when it cannot.

    ``layout``: rank 0 (the worst) of an FSDP2 data-parallel job (``layout.dp`` >= 2, ``zero`` 2 or 3;
    ``batch`` the rank's micro-batch), ``fully_shard`` on every layer then the root (``ops.fsdp``); what
    ``measure.hf.measure_hf_step(..., layout=layout)`` measures on the fake process group."""
    reasons = unsupported(cfg, setup, impl)
    if reasons:
        raise ValueError("; ".join(reasons))
    check_run(mode, device)
    threads = {"cpu_threads": cpu_threads} if cpu_threads != 1 else {}  # a plain CPU run's per-thread scratch
    if layout is not None and not layout.single:
        from .fsdp import predict_rank

        return predict_rank(cfg, seq, setup, layout, impl=impl, batch=batch, mode=mode, device=device, **threads)
    return _programs(impl).predict_step(cfg, seq, setup, batch=batch, mode=mode, device=device, **threads)
