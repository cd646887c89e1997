"""The plain run (no dispatch mode: what a user gets) against the CPU allocator's own events, the
traced run against the storage tracker, and their difference against its formula (issue 9).

* plain: ``predict_training_step(..., mode="plain", device="cpu")`` equals
  ``measure_training_step_plain`` (torch.profiler's allocation events, no dispatch mode installed)
  byte for byte, for every setup, on tiny configs with every tensor size distinct;
* traced: ``mode="traced"`` equals the tracker on meta (also ``tests/test_memory_setups.py``);
* traced − plain equals ``traced_minus_plain``, and the measured plain run really is lower than the
  tracker's on the same CPU tensors (so the two measurements differ, and the test can fail).
"""

from itertools import product

import pytest
import torch
from test_memory_setups import assert_same

from lm_accounting import ModelConfig, load_config
from lm_accounting.analytic.replay import predict_training_step, traced_minus_plain
from lm_accounting.measure.memory import measure_step
from lm_accounting.phases import PHASES
from lm_accounting.setup import ATTENTIONS, CHECKPOINTS, PRECISIONS, TrainingSetup, every_setup

BASE = dict(
    vocab_size=31, context_length=16, num_layers=2, d_model=18, num_heads=6, num_kv_heads=2, head_dim=10, d_ff=22
)
VARIANTS = {
    "gqa": {},
    "gqa+qk_norm": {"qk_norm": True},
    "gqa+tied": {"tie_embeddings": True},
    "mha": {"num_kv_heads": None, "head_dim": None, "d_model": 24},
    "gqa+qkv_bias": {"qkv_bias": True},  # Qwen2: q/k/v biases (fp32 q, k, v under amp-bf16)
}
EVERY = [s for s in every_setup(("foreach",)) if s.checkpoint != "op"]  # the legacy replay's (op: test_ops_course)
REPLAYED = tuple(c for c in CHECKPOINTS if c != "op")


def plain_cpu(cfg, seq, batch, setup):
    """The plain prediction for this process's CPU run (the flash kernel's scratch is per thread)."""
    return predict_training_step(
        cfg, seq, batch, setup=setup, device="cpu", mode="plain", cpu_threads=torch.get_num_threads()
    )


@pytest.mark.grid
@pytest.mark.parametrize("setup", EVERY, ids=lambda s: s.label)
@pytest.mark.parametrize("variant", VARIANTS)
def test_plain_prediction_equals_cpu_allocator(variant, setup):
    cfg = ModelConfig(**{**BASE, **VARIANTS[variant]})
    measured = measure_step(cfg, 7, 3, device="cpu", setup=setup, method="allocator")
    assert_same(measured, plain_cpu(cfg, 7, 3, setup), variant)


@pytest.mark.grid
@pytest.mark.parametrize("optimizer", ["for-loop", "fused"])
@pytest.mark.parametrize("precision", PRECISIONS)
def test_plain_prediction_other_adamw(precision, optimizer):
    setup = TrainingSetup(attention="sdpa", checkpoint="full", precision=precision, optimizer=optimizer)
    cfg = ModelConfig(**BASE, tie_embeddings=True)
    measured = measure_step(cfg, 5, 2, device="cpu", setup=setup, method="allocator")
    assert_same(measured, plain_cpu(cfg, 5, 2, setup))


def test_plain_run_is_lower_than_traced_on_the_same_cpu_tensors():
    # the default setup: the tracker (a dispatch mode) measures the out-of-place copies, the
    # allocator does not; the gap is the formula's, plus nothing else on the tracker's side
    cfg = ModelConfig(**BASE)
    setup = TrainingSetup()
    plain = measure_step(cfg, 7, 3, device="cpu", setup=setup, method="allocator")
    traced = measure_step(cfg, 7, 3, device="cpu", setup=setup)
    assert plain.backward.peak < traced.backward.peak
    assert_same(traced, predict_training_step(cfg, 7, 3, setup=setup, device="cpu", mode="traced"))
    # hand count: the backward peak of both runs is at the cross-entropy's gather backward, where a
    # traced run holds a second T·V·4 tensor (scatter_add, not scatter_add_): T = 21, V = 31
    assert traced_minus_plain(cfg, 7, 3, setup=setup)["backward"] == 21 * 31 * 4


