"""The view of a ``ParallelMemory``: the worst rank's memory, phases (predicted vs measured),
collectives and FLOPs."""

from __future__ import annotations

from ..analytic.collectives import step_collectives, totals, wire_bytes
from ..analytic.context_parallel import rank_collectives
from ..analytic.parallel_report import ParallelMemory
from ..implementations import program_label
from ..phases import PHASE_LABELS, PHASES
from ..provenance import CPU_TORCH, CUDA
from .account import describe_config
from .memory import budget_verdict
from .plan import efficiency_words
from .tables import Column, Table, View
from .words import plural

UNSHARDED_ALL = {
    0: "none: DDP, no FSDP2",
    1: "none: ZeRO-1, no FSDP2",
    2: "held forward→backward (zero 2)",
    3: "not held: zero 3 reshards each unit after its forward (what zero 2 would hold)",
}
"""The note of the layout view's 'every unit unsharded' row, by ZeRO stage."""
STAGE_UNSHARDED = {
    2: "held from the first forward to the step's end (pipeline: no reshard after backward)",
    3: "held from each backward to the next forward (pipeline: no reshard after backward)",
}
"""The same beside pipeline parallel (collectives rule 9)."""
ONE_RANK = "none: one data-parallel rank"


def _unsharded_note(lay) -> str:
    if lay.dp == 1:
        return ONE_RANK
    return STAGE_UNSHARDED[lay.zero] if lay.pp > 1 and lay.fsdp else UNSHARDED_ALL[lay.zero]


def _parameters_note(lay) -> str:
    where = "FSDP2: padded dim-0 shards" if lay.fsdp else "TP-local" if lay.tp > 1 else "whole"
    if lay.replicate > 1:
        where = f"HSDP: padded dim-0 shards over a shard group of {lay.shard}, replicated {lay.replicate} times"
        if lay.ep > 1:  # torchtitan's dp_shard_mod_ep: the expert stacks over the shard ranks holding them
            where += f"; the experts over the {lay.shard // lay.ep} shard ranks holding the same 1/{lay.ep} of them"
    return f"this stage's share, {where}" if lay.pp > 1 else where


def _gradients_note(lay) -> str:
    if lay.pp > 1 and lay.fsdp and lay.dp > 1:  # collectives rule 9
        return (
            "after the step's reduce-scatter; through the backward unsharded (fp32 sums under amp): no sync until then"
        )
    return "as the parameters"


TRACED_LABEL = (
    "rank 0's step as the storage tracker sees it on {device} (CPU kernel facts); CUDA under a layout not modelled"
)
"""What an op-library rank's figure is (``parallel_report.implementation_rank``): never a CUDA prediction."""


def step_time_line(r: ParallelMemory) -> str:
    """The layout's step by ``plan``'s time model (the figure ``plan`` prints for this layout), or why none."""
    e = r.step_time
    if e is None:
        return f"step time: none ({r.step_time_note})"
    exposed = e.exposed_communication
    return (
        f"step {e.step_seconds:,.4f} s ({e.times[0]:,.4f} s compute, {exposed:,.4f} s exposed communication) · "
        f"MFU {e.mfu:.1%} · HFU {e.hfu:.1%} · {efficiency_words(e.calibration, e.efficiency)}"
    )


def saved_note(r: ParallelMemory) -> str:
    """How the rank's saved activations are found: per component (TP/SP split), or under ``--checkpoint op`` the
    ZeRO-3 rank's traced forward end less its baseline (``ops.data_parallel``)."""
    if not r.step:
        return "NOT MODELLED"
    if r.setup.checkpoint == "op":
        return "op: the ZeRO-3 rank's forward end less its baseline"
    return "TP/SP split per component"


