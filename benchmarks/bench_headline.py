"""Median wall time of the headline command, run as a user runs it (a fresh process each time).

    python benchmarks/bench_headline.py [--runs 15] [-- ARGS...]

Prints the machine it ran on.  Target (issue 2): under 0.6 s on a 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("args", nargs="*", default=["gpt2-xl", "--context", "16384"])
    opts = parser.parse_args()
    exe = shutil.which("lm-account")
    cmd = [exe] if exe else [sys.executable, "-m", "lm_accounting"]
    cmd += opts.args
    times = []
    for _ in range(opts.runs):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    print(f"command: {' '.join(cmd)}")
    print(f"machine: {platform.platform()} · {platform.processor() or platform.machine()} · {os.cpu_count()} CPUs · Python {platform.python_version()}")
    print(f"runs: {opts.runs} · median {statistics.median(times):.3f} s · min {min(times):.3f} s · max {max(times):.3f} s")


if __name__ == "__main__":
    main()
