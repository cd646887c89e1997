"""transformers' Mamba2 hybrids replayed by their op-library programs (issues 26 and 30): ``NemotronHForCausalLM``,
``BambaForCausalLM``, ``GraniteMoeHybridForCausalLM`` and ``FalconH1ForCausalLM``
(``analytic.ops.transformers.nemotron_h``, ``bamba``, ``granitemoehybrid``, ``falcon_h1``) equal transformers' own models measured by the storage tracker on meta, phase by phase, byte
for byte, at B = 1, 2 and 3 (``test_ops_transformers_llama.check``), and their plain CPU runs equal the CPU
allocator's events (``test_ops_transformers_zoo.check_plain``).

The Mamba2 mixer runs transformers' PyTorch path (``mamba2_chunk_scan``: the chunked SSD scan's einsums, cumsums,
``segment_sum`` masks and the padding to a chunk multiple), the path training takes without the CUDA kernels.  The
configs are small config.json objects read by ``hf_config.config_from_hf``: patterns with the Mamba2 mixer (M),
attention (*) and the squared-ReLU MLP (-) at sequences that are a chunk multiple, not one, and one chunk; and
Nemotron-H-8B's widths (``test_arch_mamba2.NEMOTRON_H_8B``) cut to four layers at S = 160 (two chunks of 128,
padded)."""

import json

import pytest

from lm_accounting.analytic.ops import predict_step, unsupported
from lm_accounting.hf_config import config_from_hf
from lm_accounting.setup import TrainingSetup

pytest.importorskip("transformers")
from test_ops_transformers_llama import check  # B = 1, 2, 3 against transformers' own model on meta
from test_ops_transformers_zoo import check_plain  # the plain CPU run against the CPU allocator

NEMOTRON_H = dict(
    model_type="nemotron_h",
    vocab_size=96,
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    mamba_num_heads=4,
    mamba_head_dim=8,
    ssm_state_size=4,
    n_groups=2,
    conv_kernel=4,
    chunk_size=8,
    max_position_embeddings=64,
)
"""Four Mamba2 heads of 8 in two groups of state 4 (B and C repeated per head), chunks of 8."""


def tiny(pattern: str, **fields):
    return config_from_hf({**NEMOTRON_H, "hybrid_override_pattern": pattern, **fields})


def label(setup: TrainingSetup) -> str:
    return "-".join(setup.to_dict().values())


CASES = [
    # (pattern, S, setup): S = 12 pads a second chunk of 8, 16 is two whole chunks, 7 is one padded chunk
    ("M*", 12, TrainingSetup(attention="naive")),
    ("M*-M", 12, TrainingSetup(attention="naive", precision="bf16")),
    ("M*-M", 16, TrainingSetup(attention="sdpa", checkpoint="full")),
    ("MM-*M-", 20, TrainingSetup(attention="sdpa", precision="bf16")),
    ("M-M*M", 7, TrainingSetup(attention="naive", precision="bf16", checkpoint="full")),
    ("*M-M*", 9, TrainingSetup(attention="naive", checkpoint="full", optimizer="for-loop")),
    # amp-bf16: einsum and conv1d lower-precision ops, softplus fp32, relu²'s torch.square no autocast op
    ("M*-", 12, TrainingSetup(attention="naive", precision="amp-bf16")),
    ("M*-M", 16, TrainingSetup(attention="sdpa", precision="amp-bf16", checkpoint="full")),
    ("M-M*M", 7, TrainingSetup(attention="naive", precision="amp-bf16", checkpoint="full")),
]


@pytest.mark.parametrize("pattern, seq, setup", CASES, ids=lambda v: v if isinstance(v, str | int) else label(v))
def test_nemotron_h_equals_transformers(pattern, seq, setup):
    """Mamba2 blocks (in_proj, the depthwise conv1d cut to S, the chunked scan, the gated RMSNorm per group,
    out_proj), attention blocks without RoPE (eager's additive mask or sdpa's flash kernel) and squared-ReLU MLP
    blocks, each ``x + mixer(norm(x))`` with Nemotron-H's fp32 weight product, runs of alike middle blocks replayed
    once, against ``NemotronHForCausalLM`` on meta at B = 1, 2 and 3."""
    check(tiny(pattern), seq, setup)