def parallel_view(r: ParallelMemory) -> View:
    if r.impl != "course":
        return _implementation_view(r)
    lay, st = r.layout, r.states
    where = f"data-parallel rank {st.rank}" + (f", pipeline stage {r.stage}" if r.stage is not None else "")
    header = [
        describe_config(r.config),
        _layout_line(r, where),
        f"--impl course: {program_label(r.config, 'course', r.setup)} (the default under a layout; --impl transformers covers DDP, ZeRO-1 and FSDP2 data parallel)"
        + ("; context parallel runs the fused kernel as ring attention, sdpa its only attention" if lay.cp > 1 else ""),
    ]
    header.append(step_time_line(r))
    ex = r.experts()
    if ex is not None:
        header.append(
            f"routed experts on this rank: {ex['local_experts']:,} of {r.config.num_experts:,}, running "
            f"{ex['rows_per_moe_layer']:,} token rows per MoE layer ({ex['slots_per_moe_layer']:,} slots T·k routed "
            "from this rank; balanced routing)"
        )
    per_gpu = Table(
        "Per-GPU memory of the worst rank (model states sharded by the data-parallel degree, HSDP's shard degree, "
        "never the world)",
        [Column("quantity"), Column("bytes", "bytes"), Column("note")],
        [
            ("parameters", st.parameters, _parameters_note(lay)),
            ("gradients", st.gradients, _gradients_note(lay)),
            ("optimizer state (AdamW m, v)", st.optimizer, "FSDP2: the real rows; ZeRO-1: owned tensors"),
            ("DDP gradient buckets", st.ddp_buckets, ONE_RANK if lay.dp == 1 else "gradient_as_bucket_view=False"),
            ("FSDP2: every unit unsharded", st.unsharded_all, _unsharded_note(lay)),
            (
                "FSDP2: largest unit unsharded",
                st.unsharded_unit_max,
                "all-gather dtype" if lay.fsdp else ONE_RANK if lay.dp == 1 else UNSHARDED_ALL[lay.zero],
            ),
            ("saved activations", r.activations, saved_note(r)),
        ],
    )
    measured = r.measured
    fit = Table(
        "Does it fit?",
        [Column("quantity"), Column("bytes", "bytes")],
        [
            ("peak (plain run)", r.peak),
            *(
                []
                if r.budget_basis.given
                else [(f"{r.budget_basis.gpu.name}: CUDA total", r.budget_basis.gpu.cuda_total)]
            ),
            *([] if r.budget_basis.given else [("allowance: CUDA context + NCCL + fragmentation", r.allowance)]),
            ("budget", r.budget),
        ],
        [r.budget_basis.rule]
        + (
            [f"peak {budget_verdict(r.peak, r.budget)}"]
            if r.step is not None
            else [
                f"activations, phases and peaks NOT MODELLED ({'; '.join(r.not_modelled)}); the model states "
                f"alone (exact) are {st.total:,} bytes"
                + (f": {budget_verdict(st.total, r.budget)}" if st.total > r.budget else "")
            ]
        ),
    )
    comm = Table(
        "Collectives of one step on this rank (payload = the unsharded buffer; wire = ring bytes sent)",
        [
            Column("collective"),
            Column("group"),
            Column("phase"),
            Column("count", "int"),
            Column("payload", "bytes"),
            Column("wire", "bytes"),
            Column("rule"),
        ],
        [
            (c.kind, c.group, c.phase, c.count, c.payload, wire_bytes(c, r.group_size(c.group)), c.formula)
            for c in r.collectives
        ],
    )
    tables = [per_gpu, *([_phases(r)] if r.step is not None else []), *_plain_cpu(r), fit, comm]
    if measured is not None:
        dp_rank = measured.rank // r.layout.tp
        if r.layout.cp > 1:  # the flattened layout's and the ring's (``analytic.context_parallel``)
            want = totals(rank_collectives(r.config, r.seq, r.batch, r.setup, r.layout, rank=dp_rank))
        else:
            want = totals(
                step_collectives(
                    r.config, r.seq, r.batch, r.setup, r.layout, first_step=True, rank=dp_rank, stage=r.stage or 0
                )
            )
        kinds = sorted(set(want) | set(measured.collectives))
        who = f"pipeline stage {measured.rank}" if r.layout.pp > 1 else f"rank {measured.rank}"
        tables.append(
            Table(
                f"Collectives of the first step: predicted vs measured on {who} (fake process group)",
                [Column("collective"), Column("count", "int"), Column("measured", "int"), Column("bytes", "bytes")]
                + [Column("measured bytes", "bytes")],
                [
                    (
                        k,
                        *want.get(k, (0, 0))[:1],
                        measured.collectives.get(k, (0, 0))[0],
                        want.get(k, (0, 0))[1],
                        measured.collectives.get(k, (0, 0))[1],
                    )
                    for k in kinds
                ],
            )
        )
    f = r.flops
    flops = [("model FLOPs (3 × local forward)", f.model), ("hardware FLOPs (+ recompute)", f.hardware)]
    if measured is not None and measured.local_flops is not None:
        flops.append(("measured: local matmul FLOPs (forward + backward, LocalFlops)", measured.local_flops))
    tables.append(
        Table("Per-rank matmul FLOPs of one step (local ops only)", [Column("quantity"), Column("FLOPs", "int")], flops)
    )
    footer = [
        (
            f"Proof: one rank of the real job (torch {CPU_TORCH}'s FSDP2, DTensor, DDP, PipelineStage) on the fake"
            " process group; model states, ends of phases and collectives exact"
            + (", and the peaks too" if r.peaks_exact else "; the peaks are estimates for this layout")
            + f".  On CUDA streams one rank was {CUDA.phrase('parallel')}."
            + (
                "  HSDP (--replicate) was not among them: its CUDA run is not measured."
                if r.layout.replicate > 1
                else ""
            )
            + (
                "  --checkpoint op ran there under FSDP2 only: its CUDA run under DDP or ZeRO-1 is not measured."
                if r.setup.checkpoint == "op" and not r.layout.fsdp
                else ""
            )
        ),
    ]
    if lay.virtual_stages > 1:
        footer = [  # not run on the fake process group: no proof line
            (
                f"Interleaved 1F1B, {lay.virtual_stages} chunks per pipeline rank (model stages rank + j·{lay.pp}):"
                " model states, baseline, receive buffers, FLOPs and sends/receives are each chunk's exact rule"
                " summed; "
                + (
                    "every phase replayed along torch's ScheduleInterleaved1F1B order (beside FSDP2 along the"
                    " runtime's UNSHARD, RESHARD and REDUCE_GRAD actions), byte-exact against the rank's"
                    " PipelineStages on the fake process group (alone, beside DDP, ZeRO-1, FSDP2 or TP)."
                    if r.peaks_exact
                    else "the peaks an ESTIMATE for this layout (the chunks' saved activations in flight along"
                    " the interleaved order)."
                )
            )
        ]
    elif lay.pp > 1 and not r.peaks_exact:
        footer.append(
            "The stage peaks are estimates: baseline, receive buffers, k saved micro-batches and the gradients"
            " (each backward's transient left out)."
        )
    if lay.tp > 1 and lay.dp > 1 and not lay.fsdp:
        footer.append(
            f"{lay.label}: DDP and ZeRO-1 with TP are not run on the fake process group (torch 2.13's DDP takes no"
            " DTensor parameters): every figure here is composed from the DDP and TP rules, each exact alone, and"
            " the peaks are estimates."
        )
    if r.measured is not None and lay.pp > 1:
        footer.append(
            f"Measured: pipeline {'rank' if lay.virtual_stages > 1 else 'stage'} {r.measured.rank} under torch's"
            f" PipelineStage + {'ScheduleInterleaved1F1B' if lay.virtual_stages > 1 else 'Schedule1F1B'} on the fake"
            " process group: its model states, phases, collectives, sends and receives, and the matmul FLOPs of"
            " its m micro-batches."
        )
    if lay.ep > 1:
        footer.append(
            "Expert parallel: model states, collectives (the all-to-alls included), per-rank FLOPs and, in fp32,"
            " bf16 and amp-bf16, every phase's peak and end (this rank's dispatch and combine buffers and its"
            " experts' own FSDP2 unit replayed) are exact against the fake-PG job (model/moe.py's"
            " all_to_all_single path)."
        )
    return View(header, tables, footer)


