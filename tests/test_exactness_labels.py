"""The word "exact" on a CUDA figure is true (issue 26, H11's F0, F1, F6, F11): it is printed, and set in the JSON
(``implementation_exact.exact``, ``validated_on``), only for the architectures the H200 measured, on a GPU with
its kernels, for the code that predicts them; everywhere else the output says what the figure is."""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest

from lm_accounting.analytic.memory_report import gpu_unmeasured
from lm_accounting.analytic.program_report import implementation_account
from lm_accounting.config import load_config
from lm_accounting.gpus import memory_budget
from lm_accounting.provenance import CUDA, KERNEL_FACT_GPUS, MEASURED_MODELS
from lm_accounting.setup import TrainingSetup

ROOT = Path(__file__).resolve().parent.parent
SMALL = ("--layers", "2", "--vocab-size", "512")


def measured_rows() -> list[dict[str, str]]:
    with (ROOT / "reports" / "cuda" / "memory.csv").open() as f:
        return list(csv.DictReader(f))


def row(model: str, setup: str) -> dict[str, str]:
    (hit,) = [r for r in measured_rows() if r["model"] == model and r["setup"] == setup]
    return hit


def memory_json(run_cli, *args) -> dict:
    r = run_cli("memory", *args, "--format", "json")
    assert r.code == 0, r.err
    return json.loads(r.out)["implementation_exact"]


def test_the_measured_models_are_the_ones_the_table_holds_and_all_count_as_measured():
    """MEASURED_MODELS recounted from reports/cuda/memory.csv; each of their architectures is one the rule calls
    measured (no option of theirs is left out of the H200's runs)."""
    presets = {r["model"].split(" (")[0] for r in measured_rows()}
    assert presets == set(MEASURED_MODELS)
    for name in MEASURED_MODELS:
        assert gpu_unmeasured(load_config(name)) == [], name
    assert CUDA.program_equal[1] == CUDA.equal["memory"][1] == (174 + 58) * 7  # steps that ran (58 op), 7 figures


def test_fp32_memory_efficient_backward_holds_delta_as_the_h200_measured(run_cli):
    """F0: the legacy replay's fp32 sdpa backward on cuda holds the kernel's ``delta``: the H200's figure, and
    delta by hand, (2·8,192·16·128 + 2·2·8,192·16)·4 = 136,314,880 B above the replay without it."""
    args = ("qwen3-0.6b", *SMALL, "--d-model", "256", "--d-ff", "512", "--kv-heads", "16")
    data = memory_json(run_cli, *args, "--context", "8192", "--batch", "2", "--attention", "sdpa")
    want = row("qwen3-0.6b (2 layers, vocab 512, d_model 256, d_ff 512, kv heads 16)", "sdpa+none+fp32+foreach")
    assert data["step"]["backward"]["peak"] == int(want["backward_peak_measured"]) == 3_249_495_048
    assert int(want["backward_peak_measured"]) - 3_113_180_168 == (2 * 8192 * 16 * 128 + 2 * 2 * 8192 * 16) * 4
    assert data["exact"] is True and data["validated_on"] == "NVIDIA H200"
    assert data["validated"]["code"] == "analytic/replay.py"


def test_the_legacy_replays_one_miss_is_predicted_by_the_op_library():
    """F0: naive attention under amp-bf16 with grouped K/V heads on cuda goes to the op library's course program,
    which gives the H200's forward peak (the legacy replay is 8,388,608 B high there)."""
    cfg = dataclasses.replace(load_config("llama-3-8b"), num_layers=2, vocab_size=512).with_context(4096)
    setup = TrainingSetup(precision="amp-bf16")
    got = implementation_account(cfg, 4096, 1, impl="course", setup=setup, device="cuda")
    want = row("llama-3-8b (2 layers, vocab 512)", "naive+none+amp-bf16+foreach")
    assert got.predicted_by == "ops" and got.exactness.exact
    assert got.step.forward.peak == int(want["forward_peak_measured"]) == 16_952_721_408
    assert got.validated()["equal"] == 1624


@pytest.mark.parametrize(
    "args, what",
    [
        (("openai-gpt2", "--context", "1024"), "LayerNorm"),
        (("mistral-7b", "--context", "4096", *SMALL), "sliding-window attention"),
        (("deepseek-v3", "--context", "1024", "--layers", "4", "--vocab-size", "512"), "latent attention (MLA)"),
    ],
)
def test_an_architecture_no_gpu_ran_is_not_called_exact_for_cuda(run_cli, args, what):
    """F1: GPT-2, sliding windows and MLA course programs use the H200's kernel facts but never ran on a GPU."""
    r = run_cli("memory", *args)
    assert r.code == 0, r.err
    assert "exact prediction for cuda" not in r.out and "(our live model, exact)" not in r.out
    assert "this architecture was not run on a GPU" in r.out and what in r.out
    data = memory_json(run_cli, *args)
    assert data["exact"] is False and data["validated_on"] is None and data["validated"] is None
    assert "no GPU ran this architecture's" in data["exactness"]
    csv_out = run_cli("memory", *args, "--format", "csv").out
    assert "implementation_exact.exactness,exact,whether the step is exact on cuda" in csv_out
    assert ",exact,False,," in csv_out


