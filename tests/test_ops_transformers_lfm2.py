"""transformers' pure Mamba2, LFM2 and LFM2-MoE replayed by their op-library programs (issues 26 and 30):
``Mamba2ForCausalLM``, ``Lfm2ForCausalLM`` and ``Lfm2MoeForCausalLM`` (``analytic.ops.transformers.mamba2_lm``,
``lfm2``, ``lfm2_moe``) equal transformers' own models measured by the storage tracker on meta, phase by phase, byte
for byte, at B = 1, 2 and 3 (``test_ops_transformers_llama.check``), and their plain CPU runs equal the CPU
allocator's events (``test_ops_transformers_zoo.check_plain``).  LFM2-MoE's experts run ``grouped_mm``, whose meta
kernel takes bf16 only: fp32 and amp-bf16 are measured on cpu tensors.

The configs are small config.json objects read by ``hf_config.config_from_hf``: Mamba2 with 4 heads of 16 in 2 groups
of state 4, chunks of 8 (S = 12 pads a second chunk); LFM2 with patterns of short convolutions (C) and attention (*)
from ``layer_types``."""

import json

import pytest

from lm_accounting.analytic.ops import predict_step, unsupported
from lm_accounting.hf_config import config_from_hf
from lm_accounting.setup import TrainingSetup

pytest.importorskip("transformers")
from test_ops_transformers_llama import check  # B = 1, 2, 3 against transformers' own model on meta
from test_ops_transformers_zoo import check_plain  # the plain CPU run against the CPU allocator

MAMBA2 = dict(
    model_type="mamba2",
    vocab_size=96,
    hidden_size=32,
    num_hidden_layers=3,
    num_heads=4,
    head_dim=16,
    expand=2,
    state_size=4,
    n_groups=2,
    conv_kernel=4,
    chunk_size=8,
)
"""Four Mamba2 heads of 16 (expand 2 of d 32) in two groups of state 4, chunks of 8, three blocks."""

LFM2 = dict(
    model_type="lfm2",
    vocab_size=96,
    hidden_size=32,
    intermediate_size=64,
    block_auto_adjust_ff_dim=False,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    conv_L_cache=3,
)
"""Four heads of 8 with two K/V heads, a SwiGLU of 64, short convolutions of 3 taps."""

LFM2_MOE = dict(
    {k: v for k, v in LFM2.items() if k != "block_auto_adjust_ff_dim"},
    model_type="lfm2_moe",
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    num_dense_layers=1,
)
"""LFM2's widths, the first layer dense, the others four SwiGLU experts of 16, top 2."""


def mamba2(**fields):
    return config_from_hf({**MAMBA2, **fields})


def lfm2(pattern: str, base: dict = LFM2, **fields):
    types = ["conv" if c == "C" else "full_attention" for c in pattern]
    return config_from_hf({**base, "num_hidden_layers": len(pattern), "layer_types": types, **fields})


def label(v) -> str:
    return v if isinstance(v, str | int) else "-".join(v.to_dict().values())


@pytest.mark.parametrize(
    "fields, seq, setup",
    [
        ({}, 12, TrainingSetup()),
        ({}, 12, TrainingSetup(precision="bf16")),
        ({"residual_in_fp32": False, "tie_word_embeddings": True}, 16, TrainingSetup(precision="bf16")),
        ({}, 7, TrainingSetup(precision="bf16", checkpoint="full")),
        ({}, 12, TrainingSetup(precision="amp-bf16", checkpoint="full")),
    ],
    ids=["fp32", "bf16", "bf16-residual-bf16-tied", "bf16-full", "amp-full"],
)
def test_mamba2_equals_transformers(fields, seq, setup):
    """``Mamba2Block``s (Llama's RMSNorm of the input cast to the weights' dtype, the residual cast to fp32 with
    ``residual_in_fp32``, Nemotron-H's Mamba2 mixer), ``norm_f``, the head on the states cast to its dtype, against
    ``Mamba2ForCausalLM`` on meta at B = 1, 2 and 3."""
    check(mamba2(**fields), seq, setup)


def test_mamba2_residual_in_fp32_changes_a_16_bit_step():
    """The fp32 residual is replayed, not assumed: a bf16 step with it differs from one without (the hidden states
    between blocks fp32 or bf16); an fp32 step is the same either way."""
    bf16, fp32 = TrainingSetup(precision="bf16"), TrainingSetup()
    with_it, without = mamba2(), mamba2(residual_in_fp32=False)
    assert with_it.residual_in_fp32 and not without.residual_in_fp32
    a, b = (predict_step(c, 12, bf16, impl="transformers", batch=2).at(2) for c in (with_it, without))
    assert a.forward.peak > b.forward.peak
    a, b = (predict_step(c, 12, fp32, impl="transformers", batch=2).at(2) for c in (with_it, without))
    assert a == b


LFM2_CASES = [
    ("C*CC", 12, TrainingSetup(attention="naive")),
    ("C*CC", 12, TrainingSetup(attention="sdpa", precision="bf16")),
    ("*CC*", 9, TrainingSetup(attention="naive", checkpoint="full")),
    ("CC*C", 12, TrainingSetup(attention="sdpa", precision="bf16", checkpoint="full")),
    ("C*CC", 12, TrainingSetup(attention="sdpa", precision="amp-bf16")),
    ("*CC", 7, TrainingSetup(attention="naive", precision="amp-bf16", checkpoint="full")),
]


