"""transformers' Gated DeltaNet hybrids (``qwen3_next``: Qwen3NextForCausalLM; ``qwen3_5_text`` and
``qwen3_5_moe_text``: Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM) replayed by the op library
(``analytic.ops.transformers.qwen3_next`` and ``qwen3_5``) equal transformers' own models, phase by phase, byte for
byte.

Method (tests/test_ops_transformers_moe.py's ``check``): the lines in B from one replay checked at B = 2 and 3, B = 1
by its own replay, against ``measure.hf.measure_hf_step`` on meta (the storage tracker; the torch path of the chunked
gated delta rule runs on meta once the packed-sequence check's ``.item()`` is patched, ``measure.hf.patched_for``).
Sequences of 8 (one chunk of 64, padded), 64 (one chunk, no padding), 100 (two chunks, padded) and 520 (nine chunks,
the middle ones replayed once): the chunk loop's copies into ``core_attn_out`` and the layout of its last reshape
change with the chunk count.  The sparse block (grouped_mm experts, whose meta kernel takes bf16 only) is checked in
bf16.  Full checkpointing is transformers' (``activation_checkpointing_enable``, every decoder layer), amp-bf16 its
emulation of CUDA's autocast (``measure.hf.HFAutocast``: the conv1d's input cast before its keyword weight).  The
plain CPU run (no dispatch mode) against the CPU allocator (tests/test_ops_transformers_zoo.py's ``check_plain``).
Published sizes on meta.  Refused: selective checkpointing (transformers has none).  Not validated on a GPU."""

import json
import subprocess
import sys

import pytest

from lm_accounting.analytic.ops import predict_step, unsupported
from lm_accounting.hf_config import config_from_hf
from lm_accounting.setup import TrainingSetup

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from test_ops_transformers_moe import check  # B = 1, 2, 3 against transformers' own model
from test_ops_transformers_zoo import check_plain  # the plain CPU run against the CPU allocator

from lm_accounting.measure.hf import measure_hf_step

SHAPE = dict(
    vocab_size=96,
    hidden_size=16,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=1024,
    intermediate_size=24,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    linear_conv_kernel_dim=4,
    full_attention_interval=2,
)
MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 32}
MODELS = {
    "dense": {"model_type": "qwen3_next", "num_experts": 0},  # every layer Qwen3NextMLP
    # H_k = H_v: no repeat_interleave, the split parts viewed; three linear layers in a row (a repeated run)
    "equal-heads": {
        "model_type": "qwen3_next",
        "num_experts": 0,
        "linear_num_value_heads": 2,
        "full_attention_interval": 4,
    },
    "moe": {"model_type": "qwen3_next", **MOE},
    # layers 1 and 3 sparse, 0 and 2 dense; the top-k weights not normalised
    "moe-sparse-step": {"model_type": "qwen3_next", **MOE, "decoder_sparse_step": 2, "norm_topk_prob": False},
    # Qwen3.5: unfused projections, three-row rotary positions; dense, or Qwen3-Next's sparse block in every layer
    "qwen3_5": {"model_type": "qwen3_5_text"},
    "qwen3_5-tied-equal-heads": {
        "model_type": "qwen3_5_text",
        "tie_word_embeddings": True,
        "linear_num_value_heads": 2,
    },
    "qwen3_5_moe": {"model_type": "qwen3_5_moe_text", **MOE},
}


def tiny(name: str):
    return config_from_hf({**SHAPE, **MODELS[name]})


SETUPS = {
    "eager-fp32": TrainingSetup(attention="naive"),
    "sdpa-fp32": TrainingSetup(attention="sdpa"),
    "sdpa-bf16": TrainingSetup(attention="sdpa", precision="bf16"),
    "eager-fp32-full": TrainingSetup(attention="naive", checkpoint="full"),
    "sdpa-bf16-full": TrainingSetup(attention="sdpa", precision="bf16", checkpoint="full"),
    "eager-amp": TrainingSetup(attention="naive", precision="amp-bf16"),
    "sdpa-amp-full": TrainingSetup(attention="sdpa", precision="amp-bf16", checkpoint="full"),
}


@pytest.mark.parametrize("seq", [8, 64, 100, 520])
@pytest.mark.parametrize("setup", list(SETUPS))
def test_dense_equals_transformers_on_meta(setup, seq):
    """520 tokens: 9 chunks, the middle five replayed once (``repeated``), two alone at each end."""
    check(tiny("dense"), seq, SETUPS[setup], device="meta")


