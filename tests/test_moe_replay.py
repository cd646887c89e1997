"""The implementation-exact replay of mixture-of-experts layers against independent counts.

Every test compares the replay (``predict_training_step``, ``saved_activation_breakdown``, the peak
lines) with a measurement of the live model: the storage tracker on meta (the traced run) or the CPU
allocator's own events (the plain run, ``measure.allocator``), never with the replay's own output.

The tiny configs have every tensor size distinct (vocab 1000, d 64, d_ff 96, d_e 32, E 6, k 2), and
the shapes (S, B) cover every split of the T·k routed slots over the E experts that
``MixtureOfExperts.forward`` makes: a full (E, q, d) part with q > 1 (its reshape copies), q = 1 (a
view), a remainder of T·k mod E slots (then a cat), and no full part at all (T·k < E).
"""

import itertools

import pytest
import torch
from test_memory_setups import assert_same

from lm_accounting import AccountingError, ModelConfig
from lm_accounting.analytic.activations import saved_activation_breakdown
from lm_accounting.analytic.capacity import peak_lines_in_batch
from lm_accounting.analytic.memory_report import memory_account
from lm_accounting.analytic.replay import (
    moe_lines_in_batch,
    predict_training_step,
    replay_supported,
    replay_unsupported,
)
from lm_accounting.measure.memory import measure_step
from lm_accounting.phases import PHASES
from lm_accounting.setup import TrainingSetup

BASE = dict(
    vocab_size=1000,
    context_length=64,
    num_layers=3,
    d_model=64,
    num_heads=4,
    num_kv_heads=2,
    d_ff=96,
    num_experts=6,
    experts_per_token=2,
    expert_d_ff=32,
)
VARIANTS = {
    "moe": {},
    "shared+dense-first": dict(shared_experts=2, shared_expert_d_ff=24, dense_layers_first=1),
    "every-2nd+qk-norm": dict(moe_every=2, qk_norm=True, num_layers=4),
    "tied+1-shared": dict(tie_embeddings=True, shared_experts=1),
}
# (S, B) -> T·k = 2·B·S slots over E = 6 experts: q full rows per expert, rem left over
SHAPES = {
    (7, 2): "q=4, rem=4 (cat)",
    (5, 3): "q=5, rem=0",
    (2, 1): "q=0, rem=4 (no full part)",
    (3, 1): "q=1, rem=0 (reshape is a view)",
    (4, 2): "q=2, rem=4",
    (6, 1): "q=2, rem=0",
}
SUPPORTED = [
    TrainingSetup(attention=a, checkpoint=c, precision=p)
    for a, c, p in itertools.product(("naive", "sdpa"), ("none", "full", "selective"), ("fp32", "bf16", "amp-bf16"))
]


def cfg_of(variant: str, **extra) -> ModelConfig:
    return ModelConfig(**{**BASE, **VARIANTS[variant], **extra})


def check_traced(cfg, seq, batch, setup):
    measured = measure_step(cfg, seq, batch, device="meta", setup=setup)
    assert_same(measured, predict_training_step(cfg, seq, batch, setup=setup, mode="traced"), (seq, batch, setup.label))
    # the activations saved for backward, per component, add up to the forward's end
    saved = saved_activation_breakdown(cfg, seq, batch, setup=setup)
    assert saved.total == measured.forward.end - measured.baseline


@pytest.mark.grid
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"S{s[0]}B{s[1]}")
@pytest.mark.parametrize("variant", VARIANTS)
def test_default_setup_equals_the_tracker(variant, shape):
    """Naive attention, no checkpointing, fp32, foreach AdamW: every split, with and without shared
    experts, dense layers first, MoE every 2nd layer, qk-norm, tied embeddings."""
    check_traced(cfg_of(variant), *shape, TrainingSetup())


@pytest.mark.grid
@pytest.mark.parametrize("setup", SUPPORTED[1:], ids=lambda s: s.label)
@pytest.mark.parametrize("variant", ["moe", "shared+dense-first"])
def test_every_supported_setup_equals_the_tracker(variant, setup):
    for shape in ((7, 2), (3, 1)):
        check_traced(cfg_of(variant), *shape, setup)


@pytest.mark.grid
@pytest.mark.parametrize("setup", SUPPORTED[1:], ids=lambda s: s.label)
@pytest.mark.parametrize("variant", VARIANTS)
def test_supported_setup_grid_equals_the_tracker(variant, setup):
    for shape in SHAPES:
        check_traced(cfg_of(variant), *shape, setup)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["for-loop", "foreach"])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "amp-bf16"])
def test_other_adamw_equals_the_tracker(precision, optimizer):
    check_traced(cfg_of("shared+dense-first"), 7, 2, TrainingSetup(precision=precision, optimizer=optimizer))