@pytest.mark.parametrize("pattern, seq, setup", LFM2_CASES, ids=label)
def test_lfm2_equals_transformers(pattern, seq, setup):
    """Short-convolution layers (``in_proj`` to 3·d, B·x, the depthwise conv1d cut to S, C times it, ``out_proj``)
    and attention layers (per-head q/k RMSNorms, RoPE; eager or sdpa), each with LFM2's SwiGLU, against
    ``Lfm2ForCausalLM`` on meta at B = 1, 2 and 3."""
    check(lfm2(pattern), seq, setup)


def test_lfm2_conv_bias_and_all_attention_equal_transformers():
    """``conv_bias`` (biased conv, ``in_proj`` and ``out_proj``), and an LFM2 without a conv layer (Llama's blocks
    with q/k norms, untied)."""
    check(lfm2("C*C", conv_bias=True), 12, TrainingSetup(attention="sdpa", precision="bf16"))
    check(lfm2("**", tie_word_embeddings=False), 12, TrainingSetup(attention="naive"))


MOE_CASES = [
    ("C*CC", {}, TrainingSetup(attention="naive", precision="bf16")),
    ("C*CC", {"use_expert_bias": False, "norm_topk_prob": False}, TrainingSetup(attention="sdpa", precision="bf16")),
    ("*CC*", {"num_dense_layers": 2}, TrainingSetup(attention="naive", precision="bf16", checkpoint="full")),
]


@pytest.mark.parametrize("pattern, fields, setup", MOE_CASES, ids=["bias", "plain-router", "full"])
def test_lfm2_moe_equals_transformers(pattern, fields, setup):
    """LFM2's layers with the sparse block after ``num_dense_layers``: the sigmoid router (the fp32 ``expert_bias``
    buffer added to pick the top k, the unbiased scores gathered; or the top k of the scores), the weights divided by
    their sum with ``norm_topk_prob``, the grouped_mm SwiGLU experts; bf16 on meta at B = 1, 2 and 3."""
    check(lfm2(pattern, LFM2_MOE, **fields), 12, setup)


@pytest.mark.parametrize("precision", ["fp32", "amp-bf16"])
def test_lfm2_moe_on_cpu_tensors_equals_transformers(precision):
    """fp32 experts (grouped_mm's meta kernel takes bf16 only): measured on cpu tensors under the storage tracker, at
    B = 1 and 2; under amp-bf16 the router's ``sum`` is an fp32 op, so the divided weights are fp32."""
    from lm_accounting.measure.hf import measure_hf_step

    cfg = lfm2("C*CC", LFM2_MOE)
    setup = TrainingSetup(attention="naive", precision=precision)
    for batch in (1, 2):
        lines = predict_step(cfg, 12, setup, impl="transformers", batch=batch, device="cpu")
        assert lines.at(batch) == measure_hf_step(cfg, 12, batch, setup, device="cpu"), batch


@pytest.mark.parametrize(
    "cfg, setup",
    [
        (mamba2(), TrainingSetup(precision="bf16")),
        (mamba2(), TrainingSetup(checkpoint="full")),
        (lfm2("C*CC"), TrainingSetup(attention="sdpa", precision="bf16")),
        (lfm2("*CC*", conv_bias=True), TrainingSetup(attention="naive", checkpoint="full")),
        (lfm2("C*CC", LFM2_MOE), TrainingSetup(attention="naive")),
    ],
    ids=["mamba2-bf16", "mamba2-full", "lfm2-sdpa-bf16", "lfm2-full", "lfm2-moe"],
)
def test_plain_cpu_run_equals_the_cpu_allocator(cfg, setup):
    """No dispatch mode: gradients summed in place, Python numbers wrapped, the CPU flash kernel's scratch."""
    check_plain(cfg, 12, 2, setup)


@pytest.mark.parametrize("cfg", [mamba2(), lfm2("C*"), lfm2("C*", LFM2_MOE)], ids=["mamba2", "lfm2", "lfm2-moe"])
def test_what_is_not_transliterated_is_refused(cfg):
    """Selective checkpointing (transformers has none) is refused with its reason; the plain setups are not."""
    reason = "no selective activation checkpointing"
    assert unsupported(cfg, TrainingSetup(), "transformers") == []
    assert any(reason in r for r in unsupported(cfg, TrainingSetup(checkpoint="selective"), "transformers"))
    with pytest.raises(ValueError, match=reason):
        predict_step(cfg, 12, TrainingSetup(checkpoint="selective"), impl="transformers")


def test_a_single_mamba2_head_is_refused():
    one_head = mamba2(num_heads=1, head_dim=64, n_groups=1)
    assert any("mamba_heads 1" in r for r in unsupported(one_head, TrainingSetup(), "transformers"))


@pytest.mark.parametrize(
    "data, precision",
    [
        (MAMBA2, "bf16"),
        ({**LFM2, "num_hidden_layers": 3, "layer_types": ["conv", "full_attention", "conv"]}, "fp32"),
        ({**LFM2_MOE, "num_hidden_layers": 3, "layer_types": ["conv", "full_attention", "conv"]}, "bf16"),
    ],
    ids=["mamba2", "lfm2", "lfm2-moe"],
)
def test_memory_prints_the_exact_step_of_the_config_json(run_cli, tmp_path, data, precision):
    """``lm-account memory`` gives the replayed step (not the model states alone), and ``--measure meta`` finds
    transformers' model equal to it at every phase."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    r = run_cli("memory", path, "-S", "64", "--precision", precision, "--measure", "meta")
    assert r.code == 0, r.err
    assert "model states only" not in r.out and "step peak" in r.out
    rows = [line for line in r.out.splitlines() if "+0.0000%" in line]
    assert len(rows) == 7, r.out  # baseline, and each phase's peak and end, equal to the measurement