@pytest.mark.parametrize(
    "fields",
    [{"n_groups": 4}, {"n_groups": 1, "ssm_state_size": 8}, {"mamba_num_heads": 2, "mamba_head_dim": 16}],
    ids=["groups-as-heads", "one-group", "two-heads"],
)
def test_mixer_shapes_equal_transformers(fields):
    """One group per head (``repeat_interleave`` by 1: a view, no copy), one group for all heads, and two wide heads
    (the einsums' reshapes a view or a copy as their layouts allow)."""
    check(tiny("M*M", **fields), 12, TrainingSetup(attention="sdpa", precision="bf16"))


@pytest.mark.parametrize(
    "pattern, setup",
    [
        ("M*-M", TrainingSetup(attention="naive")),
        ("M*-M", TrainingSetup(attention="naive", precision="bf16")),
        ("M*-M", TrainingSetup(attention="sdpa", checkpoint="full")),
        ("M-M*M", TrainingSetup(attention="sdpa", precision="bf16", checkpoint="full")),
        ("M*-M", TrainingSetup(attention="naive", precision="amp-bf16")),
        ("M*-M", TrainingSetup(attention="sdpa", precision="amp-bf16", checkpoint="full")),
    ],
    ids=lambda v: v if isinstance(v, str) else label(v),
)
@pytest.mark.parametrize("batch", [1, 2])
def test_nemotron_h_plain_cpu_run_equals_the_cpu_allocator(pattern, setup, batch):
    """No dispatch mode: gradients summed in place, Python numbers wrapped, the CPU flash kernel's scratch."""
    check_plain(tiny(pattern), 12, batch, setup)


def test_nemotron_h_8b_widths_equal_transformers():
    """Nemotron-H-8B's widths (d 4,096, 128 Mamba2 heads of 64 in 8 groups of state 128, 32 heads of 128 with 8 K/V
    heads, relu² of 21,504) cut to the pattern ``M*-M`` and a 512-token vocabulary, at S = 160: two chunks of 128,
    the second padded."""
    from test_arch_mamba2 import NEMOTRON_H_8B

    data = {**NEMOTRON_H_8B, "hybrid_override_pattern": "M*-M", "vocab_size": 512}
    data.pop("num_hidden_layers", None)
    check(config_from_hf(data), 160, TrainingSetup(attention="sdpa", precision="bf16"))


NEMOTRON_H_EXPERTS = dict(
    n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, moe_shared_expert_intermediate_size=24
)


@pytest.mark.parametrize(
    "pattern, fields, seq, setup",
    [
        ("ME*E", {}, 12, TrainingSetup(attention="naive", precision="bf16")),
        ("MEE*E", {"n_routed_experts": 8, "moe_latent_size": 16, "n_group": 2, "topk_group": 1}, 12,
         TrainingSetup(attention="sdpa", precision="bf16", checkpoint="full")),
        ("E*ME", {"norm_topk_prob": False}, 7, TrainingSetup(attention="naive", precision="bf16", checkpoint="full")),
    ],
    ids=["experts", "latent-groups-full", "unnormed-full"],
)  # fmt: skip
def test_nemotron_h_experts_equal_transformers(pattern, fields, seq, setup):
    """``E`` layers: DeepSeek-V3's router (sigmoid scores, a score bias, ``n_group`` groups, its weight kept in fp32
    in a bf16 model), ``NemotronHExperts`` without gate under grouped_mm (``up_proj``, relu², ``down_proj``),
    between ``fc1_latent_proj`` and ``fc2_latent_proj`` when ``moe_latent_size`` is set, plus the shared relu² MLP;
    bf16 (grouped_mm's meta kernel takes bf16 only), against its class on meta at B = 1, 2 and 3."""
    check(tiny(pattern, **{**NEMOTRON_H_EXPERTS, **fields}), seq, setup)


