"""CPU time of recording the twelve programs ``plan``'s time model prices (tp 1, 2, 4, 8 x no, full and selective
checkpointing at 8,192 positions), with the memory replay's book-keeping (``recording_work(memory=True)``, as
before issue 28's work) and without it (``memory=False``, as ``step_time.program`` records), interleaved, gc off as
in ``plan``.  Both give the same compiled Programs (asserted here; tests/test_step_time.py for every preset).

    python benchmarks/bench_programs.py llama-3.1-70b llama-3-8b
"""

from __future__ import annotations

import gc
import statistics
import sys
import time

from bench_cli import machine

from lm_accounting.analytic.ops import predict_step
from lm_accounting.analytic.ops.tensors import recording_work
from lm_accounting.analytic.parallel import local_config
from lm_accounting.analytic.step_time import Program
from lm_accounting.config import load_config
from lm_accounting.layout import ParallelLayout
from lm_accounting.setup import TrainingSetup

RUNS = 7


def programs(cfg, memory: bool) -> list[Program]:
    out = []
    for tp in (1, 2, 4, 8):
        local = local_config(cfg, ParallelLayout(tp=tp))
        for ck in ("none", "full", "selective"):
            setup = TrainingSetup(attention="sdpa", checkpoint=ck, precision="amp-bf16")
            work: list = []
            with recording_work(work, memory=memory):
                predict_step(
                    local, 8192, setup, impl="course", batch=2, mode="plain", device="cuda", optimizer_step=False
                )
            out.append(Program.compile(work, local.d_model))
    return out


def main() -> None:
    print(machine())
    gc.disable()
    for name in sys.argv[1:] or ["llama-3.1-70b", "llama-3-8b"]:
        cfg = load_config(name)
        if programs(cfg, True) != programs(cfg, False):
            raise SystemExit(f"{name}: the programs differ")
        took: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(RUNS):  # interleaved, so that load drift hits both alike
            for memory in (True, False):
                start = time.process_time()
                programs(cfg, memory)
                took[memory].append(time.process_time() - start)
        with_, without = (statistics.median(took[m]) for m in (True, False))
        print(
            f"{name}: 12 programs {with_:.3f} s CPU with the memory replay, {without:.3f} s without (medians of {RUNS})"
        )


if __name__ == "__main__":
    main()
