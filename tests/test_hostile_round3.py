"""Hostile input, round 3 (issue 25, part 9): each class of failure the fuzz found, through the CLI where
it reaches the user.  Work is bounded by counts (Python calls or lines run, stages replayed, files written),
never by seconds: a regression to a hang fails on its budget instead of running on."""

import dataclasses
import os
import signal
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from lm_accounting import AccountingError, load_config
from lm_accounting.analytic import pipeline as pl
from lm_accounting.analytic.cuda_kernels import sum_rows_scratch
from lm_accounting.analytic.expert_parallel import expert_counts, expert_parallel_split
from lm_accounting.analytic.inference_report import infer
from lm_accounting.layout import ParallelLayout
from lm_accounting.measure import devices
from lm_accounting.output import MARKER
from lm_accounting.setup import TrainingSetup

ROOT = Path(__file__).resolve().parents[1]


class OverBudget(Exception):
    pass


def run_counted(fn, budget: int, lines: bool = False):
    """``fn()`` with at most ``budget`` Python function calls (and, with ``lines``, lines run: a loop that calls
    nothing still counts); past it, ``OverBudget``.  Returns (result, events)."""
    seen = [0]

    def local(frame, event, arg):
        if event == "line":
            seen[0] += 1
            if seen[0] > budget:
                raise OverBudget(f"more than {budget:,} events")
        return local

    def tracer(frame, event, arg):
        if event == "call":
            seen[0] += 1
            if seen[0] > budget:
                raise OverBudget(f"more than {budget:,} events")
        return local if lines else None

    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        out = fn()
    finally:
        sys.settrace(old)
    return out, seen[0]


def one_line_error(r, *words):
    assert r.code == 2, (r.code, r.err[-500:])
    assert r.err.startswith("lm-account: error: ") and r.err.count("\n") == 1, r.err
    assert "Traceback" not in r.err
    for word in words:
        assert word in r.err, (word, r.err)


# ------------------------------------------------------------------ hangs
def test_sum_rows_scratch_past_2_to_the_29_ends():
    """A row of more than 2^29 fp32 values is past 32-bit indexing alone: TensorIterator halves the rows down
    to one and then splits the width; a sum over one row has nothing to reduce across blocks (0).  It used to
    halve ceil(1/2) = 1 for ever."""
    for rows, width in ((1, 2**29 + 1), (2, 2**29), (4096, 2**30), (10**6, 3 * 2**30 + 1)):
        value, events = run_counted(lambda r=rows, w=width: sum_rows_scratch(r, w), 2_000, lines=True)
        assert value == 0 and events < 2_000
    # below the limit nothing changes: 8,192 rows of 768 (gpt2-small's norm gradient at B·S = 8,192): vec 4,
    # 128 threads, block w 32 × h 4, 2,048 rows per thread, grid ⌈192/32⌉ = 6, target 132·2,048/128 = 2,112,
    # ctas = max(min(⌈2,112/6⌉, ⌈2,048/16⌉), ⌈2,048/256⌉) = 128: 4·768·128·32·4 + 4·6 bytes
    assert sum_rows_scratch(8192, 768) == 4 * 768 * 128 * 32 * 4 + 4 * 6


def test_a_cuda_step_with_a_huge_norm_width_is_predicted():
    from lm_accounting.analytic.replay import predict_training_step

    cfg = dataclasses.replace(
        load_config("gpt2-small"), num_layers=1, d_model=2**30, num_heads=16, d_ff=64, vocab_size=8, context_length=4
    )
    step, _ = run_counted(lambda: predict_training_step(cfg, 4, 1, device="cuda"), 2_000_000)
    assert step.peak > 4 * 2**30  # at least one fp32 copy of the 2^30-wide weights


def _decode_reference(r) -> tuple[Fraction, int | None]:
    """Σ over the G − 1 steps of max(F/peak, bytes/bandwidth) / (G − 1), and the first position whose bound
    differs, step by step: without a window K(p) = L·(p + 1), so F and bytes are linear in p between the
    printed first (p = P) and last (p = P + G − 2) steps."""
    ro, steps = r.roofline, r.generate - 1
    peak, bw = ro["peak_flops"], ro["bandwidth"]
    f0, f1 = ro["decode_first"]["flops"], ro["decode_last"]["flops"]
    b0, b1 = ro["decode_first"]["bytes"], ro["decode_last"]["bytes"]
    assert (f1 - f0) % (steps - 1) == 0 and (b1 - b0) % (steps - 1) == 0
    df, db = (f1 - f0) // (steps - 1), (b1 - b0) // (steps - 1)
    total, turn, first = Fraction(0), None, None
    for k in range(steps):
        f, b = f0 + k * df, b0 + k * db
        total += max(Fraction(f, peak), Fraction(b, bw))
        compute = f * bw >= peak * b
        first = compute if first is None else first
        if turn is None and compute != first:
            turn = r.prompt + k
    return total / steps, turn


