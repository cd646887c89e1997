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


@pytest.mark.parametrize("setup", SETUPS, ids=lambda s: s.label)
@pytest.mark.parametrize("variant", VARIANTS)
def test_tiny_every_setup_byte_for_byte(variant, setup):
    cfg = ModelConfig(**{**BASE, **VARIANTS[variant]})
    for batch, seq in ((3, 7), (1, 16)):
        measured = measure_step(cfg, seq, batch, device="meta", setup=setup)
        assert_same(measured, predict_training_step(cfg, seq, batch, setup=setup), (batch, seq))


@pytest.mark.parametrize("setup", [s for s in SETUPS if s.optimizer == "foreach"], ids=lambda s: s.label)
def test_fused_adamw_on_cpu_tensors(setup):
    # fused AdamW keeps its step counters on the parameters' device; the other two on the CPU
    setup = TrainingSetup(**{**setup.__dict__, "optimizer": "fused"})
    cfg = ModelConfig(**BASE, tie_embeddings=True)
    measured = measure_step(cfg, 7, 2, device="cpu", setup=setup)
    assert_same(measured, predict_training_step(cfg, 7, 2, setup=setup, device="cpu"))


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


@pytest.mark.parametrize("setup", QUICK_SETUPS, ids=lambda s: s.label)
@pytest.mark.parametrize("name,layers,seq,batch", QUICK)
def test_presets_every_setup_byte_for_byte(name, layers, seq, batch, setup):
    cfg = preset(name, seq, layers)
    measured = measure_step(cfg, seq, batch, device="meta", setup=setup)
    assert_same(measured, predict_training_step(cfg, seq, batch, setup=setup))


FULL_DEPTH = [("gpt2-small", 2048, 4), ("gpt2-medium", 1024, 2), ("qwen3-0.6b", 2048, 1)]


@pytest.mark.slow
@pytest.mark.parametrize("setup", QUICK_SETUPS, ids=lambda s: s.label)
@pytest.mark.parametrize("name,seq,batch", FULL_DEPTH)
def test_presets_full_depth(name, seq, batch, setup):
    cfg = preset(name, seq)
    measured = measure_step(cfg, seq, batch, device="meta", setup=setup)
    assert_same(measured, predict_training_step(cfg, seq, batch, setup=setup))
