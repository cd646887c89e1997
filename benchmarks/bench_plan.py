"""What the step-time model adds to ``plan``'s CPU time (issue 28: under 20%), each run a fresh process.

    python benchmarks/bench_plan.py                 # plan-70b and plan-8b, 5 runs each
    python benchmarks/bench_plan.py --runs 3 plan-70b

Per scenario of ``bench_cli.py`` (``plan-70b``, ``plan-8b``, ``plan-8b-every``) three kinds of process, interleaved:

* full: the command as a user runs it (``python -m lm_accounting plan ...``), its CPU time (user + sys, ``wait4``);
* free: the same command with the time model's answers given: ``plan._Pricing``'s ``compute``, ``communication``,
  ``step_times`` and ``estimate`` (steps 1-4 of ``plan``'s docstring: the compiled programs, their pricing on the
  calibration, the collectives' wire bytes) replaced by look-ups in a table that a recording run wrote (pickled).  Unpickling the table is timed
  inside the process and taken off its CPU time.  Everything else runs as in full: the enumeration, the ranking,
  the memory checks (floors and replays) and the output; the calibration is still loaded (``check_plan``).
  Its standard output must equal full's, byte for byte, or the run stops;
* the figure: added = (full - free) / free, the CPU time the time model adds to a plan without it.

The recording run is not timed.  Caches shared by the time model and the memory check (``rank_flops``, the model
states) are filled by whichever asks first: in free the memory check pays for them, as it would without the model.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

from bench_cli import SCENARIOS, machine

PLANS = ("plan-70b", "plan-8b", "plan-8b-every")
CHILD = """
import os, pickle, sys, time
from lm_accounting import plan as P
from lm_accounting.cli import main
mode, table_path = sys.argv[1], sys.argv[2]
# what plan asks its pricing (an older plan: step_times and estimate only)
METHODS = [m for m in ("step_times", "compute", "communication", "estimate") if hasattr(P._Pricing, m)]
if mode == "record":
    table = {}
    def rec(fn, tag):
        def wrapped(self, *args):
            got = table[(tag, *args)] = fn(self, *args)
            return got
        return wrapped
    for name in METHODS:
        setattr(P._Pricing, name, rec(getattr(P._Pricing, name), name))
else:
    start = time.process_time()
    with open(table_path, "rb") as fh:
        table = pickle.load(fh)
    sys.stderr.write(f"unpickle {time.process_time() - start}\\n")
    for name in METHODS:
        setattr(P._Pricing, name, lambda self, *args, name=name: table[(name, *args)])
try:
    main(sys.argv[3:])
except SystemExit:
    pass
if mode == "record":
    with open(table_path, "wb") as fh:
        pickle.dump(table, fh)
sys.stdout.flush()
"""


def cpu_of(cmd: list[str]) -> tuple[float, bytes, bytes]:
    """CPU seconds (user + sys), standard output and standard error of one child process."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = proc.stdout.read()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"failed: {' '.join(cmd)}\n{err.decode()}")
    return usage.ru_utime + usage.ru_stime, out, err


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("scenarios", nargs="*", metavar="SCENARIO", help=", ".join(PLANS))
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    if unknown := set(a.scenarios) - set(PLANS):
        ap.error(f"unknown scenario(s) {', '.join(sorted(unknown))}; choose from {', '.join(PLANS)}")
    print(machine())
    for name in a.scenarios or PLANS[:2]:
        args = SCENARIOS[name][1]
        with tempfile.TemporaryDirectory() as tmp:
            table = os.path.join(tmp, "table.pickle")
            cpu_of([sys.executable, "-c", CHILD, "record", table, *args])
            full_cmd = [sys.executable, "-m", "lm_accounting", *args]
            free_cmd = [sys.executable, "-c", CHILD, "free", table, *args]
            full, free = [], []
            for _ in range(a.runs):  # interleaved, so that load drift hits both alike
                cpu, out_full, _ = cpu_of(full_cmd)
                full.append(cpu)
                cpu, out_free, err = cpu_of(free_cmd)
                if out_free != out_full:
                    raise SystemExit(f"{name}: the free run's output differs from the command's")
                unpickle = float(err.decode().split("unpickle ", 1)[1].split()[0])
                free.append(cpu - unpickle)
        f, g = statistics.median(full), statistics.median(free)
        print(
            f"{name:14s} full {f:5.2f} s CPU · without the time model {g:5.2f} s · the time model adds "
            f"{f - g:5.2f} s = {(f - g) / g:6.1%} (target < 20%) · medians of {a.runs} · {' '.join(args)}"
        )


if __name__ == "__main__":
    main()