@pytest.mark.parametrize("setup", EVERY, ids=lambda s: s.label)
def test_difference_formula(setup):
    for cfg, seq, batch in (
        (ModelConfig(**BASE, qk_norm=True), 7, 3),
        (load_config("gpt2-small").with_context(512), 512, 4),
        (load_config("qwen3-0.6b").with_context(1024), 1024, 2),
    ):
        traced = predict_training_step(cfg, seq, batch, setup=setup, mode="traced")
        plain = predict_training_step(cfg, seq, batch, setup=setup, mode="plain")
        gap = traced_minus_plain(cfg, seq, batch, setup=setup)
        assert gap == {n: traced.phase(n).peak - plain.phase(n).peak for n in PHASES}
        assert all(traced.phase(n).end == plain.phase(n).end for n in PHASES)  # only transients differ
        assert gap["optimizer_step"] == 0 and gap["backward"] >= 0 and gap["forward"] >= 0


def test_gpt2_grid_gap_hand_checked():
    """GPT-2 small at S = 1,024, B = 4, default setup: the traced backward peak is the gather
    backward's second T·V·4 tensor; the plain run's peak is at the same point without it."""
    cfg = load_config("gpt2-small").with_context(1024)
    T, V = 4 * 1024, 50257
    assert traced_minus_plain(cfg, 1024, 4)["backward"] == T * V * 4 == 823_410_688


@pytest.mark.parametrize("attention,checkpoint,precision", list(product(ATTENTIONS, REPLAYED, PRECISIONS)))
def test_gpu_plain_prediction_has_no_cpu_extras(attention, checkpoint, precision):
    # cuda and meta share every tensor but the fused attention's (CUDA's kernels, measured on an H100:
    # reports/cuda); the CPU adds wrapped Python numbers, bf16 kernel scratch and the for-loop/foreach
    # AdamW step counters
    setup = TrainingSetup(attention=attention, checkpoint=checkpoint, precision=precision)
    cfg = ModelConfig(**BASE)
    gpu = predict_training_step(cfg, 7, 3, setup=setup, device="cuda", mode="plain")
    meta = predict_training_step(cfg, 7, 3, setup=setup, device="meta", mode="plain")
    cpu = predict_training_step(cfg, 7, 3, setup=setup, device="cpu", mode="plain")
    assert cpu.optimizer_step.peak > gpu.optimizer_step.peak
    assert gpu.baseline == meta.baseline and gpu.optimizer_step == meta.optimizer_step
    saved = 0  # per layer, what CUDA's kernel keeps for the backward beyond the CPU flash kernel's
    if attention == "sdpa" and checkpoint != "full":
        B, S, h, d_head = 3, 7, 6, 10
        if precision == "fp32":  # memory-efficient: logsumexp rows padded to 32; the merged heads a view
            # (saved by output_proj without checkpointing; selective saves the kernel's output and reruns the merge)
            saved = B * h * (32 - S) * 4 - (B * S * h * d_head * 4 if checkpoint == "none" else 0)
        else:  # flash: rng_state (2 uint64) and unused (1 uint64) saved beside the logsumexp
            saved = 3 * 8
    assert gpu.forward.end - meta.forward.end == 2 * saved


@pytest.mark.grid
@pytest.mark.parametrize("setup", EVERY, ids=lambda s: s.label)
def test_plain_prediction_mid_size(setup):
    # head_dim 64 and 4 heads (the flash kernel's blocks: qs = 32 < S = 96 = ks), qk-norm, untied
    cfg = ModelConfig(
        vocab_size=1000, context_length=96, num_layers=2, d_model=256, num_heads=4, d_ff=1024, qk_norm=True
    )
    measured = measure_step(cfg, 96, 2, device="cpu", setup=setup, method="allocator")
    assert_same(measured, plain_cpu(cfg, 96, 2, setup))


