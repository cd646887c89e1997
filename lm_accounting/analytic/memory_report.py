"""Everything the ``memory`` command reports for one config: one ``Result``.

Two answers to "how much memory does training take", kept apart on purpose:

* ``course_convention``: the CS336 adamwAccounting bookkeeping (fp32, the handout's list of
  activations, peak = 16·N + activations).  This is what the assignment asks for.
* ``implementation_exact``: what our live model allocates under a ``TrainingSetup`` (attention,
  checkpointing, precision, AdamW), replayed op by op: model states, saved activations, each
  phase's peak, and each phase's peak as exact lines a_i·B + b_i in the batch.  This is what a real
  run needs.  Two runs are predicted, labelled apart:

  - ``step``: the *plain* run, no dispatch mode (what a user gets on a GPU; on ``cpu`` it equals the
    CPU allocator's own events, ``measure.allocator``);
  - ``step_traced``: the *traced* run, what the storage tracker (or any dispatch mode, or meta) sees;
    ``traced_minus_plain`` gives the gap per phase (``replay.traced_minus_plain``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

from ..breakdown import Breakdown
from ..config import ModelConfig
from ..gpus import MemoryBudget, as_budget
from ..implementations import implementation_dict, program_label
from ..phases import PHASE_LABELS, StepMemory
from ..provenance import CPU_TORCH, CUDA, KERNEL_FACT_GPUS, hf_cuda_run
from ..result import Result
from ..setup import TrainingSetup, check_cuda_fused_attention
from .activations import saved_activation_breakdown
from .capacity import StepPeakLines, max_context_that_fits, peak_lines_in_batch
from .course import CoursePeak, course_linear_in_batch, course_peak, korthikanti_activation_bytes, max_batch
from .hardware_flops import StepFlops, step_flops
from .memory import adamw_step_counter_bytes, adamw_step_temporary_bytes, kv_cache_bytes, model_state_breakdown
from .replay import (
    as_setup,
    check_device,
    moe_lines_in_batch,
    predict_training_step,
    replay_unsupported,
    traced_minus_plain,
)
from .sizes import DEFAULT_SETUP

COURSE_SOURCE = "CS336 (Stanford, spring 2025) assignment 1, adamwAccounting (a) and (b)"
COURSE_ASSUMPTIONS = (
    "every tensor fp32; peak = 4·N parameters + 4·N gradients + 8·N AdamW m and v "
    "+ the handout's list of activations (logits counted twice)"
)
EXACT_ASSUMPTIONS = (
    "our live model's ops under the training setup, replayed in order (torch 2.13); step: the plain run "
    "(no dispatch mode: equal to the CPU allocator's own events on cpu), step_traced: what the storage "
    "tracker sees (equal to it byte for byte); steady-state step, the AdamW state already exists"
)


def step_exactness(impl: str, device: str) -> str:
    """How the op library's step of ``impl`` for ``device`` is proven, in words starting "exact" where it is
    (``ops.exactness``): the plain run, except on meta, where no device runs it and the storage tracker's traced
    run is the figure compared."""
    from .ops import exactness

    return exactness(impl, "traced" if device == "meta" else "plain", device)


def program_assumptions(m: MemoryAccount) -> str:
    """``EXACT_ASSUMPTIONS`` for a step the op library predicts (``analytic/ops``), with how it is proven on its
    device (``step_exactness``)."""
    return (
        f"{program_label(m.config, m.impl, m.setup)}: its ops under the training setup, simulated tensor by tensor "
        "with torch's autograd order (analytic/ops, torch 2.13); step: the plain run, step_traced: what the storage "
        "tracker sees; steady-state step, the AdamW state already exists; on "
        f"{m.device}: {m.exactness.words if m.exactness else step_exactness(m.impl, m.device)}"
    )


LEGACY_MISS = "naive attention under amp-bf16 with grouped K/V heads"
"""The setups whose CUDA step the legacy replay counts one (B, S, kv, d_head) bf16 copy too many for (one H200 figure,
8,388,608 B high); on cuda the op library's course program predicts them (``program_report.replayed``)."""


