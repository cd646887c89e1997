"""What the test suite costs: each run of it as a user starts it (``python -m pytest`` in a fresh
process, from the repository root), timed by wall clock and by the CPU seconds (user + system, every
thread) of the finished child processes (``resource.getrusage(RUSAGE_CHILDREN)``).  CPU seconds barely
move when other jobs share the machine; wall seconds do, so the load average is printed beside them.

    python benchmarks/bench_tests.py                  # the quick loop and the default run
    python benchmarks/bench_tests.py quick default grids
    python benchmarks/bench_tests.py --seed 0 default # the default run's sample for another seed

Runs (the markers are documented in tests/conftest.py):
* ``quick``: ``pytest -m "not slow"``, the edit-test loop.  Budget: <= 120 CPU-seconds.
* ``default``: ``pytest``, the README's command and what CI runs: every test, and a seeded sample of
  each grid.  Budget: <= 20 minutes wall on an idle 2-core machine.  pytest runs the tests one at a
  time, so its wall time on an idle machine is about its CPU time (tiny tensors keep torch on one
  thread), and at best half of it.
* ``grids``: ``pytest -m grid --grid=all``, every case of every grid (no budget: run it on demand).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

from bench_cli import machine

ROOT = Path(__file__).resolve().parent.parent
RUNS = {
    "quick": (["-m", "not slow"], 120, "CPU-seconds"),
    "default": ([], 20 * 60, "wall seconds on an idle 2-core machine"),
    "grids": (["-m", "grid", "--grid=all"], None, ""),
}


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(name: str, seed: str | None) -> tuple[float, float, list[str]]:
    """Wall seconds, CPU seconds, and pytest's grid line, failures and summary line for one run."""
    env = dict(os.environ, **({"LM_GRID_SEED": seed} if seed else {}))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *RUNS[name][0]]
    cpu, wall = children_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall, cpu = time.perf_counter() - wall, children_cpu() - cpu
    lines = proc.stdout.splitlines()
    summary = next((line for line in reversed(lines) if re.search(r"\d+ (passed|failed|error)", line)), "?")
    said = [line for line in lines if line.startswith(("grid: ", "FAILED ", "ERROR "))]
    return wall, cpu, [*dict.fromkeys(said), summary.strip("= ")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", default=["quick", "default"], help=f"any of {', '.join(RUNS)}")
    parser.add_argument("--seed", help="LM_GRID_SEED for the runs (default: the commit's)")
    args = parser.parse_args()
    if set(args.runs) - set(RUNS):
        parser.error(f"runs are {', '.join(RUNS)}")
    print(machine())
    for name in args.runs:
        load = os.getloadavg()[0]
        wall, cpu, said = run(name, args.seed)
        command = " ".join(["python -m pytest -q", *(f'"{a}"' if " " in a else a for a in RUNS[name][0])])
        print(f"\n{name}: {command}")
        print(f"  {cpu:,.0f} CPU-seconds ({cpu / 60:.1f} min), {wall:,.0f} wall seconds ({wall / 60:.1f} min)")
        print(f"  load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
        for line in said:
            print(f"  {line}")
        budget, unit = RUNS[name][1:]
        if name == "quick":
            print(f"  budget: <= {budget} {unit}: {'met' if cpu <= budget else 'MISSED'}")
        elif name == "default":
            print(
                f"  budget: <= {budget // 60} min {unit}; estimate {cpu / 60:.1f} min (one thread) "
                f"to {cpu / 120:.1f} min (two): {'met' if cpu <= budget else 'MISSED'}"
            )


if __name__ == "__main__":
    main()