def test_infer_decode_series_is_exact_and_independent_of_g():
    """The roofline over G − 1 decode steps in closed form: the same mean and turning point as adding the
    steps one by one (here 2,999 steps that turn from compute- to memory-bound), and the work does not grow
    with G (10^3 and 10^17 steps: the same count of calls but the bisection's ~60 rounds)."""
    cfg = load_config("llama-3-8b")
    r = infer(cfg, 16, 3000, 512)
    mean, turn = _decode_reference(r)
    assert turn == 166 and r.roofline["decode_bound"] == "compute-bound until p = 165, then memory-bound"
    assert r.roofline["decode_mean_seconds"] == float(mean)
    near, far = cfg.with_context(1016), cfg.with_context(10**17 + 16)  # both new to every cache
    small = run_counted(lambda: infer(near, 16, 1000, 4), 10**6)[1]
    big, events = run_counted(lambda: infer(far, 16, 10**17, 4), small + 20_000)
    assert big.roofline["decode_steps"] == 10**17 - 1 and events < small + 20_000


def test_infer_with_a_huge_generate_through_the_cli(run_cli):
    r, _ = run_counted(
        lambda: run_cli("infer", "llama-3-8b", "-P", "10", "-G", "1e17", "-S", "100000000000000010"), 10**6
    )
    assert r.code == 0 and "99,999,999,999,999,999" in r.out


def test_the_tp_refusal_tries_a_bounded_number_of_degrees(run_cli):
    heads = 2**40
    args = ("infer", "gpt2-small", "-P", "8", "-G", "8", "--d-model", "4096", "--heads", heads, "--kv-heads", heads)
    r, _ = run_counted(lambda: run_cli(*args, "--head-dim", "2", "--tp", "7"), 300_000, lines=True)
    one_line_error(r, "--tp 7 does not divide", "valid: 1, 2, 4, 8, 16, 32, 64;")


def test_the_pipeline_replays_at_most_four_stages_and_finds_the_worst():
    """Middle stages of one model differ only in the warm-up depth P − s: the first of each model, the first
    stage and the last are the candidates.  On a grid every stage replayed picks the same stage and step."""
    cfg0 = dataclasses.replace(
        load_config("gpt2-small"), d_model=64, num_heads=4, num_kv_heads=2, d_ff=160, vocab_size=97, context_length=32
    )
    setups = (TrainingSetup(), TrainingSetup(precision="amp-bf16", checkpoint="full"))
    for layers, stages, zero, setup in [(7, 3, 0, setups[0]), (13, 5, 3, setups[1]), (12, 6, 1, setups[0])]:
        cfg = dataclasses.replace(cfg0, num_layers=layers)
        layout = ParallelLayout(dp=2 if zero else 1, zero=zero, pp=stages, micro_batches=stages + 2)
        got = pl.pipeline_stages(cfg, 16, 2, setup, layout)
        worst = None
        for s in range(stages):
            step = pl.stage_step(cfg, 16, 2, setup, layout, s)[0]
            worst = (s, step) if worst is None or step.peak > worst[1].peak else worst
        assert (got[0], got[1]) == worst
    # 4,096 stages (and layers): 4 stages replayed (one of them twice, traced), not 4,096
    deep = dataclasses.replace(cfg0, num_layers=4096 + 5)
    calls = []
    real = pl.stage_step

    def counted(*args, **kwargs):
        calls.append(args[5])
        return real(*args, **kwargs)

    pl.stage_step = counted
    try:
        pl.pipeline_stages(deep, 16, 1, TrainingSetup(), ParallelLayout(pp=4096, micro_batches=4096))
    finally:
        pl.stage_step = real
    assert len(set(calls)) == 4 and len(calls) <= 5 and set(calls) == {0, 1, 5, 4095}


