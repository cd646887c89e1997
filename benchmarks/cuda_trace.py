"""Where a CUDA measurement and its prediction part: the caching allocator's events around one phase's
peak, each named by the op that made it.

    python benchmarks/cuda_trace.py qwen3-30b-a3b --set num_layers=2 --context 1024 --batch 2 \\
        --setup sdpa+full+amp-bf16+foreach [--dp 4 --zero 3] [--tp 2 --sp --vp] [--phase backward] [--window 40]
    python benchmarks/cuda_trace.py llama-3-8b --impl transformers --set num_layers=2 --context 1024 \
        --setup sdpa+none+bf16+foreach --phase warmup,forward

One point of ``benchmarks/cuda_validation.py`` (the same model, step and measurement), with the
profiler's memory events recorded in each phase (``torch.profiler`` with ``profile_memory``:
RecordFunction callbacks, no dispatch mode, so the program is the plain run's).  ``--impl transformers``:
transformers' own model as ``measure.hf.measure_hf_step`` runs it, against ``ops.predict_step``.  Prints the
predicted and measured phases, then for each chosen phase the events before and after its highest point: the
running
bytes from the phase's start, each allocation (+) or free (−), and the ops it ran under, innermost
first (a backward op under its autograd node).  The profiler reports each block's size as the
allocator rounded it (512 bytes), so the running bytes differ from ``requested_bytes`` by that rounding.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys

from lm_accounting.config import load_config
from lm_accounting.layout import ParallelLayout
from lm_accounting.phases import PHASES
from lm_accounting.setup import every_setup


def cuda_events(prof) -> list[tuple[int, int, tuple[str, ...], int]]:
    """(time, ± bytes, ops from the innermost out, address) of each CUDA allocation and free in ``prof``."""
    from torch._C._profiler import _EventType

    out, stack = [], [(node, ()) for node in prof.profiler.kineto_results.experimental_event_tree()]
    while stack:
        node, ops = stack.pop()
        if node.tag == _EventType.TorchOp:
            ops = (node.name, *ops)
        elif node.tag == _EventType.Allocation and node.extra_fields.device.type == "cuda":
            f = node.extra_fields
            out.append((node.start_time_ns, f.alloc_size, ops, f.ptr))
        stack.extend((child, ops) for child in node.children)
    return sorted(out, key=lambda e: e[0])


def profiled_phases(captured: dict):
    """A ``tracker._train_step`` that also records each measured phase's CUDA events in ``captured``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from lm_accounting.measure import tracker

    plain = tracker._train_step

    def train_step(model, inputs, targets, loss_fn, opt, phase=None):
        if phase is None:  # the warm-up step: what it leaves allocated is in every measured figure
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                plain(model, inputs, targets, loss_fn, opt)
                torch.cuda.synchronize()
            captured["warmup"] = cuda_events(prof)
            return None

        @contextlib.contextmanager
        def both(name):
            with phase(name), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                yield
                torch.cuda.synchronize()
            captured[name] = cuda_events(prof)

        return plain(model, inputs, targets, loss_fn, opt, both)

    return train_step


def short(ops: tuple[str, ...]) -> str:
    """The innermost two ops and the autograd node over them, if any."""
    node = next((o for o in ops if o.startswith("autograd::engine::evaluate_function")), None)
    names = list(ops[:2]) + ([node.removeprefix("autograd::engine::evaluate_function: ")] if node else [])
    return " < ".join(dict.fromkeys(names)) or "(no op)"