def legacy_misses(cfg: ModelConfig, setup: TrainingSetup, device: str | None) -> bool:
    """Whether the legacy replay's CUDA step is known to differ from the H200's for ``cfg`` under ``setup``
    (``LEGACY_MISS``)."""
    grouped = cfg.kv_heads < cfg.num_heads
    return device == "cuda" and setup.attention == "naive" and setup.precision == "amp-bf16" and grouped


def gpu_unmeasured(cfg: ModelConfig) -> list[str]:
    """The architecture options of ``cfg`` no GPU run measured (``provenance.MEASURED_MODELS``: the course model's
    Llama-like block and its mixture of experts); empty: the architecture ran on the H200."""
    return (
        replay_unsupported(cfg)
        + (["q/k/v biases"] if cfg.qkv_bias else [])
        + (["partial rotary"] if cfg.partial_rotary else [])
    )


@dataclass(frozen=True)
class Exactness:
    """How a step predicted for a device is proven: ``exact`` (the figures equal a measurement of this code path
    on ``validated_on``: a GPU's name, or "meta"/"cpu" for the storage tracker and the CPU allocator), ``reason``
    (why not, a few words for the header; "" when exact) and ``words`` (the Conventions line)."""

    exact: bool
    validated_on: str | None
    reason: str
    words: str

    def to_dict(self) -> dict[str, Any]:
        return {"exact": self.exact, "validated_on": self.validated_on, "exactness": self.words}


def gpu_caveat(gpu, setup: TrainingSetup) -> tuple[str, str] | None:
    """(reason, words) when the GPU named is not one whose CUDA kernels were measured (``KERNEL_FACT_GPUS``)."""
    if gpu is None or gpu.name in KERNEL_FACT_GPUS:
        return None
    words = f"kernel facts measured on an {CUDA.gpu}; not validated on the {gpu.label}"
    if gpu.label.startswith("AMD"):
        words += " (an AMD GPU runs ROCm/HIP, not CUDA: other attention kernels, another allocator)"
    else:
        words += " (other attention kernels or multiprocessor count change the fused attention's and row sums' scratch)"
    if setup.precision != "fp32" and "bf16" not in gpu.peak:
        words += f"; the {gpu.label} has no bf16"
    return f"not validated on the {gpu.name}", words


def cuda_exactness(cfg: ModelConfig, setup: TrainingSetup, impl: str, predicted_by: str | None, gpu) -> Exactness:
    """How a cuda step is proven: exact only for an architecture the H200 measured (``gpu_unmeasured`` empty), with
    our model's code (``--impl course``), on a GPU with the H200's kernels (``KERNEL_FACT_GPUS``; none named:
    --budget)."""
    caveat = gpu_caveat(gpu, setup)
    unmeasured = gpu_unmeasured(cfg)
    hf_run = hf_cuda_run(cfg.hf_model_type, setup.attention) if impl == "transformers" else None
    run = hf_run or CUDA
    if hf_run:
        reason = ""
        words = f"exact: the op library's transformers program (analytic/ops), {hf_run.phrase('hf_memory')}"
    elif impl != "course":
        reason, words = "not validated on a GPU", step_exactness(impl, "cuda")
    elif unmeasured:
        reason = "this architecture was not run on a GPU"
        words = (
            "prediction from the H200-validated CUDA kernel facts (analytic/cuda_kernels.py, ops.cuda); no GPU ran "
            f"this architecture's {', '.join(unmeasured)}"
        )
    elif predicted_by == "ops":
        reason, words = "", f"exact: the op library's course program (analytic/ops), {CUDA.program_phrase()}"
    else:
        equal, total = CUDA.equal["memory"]
        words = f"exact: the legacy replay (analytic/replay.py), {CUDA.phrase('memory')}"
        if equal < total:
            program, _ = CUDA.program_equal
            missed = total - equal
            words += (
                f"; for {LEGACY_MISS} ({missed:,} figure{'s' if missed > 1 else ''} it misses) memory uses the op "
                f"library's course program, which equals {program:,} of {total:,}"
            )
        reason = ""
    if caveat:
        reason = caveat[0] if not reason else f"{reason}; {caveat[0]}"
        words = f"{caveat[1]}; {words.removeprefix('exact: ')}"
    return Exactness(not reason, run.gpu if not reason else None, reason, words)