@pytest.mark.grid
@pytest.mark.parametrize("setup", [s for s in EVERY if s.attention == "sdpa"], ids=lambda s: s.label)
def test_one_head_merges_by_a_view(setup):
    """With one head (a TP rank's h/M = 1) the fused kernel's (B, 1, S, d) output and the merged
    (B, S, d) are the same memory: no merge copy (T·d_head·e per layer less than with h > 1).  Both the
    traced run (the tracker on meta) and the plain run (the CPU allocator) equal the prediction."""
    cfg = ModelConfig(vocab_size=31, context_length=16, num_layers=2, d_model=12, num_heads=1, d_ff=22, qk_norm=True)
    traced = predict_training_step(cfg, 7, 3, setup=setup, mode="traced")
    assert_same(measure_step(cfg, 7, 3, device="meta", setup=setup), traced)
    measured = measure_step(cfg, 7, 3, device="cpu", setup=setup, method="allocator")
    assert_same(measured, plain_cpu(cfg, 7, 3, setup))


def test_cuda_flash_backward_scratch_by_hand():
    """CUDA's flash backward (attention_backward.cu, flash_api.cpp ``mha_bwd``), after dQ, dK, dV and
    freed on return: 1. the output's contiguous copy (B, S, h, d_head), the kernel's output being
    (B, h, S, d_head)-ordered, plus softmax_d (B, h, S rounded up to 128) fp32; 2. dq_accum (B, S₁₂₈, h,
    d_head rounded up to 32) fp32; 3. with grouped K/V heads, dk_expanded and dv_expanded (B, S, h,
    d_head) in the input dtype.  Each was an allocator event of that size on an H200 (reports/cuda:
    qwen3-0.6b blocks on d_model 256 at S 8,000 and 8,192, equal).  The memory-efficient kernel (fp32) has its
    ``delta`` instead: grad·out (B, S, h, d_head), its sum (B, S, h) and the contiguous (B, h, S), fp32 (H200:
    +136,314,880 B at B 2, S 8,192, 16 heads of 128).  None on meta."""
    from lm_accounting.analytic.sizes import Sizes

    cfg = ModelConfig(**BASE)  # h 6, kv 2, d_head 10
    B, S = 3, 7  # S₁₂₈ = 128, d₃₂ = 32
    bf16 = TrainingSetup(attention="sdpa", precision="bf16")
    assert Sizes(cfg, B, S, 2, bf16, cuda=True).flash_scratch_backward(2) == (
        3 * 7 * 6 * 10 * 2 + 3 * 6 * 128 * 4,
        3 * 128 * 6 * 32 * 4,
        2 * 3 * 7 * 6 * 10 * 2,
    )
    mha = ModelConfig(**{**BASE, **VARIANTS["mha"]})  # h 6 of d_head 4: no expansion
    assert Sizes(mha, B, 130, 2, bf16, cuda=True).flash_scratch_backward(2) == (
        3 * 130 * 6 * 4 * 2 + 3 * 6 * 256 * 4,
        3 * 256 * 6 * 32 * 4,
        0,
    )
    fp32 = TrainingSetup(attention="sdpa", precision="fp32")
    product, total, delta = 3 * 7 * 6 * 10 * 4, 3 * 7 * 6 * 4, 3 * 6 * 7 * 4  # (B, S, h, d), (B, S, h), (B, h, S)
    assert Sizes(cfg, B, S, 4, fp32, cuda=True).flash_scratch_backward(4) == (product, total, delta)
    assert Sizes(cfg, B, S, 2, bf16).flash_scratch_backward(2) == (0, 0, 0)
