"""Wall time, CPU time and peak RSS of the CLI commands, each run as a user runs it (a fresh
process), with the nearest peer run in the same way and interleaved with it, so that both
see the same load.

    python benchmarks/bench_cli.py                      # every scenario
    python benchmarks/bench_cli.py crosscheck-16k memory-16k-meta
    python benchmarks/bench_cli.py --runs 9 crosscheck-16k

Peers (issue 8, item 10):
* crosscheck-16k vs ``flop_counter``: a process that imports torch, builds the same meta model
  with ``build_model`` and runs one ``FlopCounterMode`` forward under no_grad.  It is timed
  twice: ending normally (interpreter teardown included) and ending with ``os._exit`` as the
  CLI does.  Target: crosscheck <= 1.2 x the peer.
* memory-16k-meta vs ``mem_tracker``: a process that builds the same model, inputs and AdamW
  as ``measure_step``, creates the optimizer state the same way, then runs the same training
  step under torch's ``MemTracker``.  Target (issue 26): MemTracker >= 6 x ``memory --measure meta``
  (wall).  ``bench_tracker.py`` compares the two trackers on the tracked step alone, in one process.
* memory: the analytic ``memory gpt2-xl`` (issue 26): < 0.3 s CPU, importing no torch (the import is
  checked by tests/test_commands.py; the time only here).
Each run prints the machine and, under the figures, whether each target above that has a number was met.
Other targets on a 2-core machine: headline < 0.6 s, report < 60 s, infer (issue 12: Llama-3-8B,
P = 2048, G = 512, B = 32 on an H100) < 0.3 s without importing torch, plan-70b and plan-8b (issue 11:
Llama-3.1-70B and Llama-3-8B over 8..1024 GPUs, >= 1,000 candidate layouts) < 2 s without importing
torch.  plan-8b-every checks every candidate (``--top`` past their number): no target.  What the step-time model
adds to plan's CPU time (issue 28: under 20%) is ``bench_plan.py``'s.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

CONTEXT = 16384
FLOP_COUNTER = f"""
import os, sys, torch
from torch.utils.flop_counter import FlopCounterMode
from lm_accounting.config import load_config
from lm_accounting.model import build_model, random_tokens
cfg = load_config("gpt2-xl").with_context({CONTEXT})
model = build_model(cfg, device="meta")
tokens = random_tokens(cfg, 1, {CONTEXT}, device="meta")
with torch.no_grad(), FlopCounterMode(display=False):
    model(tokens)
if sys.argv[1:] == ["os._exit"]:
    os._exit(0)
"""
MEM_TRACKER = f"""
import torch
from torch.distributed._tools.mem_tracker import MemTracker
from lm_accounting.config import load_config
import inspect
from lm_accounting.measure.tracker import _train_step, _warm_up, measure_training_step
from lm_accounting.model import build_model, cross_entropy, random_tokens
cfg = load_config("gpt2-xl").with_context({CONTEXT})
model = build_model(cfg, device="meta")  # as measure_step: fp32, foreach AdamW (the CLI default)
inputs = random_tokens(cfg, 1, {CONTEXT}, device="meta", seed=0)
targets = random_tokens(cfg, 1, {CONTEXT}, device="meta", seed=1)
steps = inspect.signature(measure_training_step).parameters["warmup_steps"].default  # the same warm-up
opt, _ = _warm_up(model, inputs, targets, cross_entropy, "adamw", {{"foreach": True}}, steps)
tracker = MemTracker()
tracker.track_external(model, opt, inputs, targets)
with tracker:
    _train_step(model, inputs, targets, cross_entropy, opt)
