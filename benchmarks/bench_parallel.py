"""One rank of a multi-GPU job simulated on this CPU: wall time, peak RSS, and predicted vs measured.

The worst rank (rank 0) of Llama-3-8B over 64 GPUs by default: FSDP2 full shard, amp-bf16 with
FSDP2's MixedPrecisionPolicy, full activation checkpointing, fused attention, S = 8,192, one
sequence per rank.  The job runs on torch's fake process group with FakeTensors
(``measure.distributed.measure_rank(..., fake=True)``); the prediction is ``analytic.parallel``'s
traced run.  Prints the machine, the seconds and the peak RSS, then the model states, every phase
and the collectives, predicted beside measured.

    python benchmarks/bench_parallel.py [--preset llama-3-8b] [--context 8192] [--dp 64] [--zero 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_cli import machine

from lm_accounting.analytic.collectives import step_collectives, totals
from lm_accounting.analytic.parallel import rank_step
from lm_accounting.config import load_config
from lm_accounting.layout import ParallelLayout
from lm_accounting.setup import TrainingSetup


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="llama-3-8b")
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--dp", type=int, default=64)
    ap.add_argument("--zero", type=int, default=3, choices=(2, 3))
    args = ap.parse_args()
    start = time.perf_counter()
    from lm_accounting.measure.distributed import measure_rank  # imports torch

    cfg = load_config(args.preset).with_context(args.context)
    layout = ParallelLayout(dp=args.dp, zero=args.zero)
    setup = TrainingSetup(attention="sdpa", checkpoint="full", precision="amp-bf16")
    t0 = time.perf_counter()
    m = measure_rank(cfg, args.context, 1, setup, layout, rank=0, fake=True)
    run = time.perf_counter() - t0
    total = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    pred, st, _ = rank_step(cfg, args.context, 1, setup, layout, mode="traced")
    print(machine())
    print(f"{cfg.name} · {layout.label} · {setup.label} · S = {args.context:,} · rank 0 on the fake process group")
    print(f"simulated step: {run:.1f} s (with torch import and setup: {total:.1f} s) · peak RSS {rss / 1e6:,.0f} MB")
    rows = [
        ("parameters", st.parameters, m.params),
        ("gradients", st.gradients, m.gradients),
        ("optimizer state", st.optimizer, m.optimizer),
        ("baseline", pred.baseline, m.step.baseline),
    ]
    for phase in ("forward", "backward", "optimizer_step"):
        rows.append((f"{phase} peak", pred.phase(phase).peak, m.step.phase(phase).peak))
        rows.append((f"{phase} end", pred.phase(phase).end, m.step.phase(phase).end))
    print(f"{'quantity':<22}{'predicted':>18}{'measured':>18}{'residual':>10}")
    for name, want, got in rows:
        print(f"{name:<22}{want:>18,}{got:>18,}{(want - got) / got:>+10.2%}")
    want = totals(step_collectives(cfg, args.context, 1, setup, layout))
    for kind in sorted(set(want) | set(m.collectives)):
        print(f"{kind:<22}{want.get(kind)!s:>28}{m.collectives.get(kind)!s:>28}")


if __name__ == "__main__":
    main()