@pytest.mark.grid
@pytest.mark.parametrize(
    "setup",
    [
        TrainingSetup(),
        TrainingSetup(attention="sdpa", checkpoint="full", precision="bf16"),
        TrainingSetup(checkpoint="selective", optimizer="fused"),
        TrainingSetup(precision="amp-bf16"),
        TrainingSetup(attention="sdpa", checkpoint="selective", precision="amp-bf16", optimizer="for-loop"),
    ],
    ids=lambda s: s.label,
)
@pytest.mark.parametrize("variant", ["moe", "shared+dense-first", "tied+1-shared"])
def test_plain_prediction_equals_the_cpu_allocator(variant, setup):
    """The plain run (no dispatch mode: autograd accumulates the experts' weight gradients, their dx and
    the router's in place, and scatters top-k's gradient in place) against the CPU allocator's events."""
    cfg = cfg_of(variant)
    for seq, batch in ((7, 2), (6, 1)):
        measured = measure_step(cfg, seq, batch, device="cpu", setup=setup, method="allocator")
        predicted = predict_training_step(
            cfg, seq, batch, setup=setup, device="cpu", mode="plain", cpu_threads=torch.get_num_threads()
        )
        assert_same(measured, predicted, (variant, seq, batch))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_tied_plain_run_copies_the_embedding_gradient(precision):
    """Tied embeddings, V·d > T·d: the embedding's gradient joins the LM head's, a transposed view, out
    of place also in a plain run (a dense model, so the replay's course path is checked as well)."""
    cfg = ModelConfig(
        **{**BASE, "num_experts": None, "experts_per_token": None, "expert_d_ff": None}, tie_embeddings=True
    )
    setup = TrainingSetup(precision=precision)
    measured = measure_step(cfg, 7, 2, device="cpu", setup=setup, method="allocator")
    assert_same(measured, predict_training_step(cfg, 7, 2, setup=setup, device="cpu", mode="plain"))


def test_the_plain_run_is_lower_than_the_traced_one():
    """The in-place accumulations are real: the allocator sees less than the tracker on the same CPU run."""
    cfg, setup = cfg_of("shared+dense-first"), TrainingSetup()
    plain = measure_step(cfg, 7, 2, device="cpu", setup=setup, method="allocator")
    traced = measure_step(cfg, 7, 2, device="cpu", setup=setup)
    assert plain.backward.peak < traced.backward.peak
    assert_same(traced, predict_training_step(cfg, 7, 2, setup=setup, device="cpu", mode="traced"))


def test_peak_lines_hold_for_every_batch():
    """With E | S·k and S·k >= 2E every batch splits the same way: the lines equal the tracker at each B."""
    cfg = cfg_of("shared+dense-first")
    assert moe_lines_in_batch(cfg, 6)
    lines = peak_lines_in_batch(cfg, 6, setup=TrainingSetup(), mode="traced")
    for batch in (1, 2, 3, 5):
        measured = measure_step(cfg, 6, batch, device="meta", setup=TrainingSetup())
        assert lines.at(batch) == max(measured.phase(name).peak for name in PHASES)


def test_a_context_whose_split_varies_with_the_batch_has_no_lines():
    cfg = cfg_of("moe")
    assert not moe_lines_in_batch(cfg, 7) and not moe_lines_in_batch(cfg, 3)  # 14 mod 6; 6 < 2·6
    with pytest.raises(AccountingError, match="no lines in B"):
        peak_lines_in_batch(cfg, 7)
    m = memory_account(cfg, 7, 2)
    assert m.not_modelled == [] and "mixture of experts at context 7" in m.no_lines
    assert m.peak_lines is None and m.max_batch is None
    # ... while the step at that one batch is predicted, and exactly: the tracker's count
    assert m.step_traced == measure_step(cfg, 7, 2, "fp32", "meta", "foreach")


def test_what_is_still_not_modelled_is_refused_in_one_line():
    cfg = cfg_of("moe")
    assert all(replay_supported(cfg, setup) for setup in SUPPORTED) and replay_unsupported(cfg, seq=6) == []
    # latent attention is still refused (with or without experts); memory falls back to the model states
    mla = dict(kv_lora_rank=16, q_lora_rank=None, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8)
    deepseek = cfg_of("moe", num_kv_heads=None, **mla)
    assert replay_unsupported(deepseek) == ["latent attention (MLA)"]
    with pytest.raises(AccountingError, match="not latent attention \\(MLA\\)$"):
        predict_training_step(deepseek, 6, 1)
    m = memory_account(deepseek, 6, 1)
    assert m.step is None and m.states.total > 0


def test_memory_account_of_a_mixture_of_experts_is_replayed():
    """The memory command's account: the step, the saved activations per MoE component, the lines and
    the capacity, without the course convention (which describes the course model only)."""
    cfg = cfg_of("shared+dense-first")
    m = memory_account(cfg, 6, 2)
    measured = measure_step(cfg, 6, 2, device="meta", setup=TrainingSetup(optimizer="foreach"))
    assert_same(measured, m.step_traced)
    assert m.course is None and m.max_batch is not None and m.peak_lines is not None
    keys = {it.key for it in m.saved}
    assert {"layers.*.moe.router.scores", "layers.*.moe.experts.w1", "layers.*.moe.combine"} <= keys
    assert "layers.*.moe.shared.silu" in keys and "layers.*.ffn.silu" in keys  # one dense layer first