def _layout_line(r: ParallelMemory, where: str, who: str = "worst rank") -> str:
    lay = r.layout
    return (
        f"layout {lay.label} on {plural(lay.world, 'GPU')} · setup {r.setup.label} · context {r.seq:,} · "
        f"micro-batch {r.batch:,} per rank · {who}: {where}"
    )


def _implementation_view(r: ParallelMemory) -> View:
    """``--impl transformers`` under FSDP2, DDP or transformers' own TP: rank 0's traced step (the op library's),
    beside the fake-PG job's."""
    label, tp, ddp = TRACED_LABEL.format(device=r.device), r.layout.tp > 1, not r.layout.fsdp and r.layout.tp == 1
    wrapper = "fully_shard on every decoder layer then the root"
    if ddp:
        wrapper = (
            "DistributedDataParallel around it as the HF Trainer builds it (25 MiB buckets, "
            "gradient_as_bucket_view=False)" + (", ZeroRedundancyOptimizer around AdamW" if r.layout.zero else "")
        )
    if tp:
        wrapper = (
            "its own TP plan as DistributedConfig(tp_size=...) applies it (q/k/v, gate/up colwise; o, down rowwise; "
            "embed_tokens embedding_rowwise; lm_head colwise_gather_output)"
            + (
                ", then fully_shard on every decoder layer then the root over the mesh's dp dimension"
                if r.layout.fsdp
                else ""
            )
        )
    where, who = "rank 0 (every FSDP2 chunk full)", "worst rank"
    if ddp:
        where = "rank 0 (every DDP rank alike)"
    if ddp and r.layout.zero:
        where, who = "rank 0 (the AdamW state of the tensors it owns; ZeRO-1's ranks differ)", "rank"
    if tp and not r.layout.fsdp:
        where = "rank 0 (every TP rank alike: tp divides every sharded dim)"
    header = [
        describe_config(r.config),
        _layout_line(r, where, who),
        f"--impl {r.impl}: {program_label(r.config, r.impl, r.setup)}, {wrapper}",
        f"figures: {label}",
    ]
    m, step = r.measured, r.step_traced
    rows = [("baseline (step start)", step.baseline, m.baseline if m else None, None, None)]
    for name in PHASES:
        p, g = step.phase(name), m.phase(name) if m else None
        rows.append((PHASE_LABELS[name], p.peak, g.peak if g else None, p.end, g.end if g else None))
    notes = [] if m is None else ["equal, phase by phase" if m == step else "DIFFERS from the measurement"]
    phases = Table(
        f"Peak and end of each phase: {label}"
        + ("; measured: the fake-PG job over transformers' own model" if m else "")
        + (" (on real CPU tensors: FakeTensors change TP's transient peaks)" if m and tp else ""),
        [Column("phase")] + [Column(c, "bytes") for c in ("peak", "measured", "end", "measured end")],
        rows,
        notes,
    )
    fit = Table(
        "Does it fit? (the traced peak: CUDA's kernels under a layout are not modelled)",
        [Column("quantity"), Column("bytes", "bytes")],
        [("peak (rank 0, traced)", step.peak), ("budget", r.budget)],
        [r.budget_basis.rule, f"traced peak {budget_verdict(step.peak, r.budget)}"],
    )
    f = r.flops
    flops = Table(
        "Per-rank matmul FLOPs of one step (local ops only)",
        [Column("quantity"), Column("FLOPs", "int")],
        [("model FLOPs (3 × local forward)", f.model), ("hardware FLOPs (+ recompute)", f.hardware)],
    )
    tables = [phases, fit, flops]
    if ddp or tp:
        tables.append(
            Table(
                "Collectives of one step on this rank ("
                + ("payload = the buckets" if ddp else "payload = the largest tensor of each call")
                + "; wire = ring bytes sent)",
                [Column(c) for c in ("collective", "phase")]
                + [Column("count", "int"), Column("payload", "bytes"), Column("wire", "bytes"), Column("rule")],
                [
                    (c.kind, c.phase, c.count, c.payload, wire_bytes(c, r.group_size(c.group)), c.formula)
                    for c in r.collectives
                ],
                ["and one broadcast of the module buffers (the rotary tables) per forward (broadcast_buffers=True)"]
                if ddp
                else ["FSDP2's all-gathers and reduce-scatters over the dp dimension are not listed"]
                if r.layout.fsdp
                else [],
            )
        )
    if ddp:
        proof = (
            f"Proof: ops.predict_step(impl={r.impl!r}, layout=...) equals rank 0 of torch {CPU_TORCH}'s "
            "DistributedDataParallel around transformers' model on the fake process group, and its bucket "
            "all-reduces the job's (tests/test_ops_ddp.py; ZeRO-1's ZeroRedundancyOptimizer too).  "
            "find_unused_parameters=True (the HF Trainer's default without gradient checkpointing; "
            "--[no-]find-unused-parameters) is in the figures when on: the reducer's two int32 used-parameter maps "
            "(8 bytes per parameter tensor on this CPU job, 4 of them on a GPU) and the map's all-reduce, listed "
            "above, exact on real CPU tensors.  The per-GPU model states are shown for --impl course only."
        )
    elif tp:
        proof = (
            f"Proof: ops.predict_step(impl={r.impl!r}, layout=...) equals rank 0 of transformers' own tensor parallel "
            f"(apply_tensor_parallelism, DTensor, torch {CPU_TORCH}) on the fake process group, phase by phase, and "
            "its collectives the job's, in order (tests/test_ops_tp.py, tests/test_ops_tp_families.py: the Llama-plan "
            "families, tp 2 and 4, alone and beside FSDP2 ZeRO-2/3); the per-GPU model states are shown for --impl course only."
        )
    else:
        proof = (
            f"Proof: ops.predict_step(impl={r.impl!r}, layout=...) equals rank 0 of torch {CPU_TORCH}'s FSDP2 over "
            "transformers' decoder layers on the fake process group (tests/test_ops_fsdp.py; the hybrids: "
            "tests/test_ops_transformers_fsdp_hybrid.py); the per-GPU model states and collectives are shown for "
            "--impl course only."
        )
    return View(header, tables, [proof])