@pytest.mark.parametrize("checkpoint", ["none", "full"])
def test_nemotron_h_experts_under_amp_bf16_equal_transformers_on_cpu(checkpoint):
    """amp-bf16 with fp32 experts (grouped_mm's meta kernel takes bf16 weights only: measured on cpu tensors under
    the storage tracker, at B = 1 and 2)."""
    from lm_accounting.measure.hf import measure_hf_step

    cfg = tiny("ME*E", **NEMOTRON_H_EXPERTS, moe_latent_size=16)
    setup = TrainingSetup(attention="naive", precision="amp-bf16", checkpoint=checkpoint)
    for batch in (1, 2):
        lines = predict_step(cfg, 12, setup, impl="transformers", batch=batch, device="cpu")
        assert lines.at(batch) == measure_hf_step(cfg, 12, batch, setup, device="cpu"), batch


def test_nemotron_h_experts_plain_cpu_run_equals_the_cpu_allocator():
    """fp32 experts (grouped_mm on CPU tensors) with latent projections, against the CPU allocator's events."""
    cfg = tiny("ME*E", **NEMOTRON_H_EXPERTS, moe_latent_size=16)
    check_plain(cfg, 12, 2, TrainingSetup(attention="naive"))


@pytest.mark.parametrize(
    "setup, reason",
    [
        (TrainingSetup(checkpoint="selective"), "no selective activation checkpointing"),
    ],
    ids=["selective"],
)
def test_what_is_not_transliterated_is_refused(setup, reason):
    """Selective checkpointing (transformers has none) is refused with its reason, and a single Mamba2 head (its
    einsums' gradients copy otherwise) too."""
    one_head = tiny("M*", mamba_num_heads=1, mamba_head_dim=32, n_groups=1)
    assert any("mamba_heads 1" in r for r in unsupported(one_head, TrainingSetup(), "transformers"))
    cfg = tiny("M*")
    reasons = unsupported(cfg, setup, "transformers")
    assert any(reason in r for r in reasons), reasons
    with pytest.raises(ValueError, match=reason):
        predict_step(cfg, 12, setup, impl="transformers")
    assert unsupported(tiny("M*-"), TrainingSetup(attention="naive"), "transformers") == []