@pytest.mark.parametrize("gpu", ["v100", "l4", "a100-80gb", "h100-pcie", "mi300x"])
def test_a_gpu_without_the_h200s_kernels_is_not_validated(run_cli, gpu):
    """F11: the kernel facts are the H200's (Hopper, 132 multiprocessors); other GPUs get the same figures, not
    called exact; an AMD GPU is said not to be CUDA, a V100 to have no bf16."""
    args = ("qwen3-0.6b", *SMALL, "--attention", "sdpa", "--precision", "bf16", "--context", "2048", "--gpu", gpu)
    r = run_cli("memory", *args)
    assert r.code == 0, r.err
    assert "exact prediction for cuda" not in r.out and f"not validated on the {gpu}" in r.out
    assert ("not CUDA" in r.out) == (gpu == "mi300x") and ("has no bf16" in r.out) == (gpu == "v100")
    data = memory_json(run_cli, *args)
    assert data["exact"] is False and data["validated_on"] is None
    assert "kernel facts measured on an NVIDIA H200" in data["exactness"]


@pytest.mark.parametrize("gpu", sorted(KERNEL_FACT_GPUS))
def test_the_h200_and_h100_sxm_are_exact_for_the_measured_architecture(run_cli, gpu):
    args = ("qwen3-0.6b", *SMALL, "--attention", "sdpa", "--precision", "bf16", "--context", "2048", "--gpu", gpu)
    r = run_cli("memory", *args)
    assert r.code == 0 and "exact prediction for cuda" in r.out
    assert memory_json(run_cli, *args)["exact"] is True


def test_the_budget_basis_carries_the_gpu_the_label_reads():
    assert memory_budget("v100").gpu.name == "v100" and memory_budget(budget=10**9).gpu is None


def test_a_model_states_only_footer_describes_that_implementation(run_cli, tmp_path, monkeypatch):
    """F6: transformers' PhiMoE with no program (its ``PROGRAMS`` entry removed: model states only) gets no footer
    about our live model's replay and no count of another code's CUDA figures."""
    from lm_accounting.analytic.ops.transformers import PROGRAMS

    monkeypatch.delitem(PROGRAMS, "phimoe")
    path = tmp_path / "config.json"
    moe = {"model_type": "phimoe", "vocab_size": 97, "hidden_size": 32, "intermediate_size": 64}
    shape = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4}
    experts = {"num_local_experts": 4, "num_experts_per_tok": 2}
    path.write_text(json.dumps({**moe, **shape, **experts, "max_position_embeddings": 64}))
    r = run_cli("memory", path, "-S", "32")
    assert r.code == 0 and "model states only" in r.out
    footer = r.out.split("Conventions:")[1]
    assert "our live model" not in footer and "1,21" not in footer and "PhimoeForCausalLM" in footer
    data = memory_json(run_cli, path, "-S", "32")
    assert data["exact"] is None and data["validated"] is None


@pytest.mark.slow
def test_what_memory_predicts_on_cuda_equals_every_h200_figure():
    """The account ``memory`` prints for --impl course on cuda (legacy replay, or the op library where the replay
    misses) equals all 1,624 figures the H200 measured, each labelled exact."""
    spec = importlib.util.spec_from_file_location("cuda_validation", ROOT / "benchmarks" / "cuda_validation.py")
    cv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cv)
    rows = {(r["model"], r["context"], r["setup"]): r for r in cv.read_tables(ROOT / "reports" / "cuda")["memory"]}
    figures, unequal = 0, []
    for name, seq, batch, overrides in cv.MODELS:
        cfg = cv.at(cv.config(name, overrides), seq)
        for setup in cv.every_setup():
            r = rows.get((cv.label(name, overrides), seq, setup.label))
            if r is None or r.get("error"):
                continue
            m = implementation_account(cfg, seq, batch, impl="course", setup=setup, device="cuda")
            assert m.exactness.exact, (name, setup.label)
            got = {"baseline": m.step.baseline}
            for phase in ("forward", "backward", "optimizer_step"):
                got |= {f"{phase}_peak": m.step.phase(phase).peak, f"{phase}_end": m.step.phase(phase).end}
            unequal += [(name, setup.label, k) for k, v in got.items() if v != r[f"{k}_measured"]]
            figures += len(got)
    assert (figures, unequal) == (1624, [])
