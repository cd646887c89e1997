"""Every training setup's step memory: the replay (analytic, torch-free) against the storage
tracker on meta, phase by phase, byte for byte (issue 9, "What it must show").

The configs are tiny (every tensor size distinct, so a wrong term cannot hide) plus GPT-2
small/medium and a Qwen3-0.6B shape (GQA, qk-norm, tied) with fewer layers in the quick loop
and at full depth under ``slow``.  Fused AdamW has no meta kernels, so it is checked on CPU tensors.
"""

import dataclasses
from itertools import product

import pytest

from lm_accounting import ModelConfig, load_config
from lm_accounting.analytic.replay import predict_training_step
from lm_accounting.measure.memory import measure_step
from lm_accounting.phases import PHASES
from lm_accounting.setup import TrainingSetup

BASE = dict(
    vocab_size=31, context_length=16, num_layers=2, d_model=18, num_heads=6, num_kv_heads=2, head_dim=10, d_ff=22
)
VARIANTS = {
    "gqa": {},
    "gqa+qk_norm": {"qk_norm": True},
    "gqa+tied": {"tie_embeddings": True},
    "mha": {"num_kv_heads": None, "head_dim": None, "d_model": 24},
    "gqa+qkv_bias": {"qkv_bias": True},  # Qwen2: q/k/v biases (fp32 q, k, v under amp-bf16)
    "gqa+partial_rotary": {"rotary_dim": 2, "qkv_bias": True},  # GLM: RoPE on 2 of each head's 10, the rest passed
}
ATTENTIONS, CHECKPOINTS, PRECISIONS = ("naive", "sdpa"), ("none", "full", "selective"), ("fp32", "bf16", "amp-bf16")
SETUPS = [
    TrainingSetup(attention=a, checkpoint=c, precision=p, optimizer=o)
    for a, c, p, o in product(ATTENTIONS, CHECKPOINTS, PRECISIONS, ("for-loop", "foreach"))
]


def assert_same(measured, predicted, where=""):
    assert measured.baseline == predicted.baseline, where
    for name in PHASES:
        assert measured.phase(name) == predicted.phase(name), (where, name)


@pytest.mark.grid
@pytest.mark.parametrize("setup", SETUPS, ids=lambda s: s.label)
@pytest.mark.parametrize("variant", VARIANTS)
def test_tiny_every_setup_byte_for_byte(variant, setup):
    cfg = ModelConfig(**{**BASE, **VARIANTS[variant]})
    for batch, seq in ((3, 7), (1, 16)):
        measured = measure_step(cfg, seq, batch, device="meta", setup=setup)
        assert_same(measured, predict_training_step(cfg, seq, batch, setup=setup, mode="traced"), (batch, seq))


@pytest.mark.grid
@pytest.mark.parametrize("setup", [s for s in SETUPS if s.optimizer == "foreach"], ids=lambda s: s.label)
def test_fused_adamw_on_cpu_tensors(setup):
    # fused AdamW keeps its step counters on the parameters' device; the other two on the CPU
    setup = TrainingSetup(**{**setup.__dict__, "optimizer": "fused"})
    cfg = ModelConfig(**BASE, tie_embeddings=True)
    measured = measure_step(cfg, 7, 2, device="cpu", setup=setup)
    assert_same(measured, predict_training_step(cfg, 7, 2, setup=setup, device="cpu", mode="traced"))


def preset(name, seq, layers=None):
    """A preset at context ``seq``, with ``layers`` blocks (None: its own depth); qwen3-0.6b is GQA
    (16 query, 8 KV heads, head_dim 128 ≠ d/h), qk-norm and tied embeddings."""
    cfg = load_config(name)
    if layers:
        cfg = dataclasses.replace(cfg, num_layers=layers)
    return cfg.with_context(seq)


QUICK = [  # (preset, layers, seq, batch): 2 layers keep each meta step under a second
    ("gpt2-small", 2, 256, 4),
    ("gpt2-small", 2, 2048, 1),
    ("gpt2-medium", 2, 512, 3),
    ("gpt2-medium", 2, 1024, 2),
    ("qwen3-0.6b", 2, 1024, 2),
]
QUICK_SETUPS = [
    TrainingSetup(attention=a, checkpoint=c, precision=p) for a, c, p in product(ATTENTIONS, CHECKPOINTS, PRECISIONS)
]