@pytest.mark.parametrize(
    "fields, precision",
    [({"hybrid_override_pattern": "M*-M"}, "fp32"), ({"hybrid_override_pattern": "ME*", **NEMOTRON_H_EXPERTS}, "bf16")],
    ids=["dense-fp32", "experts-bf16"],
)
def test_memory_prints_the_exact_step_of_a_nemotron_h_config_json(run_cli, tmp_path, fields, precision):
    """``lm-account memory`` on a Nemotron-H config.json gives the replayed step (not the model states alone), and
    ``--measure meta`` finds transformers' model equal to it at every phase (the bf16 model's fp32 router weights
    in the baseline)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**NEMOTRON_H, **fields}))
    r = run_cli("memory", path, "-S", "64", "--precision", precision, "--measure", "meta")
    assert r.code == 0, r.err
    assert "model states only" not in r.out and "step peak" in r.out
    rows = [line for line in r.out.splitlines() if "+0.0000%" in line]
    assert len(rows) == 7, r.out  # baseline, and each phase's peak and end, equal to the measurement


MAMBA2 = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    mamba_n_heads=4,
    mamba_d_head=16,
    mamba_expand=2,
    mamba_d_state=4,
    mamba_n_groups=2,
    mamba_d_conv=4,
    mamba_chunk_size=8,
    max_position_embeddings=64,
)
"""Bamba's and Granite-4.0-H's mixer fields: 4 heads of 16 (expand 2 of d 32) in 2 groups of state 4, chunks of 8."""


def bamba(pattern: str, **fields):
    indices = [i for i, c in enumerate(pattern) if c == "*"]
    return config_from_hf(
        {"model_type": "bamba", **MAMBA2, "num_hidden_layers": len(pattern), "attn_layer_indices": indices, **fields}
    )


def granite_h(pattern: str, **fields):
    types = ["attention" if c == "*" else "mamba" for c in pattern]
    data = {"model_type": "granitemoehybrid", **MAMBA2, "num_hidden_layers": len(pattern), "layer_types": types}
    return config_from_hf({**data, "shared_intermediate_size": 64, "num_local_experts": 0, **fields})


EXPERTS = dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=16)

HYBRIDS = [
    ("bamba", "M*MM", {}, 12, TrainingSetup(attention="naive")),
    ("bamba", "M*M*M", {}, 9, TrainingSetup(attention="sdpa", precision="bf16")),
    ("bamba", "*M*M", {}, 7, TrainingSetup(attention="sdpa", precision="bf16", checkpoint="full")),
    ("bamba", "MM*M", {}, 16, TrainingSetup(attention="naive", checkpoint="full")),
    ("granitemoehybrid", "M*MM", {}, 12, TrainingSetup(attention="naive")),
    ("granitemoehybrid", "M*MM", {"position_embedding_type": "rope"}, 12, TrainingSetup(checkpoint="full")),
    ("granitemoehybrid", "*M*M", {}, 7, TrainingSetup(attention="naive", precision="bf16", checkpoint="full")),
    ("granitemoehybrid", "M*MM", {"position_embedding_type": "rope", **EXPERTS}, 12, TrainingSetup(precision="bf16")),
    ("granitemoehybrid", "*MM*", EXPERTS, 9, TrainingSetup(attention="naive", precision="bf16", checkpoint="full")),
    ("bamba", "M*MM", {}, 12, TrainingSetup(attention="naive", precision="amp-bf16")),
    ("bamba", "*M*M", {}, 7, TrainingSetup(attention="sdpa", precision="amp-bf16", checkpoint="full")),
    (
        "granitemoehybrid",
        "M*MM",
        {"position_embedding_type": "rope"},
        12,
        TrainingSetup(attention="naive", precision="amp-bf16", checkpoint="full"),
    ),
]


@pytest.mark.parametrize(
    "model_type, pattern, fields, seq, setup",
    HYBRIDS,
    ids=[f"{t}-{p}-{'rope-' if 'position_embedding_type' in f else ''}{'moe-' if f.get('num_local_experts') else ''}"
         f"{s}-{label(x)}" for t, p, f, s, x in HYBRIDS],
)  # fmt: skip
def test_bamba_and_granite_4_h_equal_transformers(model_type, pattern, fields, seq, setup):
    """Bamba: Llama's block (``input_layernorm``, mixer, ``pre_ff_layernorm``, SwiGLU) around Nemotron-H's Mamba2
    mixer or attention with RoPE on half of each head, the layer's attention weights kept by the model through the
    next layer.  Granite-4.0-H: Granite's multipliers, the same mixers (RoPE or none), ``shared_mlp`` (a fused
    SwiGLU) and, with experts, GraniteMoe's router and grouped_mm experts beside it (bf16: grouped_mm's meta kernel
    takes bf16 only).  Against their classes on meta at B = 1, 2 and 3."""
    cfg = (bamba if model_type == "bamba" else granite_h)(pattern, **fields)
    check(cfg, seq, setup)


@pytest.mark.parametrize(
    "make, fields, setup",
    [
        (bamba, {}, TrainingSetup(attention="naive")),
        (bamba, {}, TrainingSetup(attention="sdpa", precision="bf16", checkpoint="full")),
        (granite_h, {"position_embedding_type": "rope"}, TrainingSetup(attention="naive")),
        (granite_h, EXPERTS, TrainingSetup(attention="sdpa", checkpoint="full")),
    ],
    ids=["bamba-eager", "bamba-sdpa-bf16-full", "granite-h-rope-eager", "granite-h-moe-fp32-sdpa-full"],
)
def test_bamba_and_granite_4_h_plain_cpu_runs_equal_the_cpu_allocator(make, fields, setup):
    """The plain CPU run (fp32 experts too: grouped_mm runs on CPU tensors) against the CPU allocator's events."""
    check_plain(make("*MM*", **fields), 12, 2, setup)


