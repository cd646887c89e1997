"""StorageTracker vs torch's MemTracker on the same training step, in one process.

The live model of a preset (GPT-2 XL at 16,384 tokens by default) on ``meta``, its inputs and
AdamW as ``lm-account memory --measure meta`` builds them; the optimizer state is created
before any timing (warm-up excluded for every tracker alike).  Then, interleaved, ``--runs``
times each: the step untracked (the floor), under ``StorageTracker`` and under ``MemTracker``.
Prints the machine, median wall and CPU seconds, the ratios, both trackers' peaks (they must
agree) and the process's peak RSS.  Each StorageTracker run starts with an empty meta memo
(``measure.meta_memo``): every op's kernel runs at its first input, as in the first step of a
process; ``measure_training_step`` also fills the memo during its warm-up (``bench_cli.py``
times that whole command).

    python benchmarks/bench_tracker.py [--preset gpt2-xl] [--context 16384] [--runs 3]
                                       [--optimizer foreach|for-loop] [--mem-tracker-runs 1]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time

import torch
from torch.distributed._tools.mem_tracker import MemTracker

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_cli import machine

from lm_accounting.config import load_config
from lm_accounting.measure.tracker import StorageTracker, _train_step, init_optimizer_state
from lm_accounting.model import build_model, cross_entropy, random_tokens
from lm_accounting.names import ADAMW_KWARGS


def timed(fn) -> tuple[float, float]:
    """Wall and CPU seconds of ``fn()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="gpt2-xl")
    ap.add_argument("--context", type=int, default=16384)
    ap.add_argument("--optimizer", choices=["foreach", "for-loop"], default="foreach")
    ap.add_argument("--runs", type=int, default=3, help="untracked and StorageTracker steps")
    ap.add_argument("--mem-tracker-runs", type=int, default=1, help="MemTracker steps (~30 s each at 16k)")
    a = ap.parse_args()

    cfg = load_config(a.preset).with_context(a.context)
    model = build_model(cfg, device="meta")
    inputs = random_tokens(cfg, 1, a.context, device="meta", seed=0)
    targets = random_tokens(cfg, 1, a.context, device="meta", seed=1)
    opt = torch.optim.AdamW(model.parameters(), **ADAMW_KWARGS[a.optimizer])
    init_optimizer_state(opt)
    print(machine())
    print(
        f"workload: {a.preset} live model on meta, context {a.context}, batch 1, fp32, "
        f"{a.optimizer} AdamW; one training step (forward, backward, optimizer step)"
    )

    def step():
        _train_step(model, inputs, targets, cross_entropy, opt)

    peaks: dict[str, int] = {}

    def storage_tracker():
        tracker = StorageTracker().track_module(model).track_optimizer(opt).track(inputs, targets)
        with tracker:
            _train_step(model, inputs, targets, cross_entropy, opt, tracker.phase)
        peaks["StorageTracker"] = max(p.peak for p in tracker.phase_table("meta").values())

    def mem_tracker():
        tracker = MemTracker()
        tracker.track_external(model, opt, inputs, targets)
        with tracker:
            step()
        peaks["MemTracker"] = tracker.get_tracker_snapshot("peak")[torch.device("meta")]["Total"]

    step()  # first-call costs (lazy imports, meta kernels) are paid here, untimed
    times: dict[str, list[tuple[float, float]]] = {"untracked": [], "StorageTracker": [], "MemTracker": []}
    for i in range(max(a.runs, a.mem_tracker_runs)):
        if i < a.runs:
            times["untracked"].append(timed(step))
            times["StorageTracker"].append(timed(storage_tracker))
        if i < a.mem_tracker_runs:
            times["MemTracker"].append(timed(mem_tracker))
    medians = {}
    for name, runs in times.items():
        walls, cpus = zip(*runs, strict=False)
        medians[name] = statistics.median(walls), statistics.median(cpus)
        print(
            f"{name:15s} median {medians[name][0]:6.2f} s wall (min {min(walls):.2f}, max {max(walls):.2f}) · "
            f"{medians[name][1]:6.2f} s CPU · {len(runs)} runs"
        )
    ours, theirs, floor = medians["StorageTracker"], medians["MemTracker"], medians["untracked"]
    print(
        f"MemTracker / StorageTracker: {theirs[0] / ours[0]:.1f}x wall, {theirs[1] / ours[1]:.1f}x CPU; "
        f"StorageTracker / untracked: {ours[0] / floor[0]:.2f}x wall, {ours[1] / floor[1]:.2f}x CPU"
    )
    agree = "agree" if peaks["StorageTracker"] == peaks["MemTracker"] else "DIFFER"
    print(f"peak bytes: StorageTracker {peaks['StorageTracker']:,} · MemTracker {peaks['MemTracker']:,} ({agree})")
    print(f"peak process RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