@pytest.mark.grid
@pytest.mark.parametrize("setup", QUICK_SETUPS, ids=lambda s: s.label)
@pytest.mark.parametrize("name,layers,seq,batch", QUICK)
def test_presets_every_setup_byte_for_byte(name, layers, seq, batch, setup):
    cfg = preset(name, seq, layers)
    measured = measure_step(cfg, seq, batch, device="meta", setup=setup)
    assert_same(measured, predict_training_step(cfg, seq, batch, setup=setup, mode="traced"))


FULL_DEPTH = [("gpt2-small", 2048, 4), ("gpt2-medium", 1024, 2), ("qwen3-0.6b", 2048, 1)]


@pytest.mark.grid
@pytest.mark.parametrize("setup", QUICK_SETUPS, ids=lambda s: s.label)
@pytest.mark.parametrize("name,seq,batch", FULL_DEPTH)
def test_presets_full_depth(name, seq, batch, setup):
    cfg = preset(name, seq)
    measured = measure_step(cfg, seq, batch, device="meta", setup=setup)
    assert_same(measured, predict_training_step(cfg, seq, batch, setup=setup, mode="traced"))


# -- an independent implementation: torch's MemTracker --------------------------------------------

MEMTRACKER_SETUPS = [
    TrainingSetup(optimizer="foreach"),
    TrainingSetup(attention="sdpa", checkpoint="none", precision="fp32", optimizer="for-loop"),
    TrainingSetup(attention="sdpa", checkpoint="full", precision="amp-bf16", optimizer="foreach"),
    TrainingSetup(attention="naive", checkpoint="selective", precision="bf16", optimizer="foreach"),
    TrainingSetup(attention="sdpa", checkpoint="selective", precision="amp-bf16", optimizer="for-loop"),
    TrainingSetup(attention="sdpa", checkpoint="selective", precision="bf16", optimizer="foreach"),
]


def memtracker_hook_residual(cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup) -> int:
    """Bytes by which MemTracker's step peak exceeds a run without its module hooks (derivation).

    1. MemTracker installs ModTracker, whose forward pre-hook calls
       ``register_multi_grad_hook(inputs, fn)`` in the default "all" mode on every module's inputs
       that require grad.  Its inner hook stores each input's gradient in ``buffer`` until the last
       one arrives (torch/autograd/graph.py), so with several inputs the early gradients outlive
       their consumer.  MemTracker thus measures a different run: the hooked one (the test checks
       that our tracker, run under ModTracker's hooks alone, gives MemTracker's figure exactly).
    2. Multi-input modules here: ``attn.qk`` and ``attn.av`` (naive ``MatMul(a, b)``) and the fused
       attention (sdpa: q, k, v).  Observed arrival order: naive, d(probs) of ``attn.av`` first,
       held until dv arrives after the whole QKᵀ, RoPE and qk-norm backward; sdpa, dk then dq, held
       until dv.
    3. That window holds the backward peak only when qk-norm's backward (in 16-bit compute: RMSNorm
       in fp32, its fp32 temporaries the largest transient) runs inside a selective checkpoint's
       recompute; then the residual is the held gradients, in the 16-bit compute dtype (2 bytes):
       naive d(probs) = B·h·S²·2; sdpa dq + dk = B·S·(h + kv)·d_head·2.  Otherwise 0 (checked on
       the other setups, with and without qk-norm)."""
    if not (cfg.qk_norm and setup.checkpoint == "selective" and setup.precision != "fp32"):
        return 0
    if setup.attention == "naive":
        return batch * cfg.num_heads * seq * seq * 2
    return batch * seq * (cfg.num_heads + cfg.num_kv_heads) * cfg.d_head * 2


