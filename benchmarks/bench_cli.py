"""Wall time and peak RSS of the CLI commands, each run as a user runs it (a fresh process).

    python benchmarks/bench_cli.py                 # every scenario
    python benchmarks/bench_cli.py headline crosscheck-16k

Prints the machine first.  Targets on a 2-core machine: headline < 0.6 s (issue 2);
crosscheck gpt2-xl at 16k < 10 s and < 1 GB RSS (issue 3); memory gpt2-xl at 16k with
--measure meta < 15 s and < 1.5 GB RSS (issue 4); report < 60 s (issue 5).
"""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SCENARIOS = {  # name -> (arguments, runs)
    "headline": (["gpt2-xl", "--context", "16384"], 15),
    "crosscheck-16k": (["crosscheck", "gpt2-xl", "--context", "16384"], 3),
    "crosscheck-16k-backward": (["crosscheck", "gpt2-xl", "--context", "16384", "--backward"], 1),
    "memory-16k-meta": (["memory", "gpt2-xl", "--context", "16384", "--measure", "meta"], 3),
    "report": (["report", "--out", os.path.join(tempfile.gettempdir(), "lm-accounting-bench-report")], 1),
}


def run_once(cmd: list[str]) -> tuple[float, float]:
    """Seconds and peak RSS (MB) of one child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{proc.stderr.read().decode()}")
    return seconds, usage.ru_maxrss / 1024


def main() -> None:
    names = sys.argv[1:] or list(SCENARIOS)
    exe = shutil.which("lm-account")
    base = [exe] if exe else [sys.executable, "-m", "lm_accounting"]
    print(f"machine: {platform.platform()} · {platform.machine()} · {os.cpu_count()} CPUs · Python {platform.python_version()}")
    for name in names:
        args, runs = SCENARIOS[name]
        results = [run_once(base + args) for _ in range(runs)]
        times = [t for t, _ in results]
        rss = max(r for _, r in results)
        print(f"{name:26s} lm-account {' '.join(args)}")
        print(f"{'':26s} runs {runs} · median {statistics.median(times):.3f} s · min {min(times):.3f} s · "
              f"max {max(times):.3f} s · peak RSS {rss:.0f} MB")


if __name__ == "__main__":
    main()