MEASURE_METHODS = {"tracker": "traced", "allocator": "plain", "cuda": "plain"}
"""How a measurement was taken -> which prediction it compares with."""


@dataclass(frozen=True)
class MemoryAccount(Result):
    SCHEMA: ClassVar[str] = "lm-accounting/memory/8"

    config: ModelConfig
    seq: int
    batch: int
    dtype: str  # the parameters' dtype (fp32 under amp-bf16)
    optimizer: str
    budget_basis: MemoryBudget  # the budget per GPU and how it was derived (gpus.memory_budget)
    device: str  # the device the implementation-exact prediction is for
    # course convention (CS336 adamwAccounting; None for an architecture other than the course's)
    course: CoursePeak | None
    course_linear: tuple[int, int] | None  # (a, b): peak = a·B + b under the course convention
    course_max_batch: int | None
    # implementation-exact (our live model); the replayed parts are None where the replay does not
    # model the architecture (``ModelConfig.unsupported_for_replay``): then only model states are exact
    states: Breakdown
    step_temporaries: int
    step_counters: int
    saved: Breakdown | None
    step: StepMemory | None  # the plain run
    peak_lines: StepPeakLines | None  # of the plain run
    max_batch: int | None
    max_context: int | None
    # for comparison, and inference
    korthikanti: int | None
    kv_cache: int
    setup: TrainingSetup = DEFAULT_SETUP
    step_traced: StepMemory | None = None  # what the storage tracker sees
    gap: dict[str, int] | None = None  # traced − plain peak per phase (replay.traced_minus_plain)
    flops: StepFlops | None = None
    cpu_threads: int = 1
    measured: StepMemory | None = None
    measured_on: str | None = None
    measured_method: str | None = None  # tracker (traced), allocator (plain, cpu) or cuda (plain)
    impl: str = "course"  # the model code predicted (``implementations``)
    predicted_by: str | None = "replay"  # the step's source: "replay" (replay.py), "ops" (analytic/ops), None: none
    unmodelled: tuple[str, ...] | None = None  # what the implementation's program lacks (None: the replay's list)

    @property
    def exactness(self) -> Exactness | None:
        """How the step is proven on its device (None: no step predicted): on cuda ``cuda_exactness``; on meta
        and cpu the storage tracker (the CPU allocator for a plain cpu run)."""
        if self.step is None:
            return None
        if self.device == "cuda":
            return cuda_exactness(self.config, self.setup, self.impl, self.predicted_by, self.budget_basis.gpu)
        if self.predicted_by == "ops":
            words = step_exactness(self.impl, self.device)
        else:
            words = f"exact: equal to the storage tracker's count on meta and CPU byte for byte (torch {CPU_TORCH})"
        exact = words.startswith("exact")
        return Exactness(exact, self.device if exact else None, "" if exact else "not validated", words)

    @property
    def budget(self) -> int:
        """The bytes the step peak must fit in: the GPU's CUDA total less the allowance, or as given."""
        return self.budget_basis.usable

    @property
    def fits(self) -> bool | None:
        """Whether the requested batch's step peak (plain run) is within the budget (the allowance for
        the CUDA context, communication buffers and fragmentation is already out of it, as under a
        layout).  Where the replay does not model the step: False when the model states alone
        (parameters, gradients, AdamW m and v, all live at the end of backward) exceed the budget, else
        None (not known)."""
        if self.step is None:
            return False if self.states.total > self.budget else None
        return self.step.peak <= self.budget

    @property
    def compared(self) -> StepMemory:
        """The prediction a measurement compares with: traced for the tracker, plain otherwise."""
        if self.measured_method == "tracker" and self.step_traced is not None:
            return self.step_traced
        return self.step

    def with_measurement(self, step: StepMemory, device: str, method: str | None = None) -> MemoryAccount:
        """This account with a measured step attached.  ``method``: "tracker" (the storage tracker on
        meta or cpu: compares with ``step_traced``), "allocator" (cpu, no dispatch mode: compares with
        ``step``) or "cuda" (the caching allocator: ``step``, up to its rounding); default: cuda on
        cuda, else tracker.  The prediction is redone for ``device`` when it differs (on the CPU,
        AdamW's step counters sit beside the model)."""
        method = method or ("cuda" if device == "cuda" else "tracker")
        if method not in MEASURE_METHODS:
            raise ValueError(f"unknown measurement method {method!r} ({', '.join(MEASURE_METHODS)})")
        if device != self.device and self.predicted_by == "ops":
            raise ValueError(f"predict the {self.impl} program for {device} before attaching its measurement")
        base = (
            self
            if device == self.device
            else memory_account(
                self.config,
                self.seq,
                self.batch,
                budget=self.budget_basis,
                device=device,
                setup=self.setup,
                cpu_threads=self.cpu_threads,
            )
        )
        return replace(base, measured=step, measured_on=device, measured_method=method)

    @property
    def not_modelled(self) -> list[str]:
        """The architecture options the step replay does not model under this setup (empty: the step is
        predicted; ``replay.replay_unsupported``, or the implementation program's own list)."""
        if self.unmodelled is not None or self.predicted_by == "ops":
            return list(self.unmodelled or ())
        return replay_unsupported(self.config, self.setup)

    @property
    def no_lines(self) -> str | None:
        """Why the peak is not given as lines in the batch (the step itself is exact), or None."""
        if self.predicted_by == "ops":  # the program replayed at the batch itself (``program_report.batch_lines``)
            return f"its mixture of experts at context {self.seq:,}" if self.step and not self.peak_lines else None
        if self.predicted_by != "replay":
            return None
        missing = replay_unsupported(self.config, self.setup, self.seq)[len(self.not_modelled) :]
        return missing[0] if self.step is not None and missing else None

    def validated(self) -> dict[str, Any] | None:
        """The GPU run that validates an exact cuda step, as its table counts it for the code that predicted it
        (the legacy replay's count, or the op library's), else None."""
        how = self.exactness
        if how is None or not how.exact or self.device != "cuda":
            return None
        record = CUDA.to_dict("memory")
        if self.predicted_by == "ops":
            record["equal"], record["compared"] = CUDA.program_equal
        return {
            **record,
            "code": "analytic/ops (course program)" if self.predicted_by == "ops" else "analytic/replay.py",
        }

    def to_dict(self) -> dict[str, Any]:
        setup = self.setup
        measured = None
        if self.measured is not None:
            measured = {
                "device": self.measured_on,
                "method": self.measured_method,
                "compared_with": "step_traced" if MEASURE_METHODS[self.measured_method] == "traced" else "step",
                **self.measured.to_dict(),
            }
        return {
            "schema": self.SCHEMA,
            "config": self.config.resolved(),
            "context": self.seq,
            "batch": self.batch,
            "dtype": self.dtype,
            "optimizer": self.optimizer,
            "setup": {
                "attention": setup.attention,
                "checkpoint": setup.checkpoint,
                "precision": setup.precision,
                "optimizer": setup.optimizer,
                "label": setup.label,
            },
            "implementation": {
                **implementation_dict(self.config, self.impl, self.setup),
                "predicted_by": self.predicted_by,
            },
            "budget_bytes": self.budget,
            "budget_basis": self.budget_basis.to_dict(),
            "model_flops": self.flops.model if self.flops else None,
            "hardware_flops": self.flops.hardware if self.flops else None,
            "course_convention": None
            if self.course is None
            else {
                "source": COURSE_SOURCE,
                "assumptions": COURSE_ASSUMPTIONS,
                "peak_at_batch": self.course.to_dict(),
                "a_bytes_per_sequence": self.course_linear[0],
                "b_bytes": self.course_linear[1],
                "max_batch": self.course_max_batch,
            },
            "implementation_exact": {
                "device": self.device,
                "assumptions": EXACT_ASSUMPTIONS if self.predicted_by != "ops" else program_assumptions(self),
                **(
                    self.exactness.to_dict()
                    if self.exactness
                    else {"exact": None, "validated_on": None, "exactness": None}
                ),
                "validated": self.validated(),
                "model_states": self.states.to_dict(),
                "adamw_step_temporaries": self.step_temporaries,
                "adamw_step_counters": self.step_counters,
                "not_modelled": self.not_modelled,
                "activations": None if self.saved is None else self.saved.to_dict(),
                "step": None
                if self.step is None
                else {**self.step.to_dict(), "peak_phase": self.step.peak_phase, "run": "plain"},
                "step_traced": None
                if self.step_traced is None
                else {**self.step_traced.to_dict(), "peak_phase": self.step_traced.peak_phase, "run": "traced"},
                "traced_minus_plain": self.gap,
                "peak_lines": None if self.peak_lines is None else self.peak_lines.to_dict(),
                "fits_budget": self.fits,
                "max_batch": self.max_batch,
                "max_context_at_batch_1": self.max_context,
            },
            "korthikanti_activations": self.korthikanti,
            "inference": {
                "weights": self.states["parameters"].total,
                "kv_cache": self.kv_cache,
                "total": self.states["parameters"].total + self.kv_cache,
            },
            "measured": measured,
        }

    def records(self) -> list[dict[str, Any]]:
        """Tidy rows, one fact each, the same keys on every row:
        section, key, label, quantity, predicted, measured, unit."""
        rows: list[dict[str, Any]] = []

        def add(section, key, label, quantity, predicted, unit="bytes", measured=None):
            rows.append(
                dict(
                    section=section,
                    key=key,
                    label=label,
                    quantity=quantity,
                    predicted=predicted,
                    measured=measured,
                    unit=unit,
                )
            )

        sec = "course_convention"
        a, b = self.course_linear or (None, None)
        for key, value in (self.course.to_dict() if self.course else {}).items():
            add(sec, key, f"{key} at batch {self.batch} (course convention)", "bytes", value)
        if self.course is not None:
            add(sec, "a", "peak = a·B + b: a, bytes per sequence (course convention)", "a", a, "bytes/sequence")
            add(sec, "b", "peak = a·B + b: b = 16·N (course convention)", "b", b)
            add(
                sec,
                "max_batch",
                "largest batch within the budget (course convention)",
                "max_batch",
                self.course_max_batch,
                "sequences",
            )

        sec = "implementation_exact.model_states"
        for it in self.states:
            add(sec, it.key, it.label, "bytes", it.total)
        add(sec, "adamw.step_temporaries", f"AdamW step temporaries ({self.optimizer})", "bytes", self.step_temporaries)
        add(sec, "adamw.step_counters", f"AdamW step counters on {self.device}", "bytes", self.step_counters)
        for it in self.saved or ():
            add("implementation_exact.activations", it.key, it.label, "bytes", it.total)

        how = self.exactness
        if how is not None:
            where = how.validated_on or how.reason
            add(
                "implementation_exact.exactness",
                "exact",
                f"whether the step is exact on {self.device} ({where})",
                "exact",
                how.exact,
                "",
            )
        got = self.measured
        runs = [("implementation_exact.step", self.step, "plain run")] if self.step is not None else []
        if self.step_traced is not None:
            runs.append(("implementation_exact.step_traced", self.step_traced, "traced run (storage tracker)"))
        for sec, step, run in runs:
            mine = got is not None and step is self.compared
            m0 = got if mine else None
            add(
                sec,
                "baseline",
                f"live when the step starts ({run})",
                "bytes",
                step.baseline,
                measured=m0 and m0.baseline,
            )
            for name, p in step.phases().items():
                m = m0.phase(name) if m0 else None
                add(sec, name, f"{PHASE_LABELS[name]}: peak ({run})", "peak", p.peak, measured=m and m.peak)
                add(sec, name, f"{PHASE_LABELS[name]}: end ({run})", "end", p.end, measured=m and m.end)
        for name, extra in (self.gap or {}).items():
            add(
                "implementation_exact.traced_minus_plain",
                name,
                f"{PHASE_LABELS[name]}: traced − plain peak",
                "bytes",
                extra,
            )
        if self.flops is not None:
            add("flops", "model_flops", "model FLOPs of the step (3 × forward)", "flops", self.flops.model, "FLOPs")
            add(
                "flops",
                "hardware_flops",
                "hardware FLOPs of the step (with recompute)",
                "flops",
                self.flops.hardware,
                "FLOPs",
            )

        sec = "implementation_exact.peak_lines"
        lines = self.peak_lines
        pieces = (
            [(name, i, line) for name, p in lines.phases().items() for i, line in enumerate(p.lines, 1)]
            if lines
            else []
        )
        pieces += [("step", i, line) for i, (_, line) in enumerate(lines.step_lines(), 1)] if lines else []
        for name, i, line in pieces:
            key, span = f"{name}.{i}", batch_span(line)
            add(sec, key, f"{name} peak = a·B + b for {span}: a", "a", line.a, "bytes/sequence")
            add(sec, key, f"{name} peak = a·B + b for {span}: b", "b", line.b)
            add(sec, key, f"{name}: first batch of this line", "from_batch", line.first, "sequences")
            add(sec, key, f"{name}: last batch of this line (empty: no end)", "to_batch", line.last, "sequences")

        if self.not_modelled:
            add(
                "implementation_exact.not_modelled",
                "not_modelled",
                "architecture options the step replay does not model (no activations, peaks or capacity)",
                "options",
                list(self.not_modelled),  # one CSV cell, joined by ";" (views.tables._csv_cell)
                "",
            )
            add(
                "implementation_exact.capacity",
                "fits",
                "the model states alone exceed the budget (False), else not known (empty)",
                "fits",
                self.fits,
                "",
            )
        else:
            sec = "implementation_exact.capacity"
            add(sec, "fits", f"the step peak at batch {self.batch:,} fits the budget", "fits", self.fits, "")
            add(
                sec,
                "max_batch",
                f"largest batch that fits (context {self.seq:,})",
                "max_batch",
                self.max_batch,
                "sequences",
            )
            add(sec, "max_context", "largest context that fits at batch 1", "max_context", self.max_context, "tokens")
            add(
                "comparison",
                "korthikanti.activations",
                "Korthikanti et al. 2022 activations",
                "bytes",
                self.korthikanti,
            )
        add("inference", "weights", f"weights ({self.dtype})", "bytes", self.states["parameters"].total)
        add("inference", "kv_cache", f"KV cache ({self.dtype})", "bytes", self.kv_cache)
        return rows