def show(events, window: int, at_end: bool = False) -> None:
    """The events around the phase's highest point (``at_end``: its last event), then what the phase allocated
    that is live there."""
    live, best, at = 0, 0, -1
    running = []
    for i, (_, size, _, _) in enumerate(events):
        live += size
        running.append(live)
        if live > best:
            best, at = live, i
    if at_end:
        best, at = live, len(events) - 1
    print(f"{len(events)} events; highest point {best:,} B above the phase's start, at event {at}")
    for i in range(max(0, at - window), min(len(events), at + window // 4 + 1)):
        mark = ">>" if i == at else "  "
        print(f"{mark}{i:>6} {running[i]:>15,} {events[i][1]:>+15,}  {short(events[i][2])}")
    held: dict[int, tuple[int, tuple[str, ...]]] = {}
    for _, size, ops, ptr in events[: at + 1]:
        if size > 0:
            held[ptr] = (size, ops)
        else:
            held.pop(ptr, None)
    groups: dict[tuple[str, int], int] = {}
    for size, ops in held.values():
        groups[short(ops), size] = groups.get((short(ops), size), 0) + 1
    print(f"allocated in this phase and live at its highest point: {sum(s for s, _ in held.values()):,} B")
    for (ops, size), n in sorted(groups.items(), key=lambda g: -g[0][1] * g[1]):
        print(f"  {n:>4} x {size:>13,}  {ops}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--set", action="append", default=[], help="FIELD=INT: a config override (repeatable)")
    ap.add_argument("--context", type=int, required=True)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--setup", required=True, help="a setup label, e.g. sdpa+none+bf16+foreach")
    ap.add_argument("--dp", type=int, default=1)
    ap.add_argument("--zero", type=int, default=0)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--sp", action="store_true")
    ap.add_argument("--vp", action="store_true")
    ap.add_argument("--phase", default="backward", help=f"comma-separated: warmup, {', '.join(PHASES)}")
    ap.add_argument("--impl", default="course", choices=("course", "transformers"))
    ap.add_argument("--window", type=int, default=40)
    args = ap.parse_args(argv)
    import torch

    from lm_accounting.analytic.memory_report import memory_account
    from lm_accounting.analytic.parallel import rank_step
    from lm_accounting.measure import tracker
    from lm_accounting.measure.distributed import measure_rank_plain
    from lm_accounting.measure.step import build_step
    from lm_accounting.model import cross_entropy

    setups = {s.label: s for s in every_setup()}
    try:
        overrides = {k: int(v) for k, v in (item.split("=", 1) for item in args.set)}
        cfg = dataclasses.replace(load_config(args.model), **overrides).with_context(args.context)
        layout = ParallelLayout(
            dp=args.dp, zero=args.zero, tp=args.tp, sequence_parallel=args.sp, vocab_parallel=args.vp
        )
        layout.check(cfg, args.context)
        if args.setup not in setups:
            raise ValueError(f"unknown setup {args.setup!r}: e.g. {next(iter(setups))}")
        phases = args.phase.split(",")
        if set(phases) - {"warmup", *PHASES}:
            raise ValueError(f"unknown phase in {args.phase!r}: warmup, {', '.join(PHASES)}")
        if args.impl == "transformers" and layout.world > 1:
            raise ValueError("--impl transformers traces one GPU")
    except Exception as exc:  # noqa: BLE001 - bad input: one line
        print(f"cuda_trace: {exc}".splitlines()[0], file=sys.stderr)
        return 2
    setup = setups[args.setup]
    if not torch.cuda.is_available():
        print("cuda_trace: no CUDA GPU is available on this machine", file=sys.stderr)
        return 2
    captured: dict = {}
    tracker._train_step = profiled_phases(captured)
    S, B = args.context, args.batch
    if args.impl == "transformers":
        from lm_accounting.analytic.ops import predict_step
        from lm_accounting.measure.hf import build_hf_step, patched_for

        with patched_for("cuda"):
            model, inputs, targets, opt, loss_fn = build_hf_step(cfg, S, B, setup, "cuda")
            got = tracker.measure_training_step_cuda(model, inputs, targets, loss_fn, optimizer=opt)
        try:
            want = predict_step(cfg, S, setup, impl="transformers", batch=B, mode="plain", device="cuda").at(B)
        except ValueError as exc:  # a kernel not modelled yet: the trace shows what it does
            print(f"prediction refused: {exc}")
            want = got
    elif layout.world > 1:
        want = rank_step(cfg, S, B, setup, layout, "plain", 0, "cuda")[0]
        got = measure_rank_plain(cfg, S, B, setup, layout, rank=0, device="cuda")
    else:
        want = memory_account(cfg, S, B, device="cuda", setup=setup).step
        model, inputs, targets, opt = build_step(cfg, S, B, setup, "cuda")
        got = tracker.measure_training_step_cuda(model, inputs, targets, cross_entropy, optimizer=opt)
    print(f"{args.impl} {args.model} {overrides} S={S} B={B} {setup.label} {layout.label}")
    print(f"baseline predicted {want.baseline:,} measured {got.baseline:,}")
    for phase in PHASES:
        p, m = want.phase(phase), got.phase(phase)
        print(f"{phase}: peak predicted {p.peak:,} measured {m.peak:,} ({m.peak - p.peak:+,}); end {m.end - p.end:+,}")
    for name in phases:
        print(f"--- {name}")
        show(captured[name], args.window, at_end=name == "warmup")
    return 0


if __name__ == "__main__":
    sys.exit(main())
