"""The op library's CUDA target (``analytic/ops/cuda.py``): a plain run on a GPU.

* Our model (``--impl course``) on ``device="cuda"`` equals every figure the H200 measured (reports/cuda/memory.csv,
  torch 2.11, 174 points × 7 figures), the three that the legacy replay misses included: the memory-efficient
  backward's ``delta`` (136,314,880 B at S 8,192) and a naive amp-bf16 AV copy (8,388,608 B).
* It equals the legacy replay's CUDA prediction (``analytic.replay.predict_training_step(device="cuda")``) on a grid
  of small Llama-like models (llama, qwen2, qwen3, mixtral; GQA and one K/V head per query head) × precision ×
  attention × checkpointing × B 1..3, but for the fp32 fused attention's backward peak, which the legacy leaves
  ``delta`` out of: there the program is higher by at most that (by hand), by all of it where delta sets the peak.
* Each CUDA fact by hand, read off a replay's allocation log: flash's saved rng tensors and logsumexp, its
  backward's ``softmax_d``, ``dq_accum`` and expanded dK/dV; the memory-efficient kernel's padded logsumexp, its
  (B, S, h, d) output (the heads' merge is a view) and ``delta``; a row sum's staging and the id sort's scratch as
  the H200 measured them op by op (reports/cuda/kernels.csv).
* What is refused on cuda, and transformers' programs on cuda (the facts inherited, by hand).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from lm_accounting.analytic.ops import EXACTNESS, course, exactness, predict_step
from lm_accounting.analytic.ops.course.model import TransformerLM
from lm_accounting.analytic.ops.step import training_step
from lm_accounting.analytic.replay import predict_training_step
from lm_accounting.config import ModelConfig, load_config
from lm_accounting.phases import PHASES
from lm_accounting.setup import TrainingSetup

ROOT = Path(__file__).resolve().parent.parent
BASE = dict(
    vocab_size=31, context_length=16, num_layers=3, d_model=18, num_heads=6, num_kv_heads=2, head_dim=8, d_ff=22
)
ARCHS = {
    "llama": {},
    "qwen3": {"qk_norm": True, "tie_embeddings": True},
    "qwen2": {"qkv_bias": True},
    "mixtral": dict(num_experts=4, experts_per_token=2, expert_d_ff=8),
    "llama-mha": {"num_kv_heads": 6},  # fp32 fused attention: the memory-efficient kernel
    "qwen3-mha": {"qk_norm": True, "tie_embeddings": True, "num_kv_heads": 6},
}


def config(arch: str, **over) -> ModelConfig:
    return ModelConfig(**{**BASE, **ARCHS[arch], **over}, name=arch)


def every_setup():
    for attention in ("naive", "sdpa"):
        for checkpoint in ("none", "full", "selective"):
            for precision in ("fp32", "bf16", "amp-bf16"):
                yield TrainingSetup(attention=attention, checkpoint=checkpoint, precision=precision)


def cuda_step(cfg, seq, setup, batch):
    return course.predict_step(cfg, seq, setup, batch=batch, mode="plain", device="cuda").at(batch)


# -- the H200's measurements ---------------------------------------------------------------------------


def validation():
    spec = importlib.util.spec_from_file_location("cuda_validation", ROOT / "benchmarks" / "cuda_validation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_h200_figure_equals_the_course_program_on_cuda():
    """232 measured steps (gpt2-small, qwen3-0.6b, llama-3-8b and qwen3-30b-a3b at 2 layers, attention-bound
    shapes; every attention × checkpointing × precision, torchtitan's per-op ``op`` measured 2026-11-28), 1,624
    figures: all equal, the legacy's three misses
    included (tests/test_cuda_report.py lists them for the legacy replay)."""
    cv = validation()
    rows = {(r["model"], r["context"], r["setup"]): r for r in cv.read_tables(ROOT / "reports" / "cuda")["memory"]}
    setups = {s.label: s for s in cv.every_setup()}
    figures = 0
    for name, seq, batch, overrides in cv.MODELS:
        cfg = cv.at(cv.config(name, overrides), seq)
        for label, setup in setups.items():
            row = rows.get((cv.label(name, overrides), seq, label))
            if row is None or row.get("error"):
                continue
            got = cuda_step(cfg, seq, setup, batch)
            assert got.baseline == row["baseline_measured"], (name, label)
            for phase in PHASES:
                p = got.phase(phase)
                assert (p.peak, p.end) == (row[f"{phase}_peak_measured"], row[f"{phase}_end_measured"]), (
                    cv.label(name, overrides),
                    label,
                    phase,
                )
            figures += 7
    assert figures == 1624


# -- the legacy replay -----------------------------------------------------------------------------------


def delta(cfg: ModelConfig, seq: int, batch: int) -> int:
    """The memory-efficient backward's fp32 ``delta`` by hand: grad·out (B, S, h, d), its sum (B, S, h) and the
    contiguous (B, h, S), 4 bytes each."""
    return (batch * seq * cfg.num_heads * cfg.d_head + 2 * batch * seq * cfg.num_heads) * 4


def check_legacy(arch: str, setup: TrainingSetup, seq: int, batches=(1, 2, 3)) -> None:
    cfg = config(arch)
    efficient = setup.attention == "sdpa" and setup.precision == "fp32"
    if efficient and cfg.kv_heads != cfg.num_heads:  # no CUDA kernel: both refuse
        with pytest.raises(ValueError, match="grouped KV heads"):
            cuda_step(cfg, seq, setup, 1)
        return
    for batch in batches:
        got = cuda_step(cfg, seq, setup, batch)
        want = predict_training_step(cfg, seq, batch, setup=setup, mode="plain", device="cuda")
        what = f"{arch} {setup.label} S={seq} B={batch}"
        assert got.baseline == want.baseline, what
        for phase in PHASES:
            g, w = got.phase(phase), want.phase(phase)
            assert (g.peak, g.end) == (w.peak, w.end), f"{what}: {phase}"


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen3", "llama-mha"])
def test_the_course_program_on_cuda_equals_the_legacy_replay(arch):
    """The default run: every setup of a GQA model with qk-norm and tied embeddings, and of a model whose fp32
    fused attention is the memory-efficient kernel (whose backward's ``delta`` both count)."""
    for setup in every_setup():
        check_legacy(arch, setup, 8)
    cfg = config("llama-mha")
    setup = TrainingSetup(attention="sdpa")
    got = cuda_step(cfg, 8, setup, 2)
    want = predict_training_step(cfg, 8, 2, setup=setup, mode="plain", device="cuda")
    assert got.backward.peak == want.backward.peak
    assert delta(cfg, 8, 2) == 2 * 8 * 6 * (8 + 2) * 4  # the legacy's cuda backward holds it beside dQ, dK, dV


@pytest.mark.grid
@pytest.mark.parametrize("seq", [8, 12, 16])
@pytest.mark.parametrize("arch", ARCHS)
def test_grid_course_on_cuda_equals_the_legacy_replay(arch, seq):
    for setup in every_setup():
        check_legacy(arch, setup, seq)


# -- each fact by hand ---------------------------------------------------------------------------------------


def log_of(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: int = 2) -> list[list[tuple[str, int]]]:
    """The plain CUDA run's allocations and frees, per phase (baseline, forward, backward, optimizer step)."""
    log: list = []
    make = lambda: TransformerLM(cfg, seq, setup, batch)
    training_step(make, optimizer="foreach", device="cuda", traced=False, log=log, cuda_batch=batch)
    phases: list[list] = [[]]
    for label, nbytes in log:
        if label == "PHASE":
            phases.append([])
        else:
            phases[-1].append((label, nbytes))
    return phases[:4]  # a line closes each phase


def made(entries, label: str) -> list[int]:
    return [n for name, n in entries if name == label]


def test_flash_saves_its_rng_tensors_and_its_backward_scratch():
    """One layer, bf16, 6 heads of 8 over 2 K/V heads, S 8, B 2: the forward makes the output (B·S·h·d·2), the
    logsumexp (B·h·S·4), rng_state (16) and unused (8); the backward makes softmax_d (B·h·128·4), dq_accum
    (B·128·h·32·4) and dK, dV expanded to 6 heads (B·S·h·d·2 each)."""
    cfg = config("llama", num_layers=1)
    _, forward, backward, _ = log_of(cfg, 8, TrainingSetup(attention="sdpa", precision="bf16"))
    assert made(forward, "flash") == [2 * 8 * 6 * 8 * 2, 2 * 6 * 8 * 4, 16, 8]
    assert made(backward, "flash_softmax_d") == [2 * 6 * 128 * 4]
    assert made(backward, "flash_dq_accum") == [2 * 128 * 6 * 32 * 4]
    assert made(backward, "flash_dkv_expanded") == [2 * 8 * 6 * 8 * 2] * 2
    # the output laid out as the query (B, h, S, d): merging the heads copies it, and its backward makes the
    # output contiguous in (B, S, h, d) again (a copy beside dq, dk, dv)
    assert made(backward, "clone").count(2 * 8 * 6 * 8 * 2) >= 1


def test_the_memory_efficient_kernel_pads_its_logsumexp_and_computes_delta():
    """fp32, 6 heads of 8 (no grouping), S 40, B 2: logsumexp (B, h, 64) fp32; the output (B, S, h, d) so the
    heads' merge is a view (no copy in the forward); the backward's delta: grad·out, its sum, the transpose."""
    cfg = config("llama-mha", num_layers=1, context_length=40)
    _, forward, backward, _ = log_of(cfg, 40, TrainingSetup(attention="sdpa", precision="fp32"))
    assert made(forward, "efficient") == [2 * 40 * 6 * 8 * 4, 2 * 6 * 64 * 4]
    assert made(forward, "clone") == []
    assert made(backward, "delta_product") == [2 * 40 * 6 * 8 * 4]
    assert made(backward, "delta_sum") == made(backward, "delta") == [2 * 40 * 6 * 4]


def test_row_sums_and_the_id_sort_as_the_h200_measured_them():
    """reports/cuda/kernels.csv, measured op by op on the H200: a sum over 2,048 rows of a 256-wide fp32 tensor
    stages 4,194,312 B; index_put_ with accumulate of 512 ids keeps 16,385 B (2,048 ids: 65,537 B).  A model of
    d_model 256 at B·S = 2,048 tokens: each RMSNorm weight's gradient (two per layer, the final one) and the
    embedding's backward, once per step."""
    cfg = config("llama", num_layers=1, d_model=256, context_length=1024)
    _, _, backward, _ = log_of(cfg, 1024, TrainingSetup(precision="bf16"))
    assert made(backward, "reduce_staging") == [4_194_312] * 3
    assert made(backward, "index_put_sort") == [65_537]
    _, _, backward, _ = log_of(dataclasses.replace(cfg, context_length=256), 256, TrainingSetup())
    assert made(backward, "index_put_sort") == [16_385]
    assert made(backward, "reduce_staging") == []  # 512 rows: one block column, no global staging


def test_a_bias_gradient_is_the_same_row_sum():
    """qwen2's fp32 q/k/v biases: their gradients are the same sum over rows (``sum_to``), 3 per layer beside
    the 3 norms; the legacy replay leaves the biases' staging out (its scratch sits below the backward peak)."""
    cfg = config("qwen2", num_layers=1, d_model=256, num_heads=4, num_kv_heads=4, head_dim=64, context_length=1024)
    _, _, backward, _ = log_of(cfg, 1024, TrainingSetup())
    assert made(backward, "reduce_staging") == [4_194_312] * 6


def test_the_scratch_that_is_no_line_in_batch_is_taken_at_the_batch_asked():
    """The step replayed with B a symbol: the row sums' staging at the batch asked, exact there (B 2 and 3)."""
    cfg = config("llama", d_model=256, context_length=1024)
    setup = TrainingSetup(precision="bf16")
    for batch in (2, 3):
        lines = course.predict_step(cfg, 1024, setup, batch=batch, mode="plain", device="cuda").at(batch)
        want = predict_training_step(cfg, 1024, batch, setup=setup, mode="plain", device="cuda")
        assert lines == want


def test_fused_adamw_keeps_its_step_counters_on_the_gpu():
    """torch's ``Adam._init_group``: fused keeps each parameter's fp32 step counter on its device, foreach on the
    CPU: 4 bytes per parameter tensor more on the GPU from the baseline on (3 layers of 9 tensors, the embedding,
    the final norm and the LM head: 30)."""
    cfg = config("llama")
    fused = cuda_step(cfg, 8, TrainingSetup(optimizer="fused"), 2)
    foreach = cuda_step(cfg, 8, TrainingSetup(optimizer="foreach"), 2)
    assert fused.baseline - foreach.baseline == fused.backward.end - foreach.backward.end == 4 * 30


# -- refusals, transformers, the runs' words -------------------------------------------------------------------


def test_what_cuda_refuses():
    with pytest.raises(ValueError, match="grouped KV heads"):
        cuda_step(config("llama"), 8, TrainingSetup(attention="sdpa"), 1)
    with pytest.raises(ValueError, match="multiple of 8"):
        cuda_step(config("llama", head_dim=10), 8, TrainingSetup(attention="sdpa", precision="bf16"), 1)
    # transformers' windows and GPT-2's dropout take kernels the H100 measured (reports/cuda-h100): not refused
    window = dataclasses.replace(load_config("mistral-7b"), num_layers=1, sliding_window=64)
    sdpa = TrainingSetup(attention="sdpa", precision="bf16")
    predict_step(window, 64, sdpa, impl="transformers", batch=2, mode="plain", device="cuda")
    predict_step(load_config("openai-gpt2"), 64, sdpa, impl="transformers", batch=2, mode="plain", device="cuda")
    with pytest.raises(ValueError, match="multiple of 8"):  # transformers too: the padded head dim is not modelled
        odd = dataclasses.replace(window, head_dim=10)
        predict_step(odd, 64, sdpa, impl="transformers", batch=2, mode="plain", device="cuda")


def test_transformers_on_cuda_takes_cudnn_attention():
    """transformers' Llama with sdpa (is_causal, enable_gqa, no mask, no backend pinned) on cuda against its plain
    run on meta (the CPU flash kernel's program): the forward ends 16 B per layer higher (cuDNN's philox seed and
    offset, two 0-d int64 on the GPU; flash would save 24: the H100 measured 16, reports/cuda-h100/traces/probe.txt),
    and the memory-efficient kernel of a 16-head fp32 model pads its logsumexp from S 200 to 224 rows."""
    cfg = dataclasses.replace(load_config("llama-3-8b"), num_layers=2, vocab_size=512)
    setup = TrainingSetup(attention="sdpa", precision="bf16")
    cuda = predict_step(cfg, 256, setup, impl="transformers", batch=2, mode="plain", device="cuda").at(2)
    meta = predict_step(cfg, 256, setup, impl="transformers", batch=2, mode="plain", device="meta").at(2)
    assert cuda.forward.end - meta.forward.end == 2 * 16
    mha = dataclasses.replace(cfg, num_kv_heads=4, d_model=512, num_heads=4, head_dim=128, d_ff=64)
    fp32 = TrainingSetup(attention="sdpa")
    cuda = predict_step(mha, 200, fp32, impl="transformers", batch=2, mode="plain", device="cuda").at(2)
    meta = predict_step(mha, 200, fp32, impl="transformers", batch=2, mode="plain", device="meta").at(2)
    assert cuda.forward.end - meta.forward.end == 2 * 2 * 4 * (224 - 200) * 4


def test_each_run_says_how_it_is_proven():
    assert "H200" in exactness("course", "plain", "cuda")
    assert "H100" in exactness("transformers", "plain", "cuda")
    assert exactness("transformers", "traced", "meta") == EXACTNESS["traced", "meta"]
    with pytest.raises(ValueError):
        exactness("course", "traced", "cuda")