# ------------------------------------------------------------------ blow-ups
def test_expert_parallel_counts_without_a_list_of_experts():
    """10 slots over 10^15 experts on 8 ranks: experts 0–9 get one each, all on rank 0 (G = 1.25·10^14)."""
    split, _ = run_counted(lambda: expert_parallel_split(10, 10**15, 8, 0), 200, lines=True)
    assert split.sent == (10, 0, 0, 0, 0, 0, 0, 0) and split.received == 80
    assert split.full_rows == 0 and split.extra_experts == 10
    # small cases against the list of counts (c_e = ⌊n/E⌋ + [e < n mod E])
    for n, experts, ranks in ((37, 12, 4), (5, 6, 3), (48, 8, 2)):
        counts, group = expert_counts(n, experts), experts // ranks
        for rank in range(ranks):
            split = expert_parallel_split(n, experts, ranks, rank)
            assert split.sent == tuple(sum(counts[j * group : (j + 1) * group]) for j in range(ranks))
            assert split.extra_experts == sum(c > n // experts for c in counts[rank * group : (rank + 1) * group])


def test_a_huge_expert_count_under_expert_parallel(run_cli):
    import tracemalloc

    args = ("memory", "qwen3-30b-a3b", "--set", "num_experts=1000000000", "--dp", "8", "--ep", "8", "--zero", "3")
    tracemalloc.start()
    try:
        r = run_cli(*args, "-S", "16", "--format", "json")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert r.code == 0, r.err
    assert peak < 200 * 10**6  # a list of 10^9 counts alone would be 8 GB


def _refuse_building(monkeypatch):
    from lm_accounting.measure import distributed, parallelize, pipeline

    def fail(*args, **kwargs):
        raise AssertionError("built before the refusal")

    for module in (distributed, parallelize, pipeline):
        if hasattr(module, "build_rank"):
            monkeypatch.setattr(module, "build_rank", fail)


def test_a_real_tensor_rank_is_checked_against_the_cpu(run_cli, monkeypatch):
    """DDP runs on real CPU tensors: the rank's predicted peak is compared with what the CPU allows before the
    rank is built (as a single-GPU step is)."""
    pytest.importorskip("torch")
    _refuse_building(monkeypatch)
    monkeypatch.setattr(devices, "available_bytes", lambda device: 10**8)  # 100 MB free
    r = run_cli("memory", "gpt2-small", "-S", "256", "--dp", "2", "--measure", "meta")
    one_line_error(r, "this rank's step (real CPU tensors) on cpu needs", "80% of the 100.000 MB")


def test_impossible_tensors_never_reach_torch(run_cli, monkeypatch):
    pytest.importorskip("torch")
    _refuse_building(monkeypatch)
    from lm_accounting import model

    monkeypatch.setattr(model, "build_model", lambda *a, **k: pytest.fail("built"))
    for batch in ("1e15", "1e12"):  # the cache (B·C·kv width) or the scores over it (B·h·P·C)
        r = run_cli("infer", "gpt2-small", "-P", "1000", "-G", "24", "-B", batch, "--measure", "meta")
        one_line_error(r, "2^63-byte limit")
    r = run_cli("memory", "gpt2-small", "--layers", "2", "-S", "64", "--pp", "2", "--micro-batches", "1e18")
    assert r.code == 0, r.err  # the analytic answer
    r = run_cli(
        "memory", "gpt2-small", "--layers", "2", "-S", "64", "--pp", "2", "--micro-batches", "1e18", "--measure", "meta"
    )
    one_line_error(r, "micro-batches·B·S", "2^63-byte limit")
    monkeypatch.setattr(devices, "available_bytes", lambda device: 10**9)
    r = run_cli(
        "memory", "gpt2-small", "--layers", "2", "-S", "64", "--pp", "2", "--micro-batches", "1e12", "--measure", "meta"
    )
    one_line_error(r, "this stage's step (real CPU tensors) on cpu needs")


# ------------------------------------------------------------------ the CPU guard
def _fake_system(root: Path, meminfo_kb: int, v2: tuple[int, int] | None, v1: tuple[int, int] | None) -> None:
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/meminfo").write_text(f"MemTotal: 99999999 kB\nMemAvailable: {meminfo_kb} kB\n")
    (root / "proc/self/status").write_text("VmSize:  3000000 kB\nVmData:  1000000 kB\n")
    lines = ["0::/user.slice/job"] + (["4:memory:/job"] if v1 else [])
    (root / "proc/self/cgroup").write_text("\n".join(lines) + "\n")
    if v2:
        (root / "cg/user.slice/job").mkdir(parents=True)
        (root / "cg/user.slice/memory.max").write_text(f"{v2[0]}\n")
        (root / "cg/user.slice/memory.current").write_text(f"{v2[1]}\n")
        (root / "cg/user.slice/job/memory.max").write_text("max\n")  # the leaf is unlimited: the parent binds
        (root / "cg/user.slice/job/memory.current").write_text(f"{v2[1]}\n")
    if v1:
        (root / "cg/memory/job").mkdir(parents=True)
        (root / "cg/memory/job/memory.limit_in_bytes").write_text(f"{v1[0]}\n")
        (root / "cg/memory/job/memory.usage_in_bytes").write_text(f"{v1[1]}\n")
        (root / "cg/memory/memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "unlimited"


@pytest.mark.parametrize(
    "v2, v1, rlimit, expected",
    [
        (None, None, None, 64 * 10**9),  # MemAvailable alone
        ((8 * 10**9, 2 * 10**9), None, None, 6 * 10**9),  # cgroup v2: memory.max − memory.current of the parent
        (None, (4 * 10**9, 10**9), None, 3 * 10**9),  # cgroup v1
        ((8 * 10**9, 2 * 10**9), None, ("RLIMIT_AS", 5 * 10**9), 5 * 10**9 - 3_000_000 * 1024),  # less VmSize
        (None, None, ("RLIMIT_DATA", 2 * 10**9), 2 * 10**9 - 1_000_000 * 1024),  # less VmData
    ],
)
def test_the_cpu_guard_takes_the_least_limit(tmp_path, monkeypatch, v2, v1, rlimit, expected):
    import resource

    _fake_system(tmp_path, 64 * 10**9 // 1024, v2, v1)
    monkeypatch.setattr(devices, "PROC", str(tmp_path / "proc"))
    monkeypatch.setattr(devices, "CGROUP_ROOT", str(tmp_path / "cg"))
    limits = {name: (resource.RLIM_INFINITY, resource.RLIM_INFINITY) for name in ("RLIMIT_AS", "RLIMIT_DATA")}
    if rlimit:
        limits[rlimit[0]] = (rlimit[1], resource.RLIM_INFINITY)
    monkeypatch.setattr(
        resource, "getrlimit", lambda which: limits["RLIMIT_AS" if which == resource.RLIMIT_AS else "RLIMIT_DATA"]
    )
    assert devices.available_bytes("cpu") == expected
    need = expected * 4 // 5 + 1  # just past 80 % of what is left
    with pytest.raises(AccountingError, match="more than 80% of"):
        devices.check_device_fits("cpu", need, "x")
    devices.check_device_fits("cpu", need - 1, "x")


def test_infer_measure_cpu_stops_at_80_percent_as_memory_does(run_cli, monkeypatch):
    """One rule for every live run: 80 % of the available memory (``infer --measure cpu`` allowed 100 %)."""
    need = infer(load_config("gpt2-small"), 24, 5, 1, device="cpu").memory["peak"]
    monkeypatch.setattr(devices, "available_bytes", lambda device: need * 5 // 4 - 2)  # need is 80 % + a little
    r = run_cli("infer", "gpt2-small", "-P", "24", "-G", "5", "--measure", "cpu")
    one_line_error(r, "more than 80% of")


def test_live_runs_past_the_time_bound_are_refused(run_cli, monkeypatch):
    """gpt2-xl's training step at 1,024 tokens on the CPU: 6 × 3.3·10^12 FLOPs at the assumed 2·10^10 FLOP/s is
    past the 15-minute bound, refused before any torch work (the host made to look big enough)."""
    monkeypatch.setattr(devices, "available_bytes", lambda device: 10**13)
    cfg = load_config("gpt2-xl")
    seconds = devices.estimate_live_seconds(cfg, 1024, 1, "cpu", training=True)
    assert seconds > devices.MAX_LIVE_SECONDS
    with pytest.raises(AccountingError, match="would take about"):
        devices.check_live_run(cfg, 1024, 1, "cpu", "x", training=True)
    devices.check_live_run(cfg, 1024, 1, "cpu", "x", training=True, allow_long=True)  # lifted
    _refuse_building(monkeypatch)
    r = run_cli("memory", "gpt2-xl", "--measure", "cpu")
    one_line_error(r, "would take about")


# ------------------------------------------------------------------ output folders
def _entries(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


def test_a_long_out_name_is_one_line(run_cli, tmp_path):
    for out in (tmp_path / ("a" * 300), tmp_path / ("b" * 300) / "c", tmp_path / ("d" * 240)):
        r = run_cli("sweep", "gpt2-small", "--contexts", "16", "--no-plots", "--out", out)
        one_line_error(r, "255-byte limit")
    assert _entries(tmp_path) == []


def test_a_dangling_symlink_as_out_writes_nothing_anywhere(run_cli, tmp_path):
    (tmp_path / "here").mkdir()
    link = tmp_path / "here" / "link"
    link.symlink_to(tmp_path / "elsewhere" / "deep" / "target")
    for out in (link, link / "sub"):
        r = run_cli("sweep", "gpt2-small", "--contexts", "16", "--no-plots", "--out", out)
        one_line_error(r, "symbolic link to a missing")
    assert _entries(tmp_path) == ["here", "here/link"]


def test_only_a_folder_lm_account_wrote_is_replaced(run_cli, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "sweep.md").write_text("my notes")  # named like a sweep's file, but the user's
    r = run_cli("sweep", "gpt2-small", "--contexts", "16", "--no-plots", "--out", mine)
    one_line_error(r, "did not write", MARKER)
    assert _entries(mine) == ["sweep.md"] and (mine / "sweep.md").read_text() == "my notes"
    out = tmp_path / "out"
    for _ in range(2):  # a new folder, then the set it wrote
        r = run_cli("sweep", "gpt2-small", "--contexts", "16", "--no-plots", "--out", out)
        assert r.code == 0, r.err
    assert _entries(out) == sorted([MARKER, "sweep.csv", "sweep.json", "sweep.md"])


# ------------------------------------------------------------------ the process: stdout and Ctrl-C
def _run(code: str, *args: str, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code, *args], check=False, env=env, capture_output=True, text=True, **kw
    )


MAIN = "import sys; from lm_accounting.cli import main; main()"


def test_a_full_or_closed_stdout_is_one_line():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open("/dev/full", "w") as full:
        p = subprocess.run(
            [sys.executable, "-c", MAIN, "presets"],
            check=False,
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
    assert p.returncode == 2 and p.stderr == "lm-account: error: cannot write the output: No space left on device\n"
    started_closed = subprocess.run(  # fd 1 closed before Python starts: sys.stdout is None
        [sys.executable, "-c", MAIN, "presets"],
        check=False,
        preexec_fn=lambda: os.close(1),
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert started_closed.returncode == 2 and started_closed.stderr.count("\n") == 1
    assert started_closed.stderr.startswith("lm-account: error: standard output is closed")
    p = _run(f"import os; os.close(1); {MAIN}", "presets")  # closed under Python's feet
    assert p.returncode == 2 and p.stderr == "lm-account: error: cannot write the output: Bad file descriptor\n"


INTERRUPT_AT_TORCH = """
import os, signal, sys, time
class AtTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            BODY
        return None
sys.meta_path.insert(0, AtTorch())
from lm_accounting.cli import main
main()
"""
KILL = "os.kill(os.getpid(), signal.SIGINT); time.sleep(1)"


@pytest.mark.slow  # two processes that import torch: about 3 CPU-seconds
@pytest.mark.parametrize(
    "body",
    [KILL, f"try:\n                {KILL}\n            except BaseException:\n                pass"],
    ids=["raised", "swallowed"],
)
def test_ctrl_c_during_heavy_imports_exits_130_with_one_line(body):
    """Ctrl-C as torch is being imported (the SIGINT is sent from the import itself, so it lands there): 130 and
    one line, also when the importing code swallows the KeyboardInterrupt."""
    p = _run(INTERRUPT_AT_TORCH.replace("BODY", body), "infer", "gpt2-small", "-P", "8", "-G", "4", "--measure", "meta")
    assert p.returncode == 130, p.stderr[-2000:]
    assert "Traceback" not in p.stderr and p.stderr.strip().splitlines()[-1] == "lm-account: interrupted"
    assert [line for line in p.stderr.splitlines() if line.startswith("lm-account:")] == ["lm-account: interrupted"]


def test_ctrl_c_mid_run_exits_130_with_one_line():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-c", MAIN, "infer", "gpt2-small", "-P", "8", "-G", "4", "--measure", "meta"]
    with subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        assert p.stderr.readline().startswith("measuring gpt2-small on meta")  # past the estimate: torch work
        p.send_signal(signal.SIGINT)
        out, err = p.communicate()
    assert p.returncode == 130 and out == ""
    assert "Traceback" not in err and err.strip().splitlines() == ["lm-account: interrupted"]
