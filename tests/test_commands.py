"""The command layer (``lm_accounting.commands``) called as a library: each request refuses what the
command line refuses, before any work; the budget per GPU is one rule in memory, infer and plan."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lm_accounting import load_config
from lm_accounting.commands import account, crosscheck, infer, memory, plan, presets, report, sweep, train_time
from lm_accounting.config import AccountingError
from lm_accounting.gpus import GPUS, memory_budget
from lm_accounting.layout import ParallelLayout
from lm_accounting.setup import TrainingSetup

GIB = 2**30
# An H100 80GB's CUDA total as torch prints it, 79.11 GiB = 79.11 × 1,073,741,824 = 84,943,715,696.64
# bytes (kept whole: 84,943,715,696), less the 3 GB (3,000,000,000 bytes) allowance.
H100_BUDGET = 84_943_715_696 - 3_000_000_000
# An H200's: 139.80 GiB = 139.8 × 1,073,741,824 = 150,109,106,995.2 → 150,109,106,995 bytes.
H200_TOTAL = 150_109_106_995


def refused(make, needle: str) -> None:
    with pytest.raises(AccountingError) as err:
        make()
    assert needle in str(err.value), str(err.value)


# -- the one budget rule ----------------------------------------------------------------------------------


def test_budget_is_the_cuda_total_less_the_allowance():
    b = memory_budget("h100-80gb")
    assert b.usable == H100_BUDGET and b.allowance == 3 * 10**9 and not b.given
    assert memory_budget("h200", allowance=10**9).usable == H200_TOTAL - 10**9
    # no record of the L4's CUDA total: its datasheet 24 GB, read as 24·10⁹ bytes, is the stated fallback
    assert GPUS["l4"].cuda_total == 24 * 10**9 and "no public record" in GPUS["l4"].cuda_total_source
    given = memory_budget("h100-80gb", budget=6 * 10**9)
    assert given.usable == 6 * 10**9 and given.given and given.allowance is None
    assert "as given" in given.rule and "CUDA total" in b.rule and "allowance" in b.rule


def test_every_cuda_total_lies_between_the_decimal_and_binary_capacity():
    """CUDA reports a little less than the stacks hold (binary GiB) and more than the datasheet's decimal
    GB; a recorded figure outside that range is a typo."""
    for g in GPUS.values():
        capacity_gib = g.memory_bytes // 10**9  # 80 for an "80 GB" card: 80 GiB of HBM
        assert g.memory_bytes <= g.cuda_total <= capacity_gib * GIB, g.name
        assert g.cuda_total_source


def test_budget_refusals():
    refused(lambda: memory_budget("h100-80gb", allowance=10**9, budget=10**10), "give one of them")
    refused(lambda: memory_budget("h100-80gb", allowance=100 * 10**9), "leaves nothing of the h100-80gb")
    refused(lambda: memory_budget("h1000"), "unknown GPU")


def test_memory_infer_and_plan_share_the_default_budget():
    cfg = load_config("gpt2-small")
    single = memory.run(memory.Request(cfg, 256))
    layout = memory.run(memory.Request(cfg, 256, layout=ParallelLayout(dp=2, zero=3)))
    served = infer.run(infer.Request(cfg, 16, 4))
    planned = plan.Request(cfg, 10**9, gpus=(8, 8), context=256).budget_basis
    for basis in (single.budget_basis, layout.budget_basis, served.budget_basis, planned):
        assert basis.usable == H100_BUDGET and basis.allowance == 3 * 10**9
    assert single.budget == layout.budget == served.budget == H100_BUDGET
    # the peak alone is compared with it, under a layout as on one GPU
    assert layout.fits == (layout.peak <= H100_BUDGET)
    d = layout.to_dict()
    assert d["budget"] == H100_BUDGET and d["allowance"] == 3 * 10**9
    assert d["budget_basis"]["cuda_total_bytes"] == H100_BUDGET + 3 * 10**9
    assert json.loads(json.dumps(single.to_dict()))["budget_basis"]["rule"] == "cuda_total - allowance"


def test_an_explicit_budget_is_taken_as_given():
    cfg = load_config("gpt2-small")
    m = memory.run(memory.Request(cfg, 256, budget=10**9))
    assert m.budget == 10**9 and m.budget_basis.given
    r = infer.run(infer.Request(cfg, 16, 4, gpu="h200", budget=10**9))
    assert r.budget == 10**9 and r.budget_basis.allowance is None


# -- one test per command: the request refuses what the CLI refuses ----------------------------------------


def test_memory_refusals():
    cfg = load_config("llama-3-8b")  # 32 heads, 8 KV heads: grouped
    sdpa = TrainingSetup(attention="sdpa")
    dp8 = ParallelLayout(dp=8, zero=3)
    # no fused CUDA kernel for fp32 with grouped KV heads: refused with a layout as on one GPU
    refused(lambda: memory.Request(cfg, 1024, setup=sdpa, layout=dp8), "no CUDA kernel")
    refused(lambda: memory.Request(cfg, 1024, setup=sdpa), "no CUDA kernel")
    memory.Request(cfg, 1024, setup=sdpa, layout=dp8, measure="meta")  # the CPU kernel's run is measurable
    small = load_config("gpt2-small")
    refused(lambda: memory.Request(small, 64, rank=1), "--rank needs a parallel layout")
    refused(lambda: memory.Request(small, 64, layout=ParallelLayout(dp=2), rank=2), "outside the world of 2")
    refused(lambda: memory.Request(small, 64, layout=ParallelLayout(dp=2), measure="cuda"), "fake process group")
    refused(lambda: memory.Request(small, 64, measure_method="tracker"), "needs a measurement")
    refused(lambda: memory.Request(small, 64, measure="meta", measure_method="allocator"), "needs --measure cpu")
    refused(lambda: memory.Request(small, 64, measure="cuda", measure_method="tracker"), "caching allocator")
    refused(lambda: memory.Request(small, 64, measure="tpu"), "unknown --measure")
    refused(lambda: memory.Request(small, 64, budget=10**9, allowance=10**9), "give one of them")
    refused(lambda: memory.Request(small, 64, gpu="h1000"), "unknown GPU")
    refused(lambda: memory.Request(small, 64, batch=0), "batch")
    memory.Request(load_config("deepseek-v3"), 64, measure="meta")  # MLA and MoE: the course program models them
    mla_sdpa = TrainingSetup(attention="sdpa")  # the live model refuses fused attention with latent attention
    refused(lambda: memory.Request(load_config("deepseek-v3"), 64, setup=mla_sdpa, measure="meta"), "latent attention")
    assert memory.Request(small, 64, measure="cpu", measure_method="allocator").method == "allocator"
    assert memory.Request(small, 64, measure="cuda").method == "cuda"


def test_memory_refusal_is_the_cli_refusal(run_cli):
    args = ("memory", "llama-3-8b", "-S", "1024", "--attention", "sdpa", "--dp", "8", "--zero", "3")
    r = run_cli(*args)
    assert r.code == 2 and r.out == "" and "no CUDA kernel" in r.err


def test_infer_refusals():
    cfg = load_config("llama-3-8b")
    refused(lambda: infer.Request(cfg, 16, 4, weights="fp32", attention="sdpa"), "no CUDA kernel")
    infer.Request(cfg, 16, 4, weights="fp32", attention="sdpa", measure="meta")  # the CPU kernel
    refused(lambda: infer.Request(cfg, 16, 4, weights="fp4"), "unknown weight dtype")
    refused(lambda: infer.Request(cfg, 16, 4, kv_dtype="int4"), "unknown KV-cache dtype")
    refused(lambda: infer.Request(cfg, 16, 4, semantics="paged"), "unknown cache semantics")
    refused(lambda: infer.Request(cfg, 16, 4, semantics="static", attention="sdpa"), "static")
    refused(lambda: infer.Request(cfg, 16, 4, measure="tpu"), "unknown --measure")
    refused(lambda: infer.Request(cfg, 16, 4, tp=3), "")
    refused(lambda: infer.Request(cfg, 0, 4), "prompt")
    refused(lambda: infer.Request(cfg, 16, 4, budget=10**9, allowance=10**9), "give one of them")
    refused(lambda: infer.Request(cfg, 16, 4, gpu="h1000"), "unknown GPU")


def test_plan_refusals(tmp_path):
    cfg = load_config("llama-3-8b")
    refused(lambda: plan.Request(cfg, 10**12, allowance=100 * 10**9), "leaves nothing of the h100-80gb")
    refused(lambda: plan.Request(cfg, 10**12, efficiency=0), "--efficiency")
    refused(lambda: plan.Request(cfg, 10**12, top=0), "top")
    refused(lambda: plan.Request(cfg, 10**12, global_batch_tokens=1000), "whole number")
    refused(lambda: plan.Request(load_config("deepseek-v3"), 10**12), "does not model")
    refused(lambda: plan.Request(cfg, 10**12, gpus=(8, 4)), "LOW <= HIGH")
    refused(lambda: plan.Request(cfg, 10**12, plot_stem="x" * 300), "over the file system's 255-byte limit")
    afile = tmp_path / "afile"
    afile.write_text("")
    refused(lambda: plan.Request(cfg, 10**12, plot_stem=str(afile / "memory")), "not a directory")


def test_plan_plot_that_cannot_be_written_fails_before_printing(run_cli):
    """The plot's path is checked with the request: exit 2 and nothing on stdout, not a table and then an
    error.  /proc exists but takes no file; a 300-byte name fits no file system."""
    for stem in ("/proc/memory", "x" * 300):
        r = run_cli("plan", "llama-3-8b", "--tokens", "1e12", "--gpus", "8", "--plot", stem)
        assert r.code == 2 and r.out == "", (stem[:20], r.err)


def test_account_refusals():
    refused(lambda: account.Request(load_config("gpt2-small"), 64, batch=0), "batch")
    refused(lambda: account.Request(load_config("gpt2-small"), 0), "context")


def test_presets_request_takes_nothing():
    with pytest.raises(TypeError):
        presets.Request("gpt2-small")  # type: ignore[call-arg]
    names = [cfg.name for cfg, _, _ in presets.run(presets.Request()).presets]
    assert "gpt2-small" in names and "llama-3-8b" in names


def test_crosscheck_refusals():
    refused(lambda: crosscheck.Request(load_config("gpt2-small"), device="tpu"), "unknown device")
    refused(lambda: crosscheck.Request(load_config("gpt2-small"), batch=0), "batch")


def test_train_time_refusals():
    cfg = load_config("gpt2-small")
    refused(lambda: train_time.Request(cfg, gpu="h1000"), "unknown GPU")
    refused(lambda: train_time.Request(cfg, gpu="a100", gpu_dtype="fp8"), "no 'fp8' figure")
    refused(lambda: train_time.Request(cfg, method="7nd"), "unknown step FLOPs method")
    refused(lambda: train_time.Request(cfg, efficiency=1.6), "--efficiency")
    refused(lambda: train_time.Request(cfg, gpu="h1000", peak_flops=1e15), "unknown GPU")  # the step needs one


def test_sweep_refusals(tmp_path):
    cfg = (load_config("gpt2-small"),)
    afile = tmp_path / "afile"
    afile.write_text("mine")
    refused(lambda: sweep.Request(cfg, out=str(afile)), "not a directory")
    refused(lambda: sweep.Request(cfg, contexts="0:10:x2", out=str(tmp_path / "s")), "")
    refused(lambda: sweep.Request(cfg, measure="tpu", out=str(tmp_path / "s")), "unknown --measure-memory")
    refused(lambda: sweep.Request((), out=str(tmp_path / "s")), "at least one model")
    refused(lambda: sweep.Request(cfg, budget="80", out=str(tmp_path / "s")), "unit")
    assert sweep.Request(cfg, contexts="64,128", out=str(tmp_path / "s")).context_list == (64, 128)


def test_report_refusals(tmp_path):
    (tmp_path / "notes.txt").write_text("a user's own file")
    refused(lambda: report.Request(str(tmp_path)), "refusing to replace")


def test_command_modules_import_no_heavy_library():
    """Every request module imports without torch, pandas or matplotlib (a measurement imports them when
    it runs); the analytic commands run without them."""
    code = (
        "import sys\n"
        "from lm_accounting import load_config\n"
        "from lm_accounting.commands import account, crosscheck, infer, memory, plan, presets, report, sweep, "
        "train_time\n"
        "cfg = load_config('gpt2-small')\n"
        "memory.run(memory.Request(cfg, 64))\n"
        "infer.run(infer.Request(cfg, 8, 4))\n"
        "account.run(account.Request(cfg, 64))\n"
        "train_time.run(train_time.Request(cfg, 64))\n"
        "print(','.join(m for m in ('torch', 'matplotlib', 'pandas') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == ""


def test_the_cli_shows_the_rule_and_its_figures(run_cli):
    """memory --gpu, infer --allowance and plan print the one rule with its figures, worked by hand."""
    # the H200's 139.80 GiB = 150,109,106,995 bytes, less 3 GB: 147,109,106,995 bytes = 147.109 GB
    r = run_cli("memory", "gpt2-small", "--context", "256", "--gpu", "h200")
    assert r.code == 0 and "budget 147.109 GB" in r.out and "h200's CUDA total 150.109 GB" in r.out
    # the H100's 84,943,715,696 bytes less 1 GB: 83,943,715,696 bytes = 83.944 GB
    r = run_cli("infer", "gpt2-small", "--prompt", "16", "--generate", "4", "--allowance", "1GB")
    assert r.code == 0 and "budget 83.944 GB" in r.out and "allowance 1.000 GB" in r.out
    r = run_cli("infer", "gpt2-small", "--prompt", "16", "--generate", "4", "--budget", "2GB", "--format", "json")
    assert json.loads(r.out)["budget_basis"] == {
        "usable_bytes": 2 * 10**9,
        "rule": "given",
        "gpu": None,
        "cuda_total_bytes": None,
        "cuda_total_source": None,
        "allowance_bytes": None,
    }
    r = run_cli("plan", "gpt2-small", "--tokens", "1e9", "--gpus", "8", "--top", "1")
    assert r.code == 0 and "budget 81.944 GB" in r.out and "within the CUDA total" in r.out


TINY_ARGS = ("gpt2-small", "--layers", "1", "--d-model", "64", "--heads", "4", "--d-ff", "128", "-S", "32")


@pytest.mark.parametrize(
    "args",
    [
        ("memory", *TINY_ARGS, "--measure", "meta"),
        ("memory", *TINY_ARGS, "--dp", "2", "--zero", "3", "--measure", "meta"),
        ("crosscheck", *TINY_ARGS),
    ],
)
def test_allow_long_lifts_the_time_bound_of_every_live_command(run_cli, monkeypatch, args):
    """With the bound at 0 s every live run is 'too long': refused in one line without --allow-long (before
    anything is built), run to the end with it."""
    from lm_accounting.measure import devices

    monkeypatch.setattr(devices, "MAX_LIVE_SECONDS", 0)
    refused = run_cli(*args)
    assert refused.code == 2 and "would take about" in refused.err and "--allow-long" in refused.err
    assert run_cli(*args, "--allow-long").code == 0
    assert not devices.LONG_RUNS.get()  # the permission ends with the command