@pytest.mark.parametrize(
    "name, setup",
    [
        ("equal-heads", "eager-fp32"),
        ("qwen3_5", "eager-fp32"),
        ("qwen3_5", "sdpa-amp-full"),
        ("qwen3_5", "sdpa-bf16"),
        ("qwen3_5-tied-equal-heads", "eager-fp32-full"),
    ],
)
def test_other_dense_hybrids_equal_transformers_on_meta(name, setup):
    check(tiny(name), 100, SETUPS[setup], device="meta")


@pytest.mark.parametrize("name", ["moe", "moe-sparse-step", "qwen3_5_moe"])
@pytest.mark.parametrize("attention", ["naive", "sdpa"])
@pytest.mark.parametrize("checkpoint", ["none", "full"])
def test_sparse_blocks_equal_transformers_on_meta_in_bf16(name, attention, checkpoint):
    """Qwen2-MoE's sparse block (router, grouped_mm experts, the sigmoid-gated shared expert) after both mixers."""
    check(tiny(name), 100, TrainingSetup(attention=attention, precision="bf16", checkpoint=checkpoint), device="meta")


@pytest.mark.parametrize(
    "name, setup",
    [
        ("dense", "eager-fp32"),
        ("dense", "sdpa-bf16"),
        ("dense", "eager-amp"),
        ("dense", "sdpa-amp-full"),
        ("moe", "sdpa-fp32"),
        ("moe", "sdpa-bf16-full"),
        ("qwen3_5", "eager-amp"),
        ("qwen3_5_moe", "sdpa-fp32"),
    ],
)
def test_plain_cpu_run_equals_the_cpu_allocator(name, setup):
    """No dispatch mode: the real CPU kernels (the conv, the triangular solves, grouped_mm), gradients summed in
    place, Python numbers wrapped; two chunks at B = 1 and 2."""
    for batch in (1, 2):
        check_plain(tiny(name), 100, batch, SETUPS[setup])


@pytest.mark.parametrize("name", ["moe", "qwen3_5", "qwen3_5_moe"])
def test_every_setup_but_selective_checkpointing_is_covered(name):
    cfg = tiny(name)
    for setup in SETUPS.values():
        assert unsupported(cfg, setup, "transformers") == [], setup
    reasons = unsupported(cfg, TrainingSetup(checkpoint="selective"), "transformers")
    assert reasons == ["transformers has no selective activation checkpointing"], reasons
    with pytest.raises(ValueError, match="selective"):
        predict_step(cfg, 8, TrainingSetup(checkpoint="selective"), impl="transformers")


@pytest.mark.parametrize("name", ["QWEN3_NEXT", "QWEN3_5_MOE", "QWEN3_5"])
def test_published_sizes_equal_transformers_on_meta(name):
    """Qwen3-Next-80B-A3B, Qwen3.5-35B-A3B (through its ``qwen3_5_moe`` wrapper) and the Qwen3.5 text defaults
    (tests/test_arch_qwen3_next.py's configs) in bf16 on meta at 512 tokens (8 chunks, the middle four replayed
    once), B = 1."""
    import test_arch_qwen3_next

    cfg = config_from_hf(getattr(test_arch_qwen3_next, name))
    setup = TrainingSetup(attention="sdpa", precision="bf16")
    predicted = predict_step(cfg, 512, setup, impl="transformers", batch=1).at(1)
    assert predicted == measure_hf_step(cfg, 512, 1, setup, device="meta")


def test_memory_command_prints_the_replayed_step(tmp_path):
    """``lm-account memory`` on a qwen3_next config.json replays the program: exact phases, not model states only
    (and the search for the largest context, millions of tokens, stays quick: the chunk loop's middle is replayed
    once)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**SHAPE, **MODELS["dense"]}))  # qwen3_next
    cmd = [sys.executable, "-m", "lm_accounting", "memory", str(path), "-S", "64", "--attention", "naive"]
    out = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "model states only" not in out.stdout
    measured = measure_hf_step(tiny("dense"), 64, 1, TrainingSetup(attention="naive"), device="meta")  # traced column
    for figure in (measured.forward.peak, measured.forward.end, measured.backward.peak):
        assert f"{figure:,}" in out.stdout, (figure, out.stdout)