def batch_span(line) -> str:
    """'B = 1', 'B = 1..2' or 'B ≥ 3'."""
    if line.last is None:
        return f"B ≥ {line.first:,}"
    return f"B = {line.first:,}" if line.last == line.first else f"B = {line.first:,}..{line.last:,}"


def memory_account(
    cfg: ModelConfig,
    seq: int,
    batch: int,
    dtype: str | None = None,
    optimizer: str | None = None,
    budget: int | MemoryBudget | None = None,
    device: str = "meta",
    *,
    setup: TrainingSetup | None = None,
    cpu_threads: int = 1,
) -> MemoryAccount:
    """The memory account of a training step at (seq, batch) under ``setup`` (or, as before, pure
    ``dtype`` with AdamW ``optimizer``, default foreach); the implementation-exact part is predicted
    for ``device``: "cuda" runs CUDA's fused attention kernels (``analytic.sizes.Sizes.lse``,
    ``merge_copy``; fp32 with grouped KV heads has none: refused), "meta" the CPU flash kernel's
    layout; "cpu" adds the AdamW step counters of the for-loop and foreach implementations, and the
    CPU allocator's own extras to the plain run, see ``replay``.  The capacity figures (lines,
    largest batch and context) are for the plain run.  ``budget``: a ``gpus.MemoryBudget``, bytes as
    given, or (None) the default GPU's CUDA total less the default allowance."""
    check_device(device)
    basis = as_budget(budget)
    budget = basis.usable
    setup, dtype = as_setup(setup, dtype, optimizer, default_optimizer="foreach")
    if device == "cuda" and setup.attention == "sdpa":
        check_cuda_fused_attention(cfg.kv_heads < cfg.num_heads, setup.precision == "fp32")
    optimizer = setup.optimizer
    if replay_unsupported(cfg, setup):
        return states_only_account(cfg, seq, batch, dtype, setup, basis, device, cpu_threads)
    course = cfg.course_architecture  # the course convention describes the course model only (not MoE)
    a, b = course_linear_in_batch(cfg, seq) if course else (None, None)
    kw = dict(setup=setup)
    # a mixture of experts whose split differs by batch: the step is exact at this batch, without lines in B
    lines = peak_lines_in_batch(cfg, seq, device=device, mode="plain", **kw) if moe_lines_in_batch(cfg, seq) else None
    return MemoryAccount(
        config=cfg,
        seq=seq,
        batch=batch,
        dtype=dtype,
        optimizer=optimizer,
        budget_basis=basis,
        device=device,
        course=course_peak(cfg, seq, batch) if course else None,
        course_linear=(a, b) if course else None,
        course_max_batch=max_batch(a, b, budget) if course else None,
        states=model_state_breakdown(cfg, dtype),
        step_temporaries=adamw_step_temporary_bytes(cfg, dtype, optimizer),
        step_counters=adamw_step_counter_bytes(cfg, optimizer, device),
        saved=saved_activation_breakdown(cfg, seq, batch, setup=setup, device=device),
        step=predict_training_step(cfg, seq, batch, device=device, mode="plain", cpu_threads=cpu_threads, **kw),
        peak_lines=lines,
        max_batch=lines.max_batch(budget) if lines else None,
        max_context=max_context_that_fits(cfg, budget, 1, device=device, mode="plain", **kw),
        korthikanti=korthikanti_activation_bytes(cfg, seq, batch) if course else None,
        kv_cache=kv_cache_bytes(cfg, seq, batch, dtype),
        setup=setup,
        step_traced=predict_training_step(cfg, seq, batch, device=device, mode="traced", **kw),
        gap=traced_minus_plain(cfg, seq, batch, setup=setup, device="meta" if device == "cpu" else device),
        flops=step_flops(cfg, seq, batch, setup),
        cpu_threads=cpu_threads,
    )