"""
CLI = "cli"
PLAN_8B = ["plan", "llama-3-8b", "--gpus", "8..1024", "--context", "8192", "--tokens", str(15 * 10**12)]
SCENARIOS = {  # name -> (kind, arguments, runs); kind is CLI or a peer's source
    "headline": (CLI, ["gpt2-xl", "--context", str(CONTEXT)], 15),
    "crosscheck-16k": (CLI, ["crosscheck", "gpt2-xl", "--context", str(CONTEXT)], 5),
    "flop_counter": (FLOP_COUNTER, [], 5),
    "flop_counter+os._exit": (FLOP_COUNTER, ["os._exit"], 5),
    "crosscheck-16k-backward": (CLI, ["crosscheck", "gpt2-xl", "--context", str(CONTEXT), "--backward"], 1),
    "memory": (CLI, ["memory", "gpt2-xl"], 15),
    "memory-16k-meta": (CLI, ["memory", "gpt2-xl", "--context", str(CONTEXT), "--measure", "meta"], 5),
    "mem_tracker": (MEM_TRACKER, [], 3),
    "infer": (
        CLI,
        ["infer", "llama-3-8b", "--prompt", "2048", "--generate", "512", "--batch", "32", "--gpu", "h100-80gb"],
        15,
    ),
    "infer-vllm": (  # issue 29: the engine program with vLLM's start-up sizing and the calibrated figure
        CLI,
        ["infer", "llama-3-8b", "--prompt", "2048", "--generate", "512", "--batch", "32", "--engine", "vllm"],
        15,
    ),
    "plan-70b": (  # issue 11: >= 1,000 candidate layouts
        CLI,
        ["plan", "llama-3.1-70b", "--gpus", "8..1024", "--context", "8192", "--tokens", str(15 * 10**12)],
        5,
    ),
    "plan-8b": (CLI, PLAN_8B, 5),
    "plan-8b-every": (CLI, [*PLAN_8B, "--top", "100000", "--format", "json"], 3),  # every candidate checked
    "report": (CLI, ["report", "--out", os.path.join(tempfile.gettempdir(), "lm-accounting-bench-report")], 1),
}
CPU_TARGETS = {"memory": 0.3}  # scenario -> its median CPU seconds must stay under this (issue 26)
PEER_TARGETS = {("memory-16k-meta", "mem_tracker"): 6.0}  # the peer's median wall >= this x the scenario's
GROUPS = {  # a scenario and the peers it is compared with; run interleaved
    "crosscheck-16k": ["flop_counter", "flop_counter+os._exit"],
    "memory-16k-meta": ["mem_tracker"],
}


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = " · load {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()) if hasattr(os, "getloadavg") else ""
    # without a bytecode cache every process compiles the package's sources first (~0.1 s here)
    pyc = " · PYTHONDONTWRITEBYTECODE set" if os.environ.get("PYTHONDONTWRITEBYTECODE") else ""
    return (
        f"machine: {cpu} · {os.cpu_count()} CPUs ({usable} usable){load} · {platform.system()} "
        f"{platform.release()} · Python {platform.python_version()} · torch {importlib.metadata.version('torch')}{pyc}"
    )


def command(name: str) -> list[str]:
    kind, args, _ = SCENARIOS[name]
    if kind == CLI:
        exe = shutil.which("lm-account")
        return ([exe] if exe else [sys.executable, "-m", "lm_accounting"]) + args
    return [sys.executable, "-c", kind, *args]


def run_once(cmd: list[str]) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds (user + sys) and peak RSS (MB) of one child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{proc.stderr.read().decode()}")
    return seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("scenarios", nargs="*", metavar="SCENARIO", help=", ".join(SCENARIOS))
    ap.add_argument("--runs", type=int, help="runs per scenario (default: each scenario's own)")
    a = ap.parse_args()
    if unknown := set(a.scenarios) - set(SCENARIOS):
        ap.error(f"unknown scenario(s) {', '.join(sorted(unknown))}; choose from {', '.join(SCENARIOS)}")
    names = a.scenarios or [n for n in SCENARIOS if not any(n in peers for peers in GROUPS.values())]
    print(machine())
    results: dict[str, list[tuple[float, float, float]]] = {}
    for name in names:
        group = [name, *GROUPS.get(name, [])]
        runs = a.runs or SCENARIOS[name][2]
        for _ in range(runs):  # interleaved: A B C A B C ..., so load drift hits all alike
            for member in group:
                results.setdefault(member, []).append(run_once(command(member)))
        for member in group:
            walls, cpus, rss = zip(*results[member], strict=False)
            label = " ".join(command(member)[1:]) if SCENARIOS[member][0] == CLI else "(peer, python -c)"
            print(
                f"{member:24s} median {statistics.median(walls):6.2f} s wall (min {min(walls):.2f}, "
                f"max {max(walls):.2f}) · {statistics.median(cpus):6.2f} s CPU · peak RSS "
                f"{max(rss):4.0f} MB · {len(walls)} runs · {label}"
            )
        for peer in GROUPS.get(name, []):
            wall = statistics.median(r[0] for r in results[name]) / statistics.median(r[0] for r in results[peer])
            cpu = statistics.median(r[1] for r in results[name]) / statistics.median(r[1] for r in results[peer])
            print(
                f"{'':24s} {name} / {peer}: {wall:.2f}x wall, {cpu:.2f}x CPU "
                f"({peer} / {name}: {1 / wall:.2f}x wall, {1 / cpu:.2f}x CPU)"
            )
            if (name, peer) in PEER_TARGETS:
                target = PEER_TARGETS[name, peer]
                verdict = "met" if 1 / wall >= target else "MISSED"
                print(f"{'':24s} target {peer} >= {target:g}x {name} (wall): {1 / wall:.2f}x, {verdict}")
        if name in CPU_TARGETS:
            cpu = statistics.median(r[1] for r in results[name])
            verdict = "met" if cpu < CPU_TARGETS[name] else "MISSED"
            print(f"{'':24s} target {name} < {CPU_TARGETS[name]:g} s CPU: {cpu:.2f} s, {verdict}")


if __name__ == "__main__":
    main()