def test_bamba_and_granite_4_h_are_covered():
    for cfg in (bamba("M*M"), granite_h("M*M"), granite_h("M*M", **EXPERTS)):
        for setup in (TrainingSetup(attention="naive"), TrainingSetup(precision="amp-bf16", checkpoint="full")):
            assert unsupported(cfg, setup, "transformers") == []
        assert unsupported(cfg, TrainingSetup(checkpoint="selective"), "transformers")


def falcon_h1(layers: int, **fields):
    data = {**MAMBA2, "mamba_d_ssm": 64, "num_hidden_layers": layers, **fields}
    del data["mamba_expand"]
    return config_from_hf({"model_type": "falcon_h1", **data})


@pytest.mark.parametrize(
    "layers, seq, setup",
    [
        (2, 12, TrainingSetup(attention="naive")),
        (3, 12, TrainingSetup(attention="naive", precision="bf16", checkpoint="full")),
        (4, 16, TrainingSetup(attention="sdpa", precision="bf16")),
        (3, 7, TrainingSetup(attention="sdpa", checkpoint="full")),
        (3, 12, TrainingSetup(attention="naive", precision="amp-bf16")),
        (3, 9, TrainingSetup(attention="sdpa", precision="amp-bf16", checkpoint="full")),
    ],
    ids=lambda v: v if isinstance(v, int) else label(v),
)
def test_falcon_h1_equals_transformers(layers, seq, setup):
    """Falcon-H1: the Mamba2 mixer (its input, ``in_proj``'s output times the ``mup_vector`` buffer, the scan's
    output times SiLU of the gate: no gated RMSNorm by default) and attention (keys times ``key_multiplier``)
    side by side on one norm in every layer, their scaled outputs summed, then a SwiGLU with its two multipliers;
    against its class on meta at B = 1, 2 and 3."""
    check(falcon_h1(layers), seq, setup)


@pytest.mark.parametrize(
    "setup",
    [TrainingSetup(attention="naive"), TrainingSetup(attention="sdpa", precision="bf16", checkpoint="full")],
    ids=label,
)
def test_falcon_h1_plain_cpu_run_equals_the_cpu_allocator(setup):
    check_plain(falcon_h1(3), 12, 2, setup)


@pytest.mark.parametrize(
    "setup, zero",
    [(TrainingSetup(attention="sdpa", precision="bf16"), 2), (TrainingSetup(attention="naive", checkpoint="full"), 3)],
    ids=["bf16-zero2", "fp32-full-zero3"],
)
def test_fsdp2_rank_of_falcon_h1_equals_transformers(setup, zero):
    """One rank of FSDP2 at world 4 (``ops.fsdp``) over Falcon-H1 (every layer alike) equals transformers' own model
    sharded on torch's fake process group (the patterned hybrids, whose layers have unlike parameters:
    tests/test_ops_transformers_fsdp_hybrid.py)."""
    from lm_accounting.layout import ParallelLayout
    from lm_accounting.measure.hf import measure_hf_step

    layout = ParallelLayout(dp=4, zero=zero)
    lines = predict_step(falcon_h1(3), 12, setup, impl="transformers", batch=2, layout=layout)
    assert lines.at(2) == measure_hf_step(falcon_h1(3), 12, 2, setup, device="meta", layout=layout)


def test_memory_predicts_a_gpus_step_exact_where_a_gpu_ran_it(run_cli, tmp_path):
    """Without ``--measure`` the step is predicted for a GPU (the CUDA target's kernel facts over transformers'
    PyTorch path): exact on the H100 that ran these programs (reports/cuda-h100/hf_memory.csv), not exact on an A100."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**NEMOTRON_H, "hybrid_override_pattern": "M*-M"}))
    r = run_cli("memory", path, "-S", "64")
    assert r.code == 0, r.err
    assert "model states only" not in r.out and "step peak" in r.out and "exact prediction for cuda" in r.out
    r = run_cli("memory", path, "-S", "64", "--gpu", "a100-80gb")
    assert r.code == 0 and "not exact on cuda" in r.out