@pytest.mark.grid
@pytest.mark.parametrize("qk_norm", [False, True], ids=["plain-attn", "qk-norm"])
@pytest.mark.parametrize("setup", MEMTRACKER_SETUPS, ids=lambda s: s.label)
def test_tracker_agrees_with_torch_memtracker(setup, qk_norm, monkeypatch):
    """The step's peak by torch.distributed._tools.mem_tracker.MemTracker (module hooks + its own
    dispatch mode) against our StorageTracker and the traced prediction.

    Where they differ (selective checkpointing + 16-bit compute + qk-norm: 1,764 B naive, 3,360 B
    sdpa at B = 3, S = 7, h = 6, kv = 2, d_head = 10), the difference is MemTracker's own module hooks
    keeping gradients alive (``memtracker_hook_residual``), not its accounting: our tracker on the
    hooked run equals MemTracker, and MemTracker with those hooks in the non-buffering "any" mode
    equals our tracker on the plain traced run."""
    import torch

    mem_tracker = pytest.importorskip("torch.distributed._tools.mem_tracker")
    mod_tracker = pytest.importorskip("torch.distributed._tools.mod_tracker")
    from torch.autograd.graph import register_multi_grad_hook

    from lm_accounting.measure.step import build_step
    from lm_accounting.measure.tracker import init_optimizer_state, measure_training_step
    from lm_accounting.model import cross_entropy

    cfg = ModelConfig(**BASE, qk_norm=qk_norm)
    model, inputs, targets, opt = build_step(cfg, 7, 3, setup, "meta")
    init_optimizer_state(opt)

    def step():
        loss = cross_entropy(model(inputs), targets)
        loss.backward()
        del loss
        opt.step()
        opt.zero_grad(set_to_none=True)

    def memtracker_peak():
        mt = mem_tracker.MemTracker()
        mt.track_external(model, opt, inputs, targets)
        with mt:
            step()
        return mt.get_tracker_snapshot("peak")[torch.device("meta")]["Total"]

    theirs = memtracker_peak()
    ours = measure_training_step(model, inputs, targets, cross_entropy, optimizer=opt)
    predicted = predict_training_step(cfg, 7, 3, setup=setup, mode="traced")
    assert ours.peak == predicted.peak
    assert theirs - ours.peak == memtracker_hook_residual(cfg, 7, 3, setup)
    with mod_tracker.ModTracker():  # the same hooks, without MemTracker's accounting
        hooked = measure_training_step(model, inputs, targets, cross_entropy, optimizer=opt)
    assert hooked.peak == theirs
    # ModTracker's pre-hook in "any" mode buffers nothing: MemTracker then agrees with us exactly
    monkeypatch.setattr(
        mod_tracker,
        "register_multi_grad_hook",
        lambda tensors, fn, mode="all": register_multi_grad_hook(tensors, fn, mode="any"),
    )
    assert memtracker_peak() == ours.peak


@pytest.mark.grid
@pytest.mark.parametrize("setup", [s for s in SETUPS if s.optimizer == "foreach"], ids=lambda s: s.label)
@pytest.mark.parametrize("variant", VARIANTS)
def test_saved_breakdown_is_what_forward_leaves_alive(variant, setup):
    # the per-component closed forms (components.REGISTRY saved formulas) against the tracker
    from lm_accounting.analytic.activations import saved_activation_breakdown

    cfg = ModelConfig(**{**BASE, **VARIANTS[variant]})
    measured = measure_step(cfg, 7, 3, device="meta", setup=setup)
    saved = saved_activation_breakdown(cfg, 7, 3, setup=setup)
    assert saved.total == measured.forward.end - measured.baseline > 0
    assert all(item.total > 0 for item in saved)  # components that keep nothing are left out


def test_saved_breakdown_by_hand_sdpa_full_amp():
    """gpt2-small at S = 8, B = 2, sdpa + full checkpointing + amp-bf16: each of the 12 blocks keeps
    only its fp32 input (T·d·4); the positions (8·S) are held by the recompute closures; ln_final keeps
    rsqrt, y and its fp32 input; the LM head keeps autocast's bf16 copies of its weight and input;
    the cross-entropy keeps z, exp z (fp32), the row sums and the loss."""
    from lm_accounting.analytic.activations import saved_activation_breakdown

    T, d, V, S = 16, 768, 50257, 8
    setup = TrainingSetup(attention="sdpa", checkpoint="full", precision="amp-bf16")
    want = 12 * T * d * 4 + 8 * S + (T * 4 + 2 * T * d * 4) + (V * d * 2 + T * d * 2) + (2 * T * V * 4 + T * 4 + 4)
    got = saved_activation_breakdown(load_config("gpt2-small").with_context(S), S, 2, setup=setup)
    assert got.total == want
    assert [it.key for it in got] == ["positions", "layers.*.residual", "ln_final", "lm_head", "cross_entropy"]