def states_only_account(
    cfg: ModelConfig,
    seq: int,
    batch: int,
    dtype: str,
    setup: TrainingSetup,
    budget: MemoryBudget,
    device: str,
    cpu_threads: int,
) -> MemoryAccount:
    """The account of an architecture the step replay does not model (MoE, MLA, GPT-2, Gemma, ...):
    exact model states (every expert's weights, gradients and AdamW moments), AdamW step temporaries and
    counters, the KV cache and the step FLOPs; no activations, phase peaks or capacity (None), and no
    course convention, which describes the course model only."""
    return MemoryAccount(
        config=cfg,
        seq=seq,
        batch=batch,
        dtype=dtype,
        optimizer=setup.optimizer,
        budget_basis=budget,
        device=device,
        course=None,
        course_linear=None,
        course_max_batch=None,
        states=model_state_breakdown(cfg, dtype),
        step_temporaries=adamw_step_temporary_bytes(cfg, dtype, setup.optimizer),
        step_counters=adamw_step_counter_bytes(cfg, setup.optimizer, device),
        saved=None,
        step=None,
        peak_lines=None,
        max_batch=None,
        max_context=None,
        korthikanti=None,
        kv_cache=kv_cache_bytes(cfg, seq, batch, dtype),
        setup=setup,
        flops=step_flops(cfg, seq, batch, setup),
        cpu_threads=cpu_threads,
        predicted_by=None,
    )