def _plain_cpu(r: ParallelMemory) -> list[Table]:
    """``--measure cpu --measure-method allocator``: the plain run, predicted for CPU tensors, beside the
    CPU allocator's own events (no dispatch mode)."""
    if r.plain_cpu is None:
        return []
    want, got = r.plain_cpu
    rows = [("baseline (step start)", want.baseline, got.baseline, None, None)]
    for name in PHASES:
        p, m = want.phase(name), got.phase(name)
        rows.append((PHASE_LABELS[name], p.peak, m.peak, p.end, m.end))
    title = "The plain run (no dispatch mode) on CPU tensors: predicted vs the CPU allocator's own events"
    columns = [Column("phase")] + [Column(c, "bytes") for c in ("peak", "measured", "end", "measured end")]
    return [Table(title, columns, rows, ["equal" if want == got else "DIFFERS"])]


def _phases(r: ParallelMemory) -> Table:
    """Predicted (plain and traced) and measured peak and end of each phase."""
    measured = r.measured
    rows = []
    for name in PHASES:
        p, t = r.step.phase(name), r.step_traced.phase(name)
        m = measured.step.phase(name) if measured is not None else None
        rows.append((PHASE_LABELS[name], p.peak, t.peak, m.peak if m else None, t.end, m.end if m else None))
    base = measured.step.baseline if measured is not None else None
    rows.insert(0, ("baseline (step start)", r.step.baseline, r.step_traced.baseline, base, None, None))
    phases = Table(
        "Peak and end of each phase: plain run (a GPU), traced run (what the fake-PG tracker sees), measured"
        + ("" if r.peaks_exact else "  [peaks are estimates for this layout (see the note below); ends exact]"),
        [
            Column("phase"),
            Column("peak, plain", "bytes"),
            Column("peak, traced", "bytes"),
            Column("peak, measured", "bytes"),
            Column("end, predicted", "bytes"),
            Column("end, measured", "bytes"),
        ],
        rows,
    )
    return phases
