"""transformers' Mamba (v1) models replayed by their op-library programs (issues 26 and 30): ``MambaForCausalLM``,
``FalconMambaForCausalLM`` (``analytic.ops.transformers.mamba``) and ``JambaForCausalLM`` (``jamba``) equal
transformers' own models measured by the
storage tracker on meta, phase by phase, byte for byte, at B = 1, 2 and 3 (``test_ops_transformers_llama.check``),
and their plain CPU runs equal the CPU allocator's events (``test_ops_transformers_zoo.check_plain``).

The mixer runs transformers' PyTorch path (``mamba_selective_scan``'s sequential loop of S steps, each a
multiply-add of the state and a ``matmul`` by C, the outputs stacked), the path training takes without the CUDA
kernels.  The configs are small config.json objects read by ``hf_config.config_from_hf``: sequences of 5 tokens
(every step replayed) and 9 to 16 (the middle steps replayed once, ``tensors.repeated``), 2 to 4 layers (the middle
ones replayed once); Jamba's attention layers every 2nd to 4th layer, its experts every 2nd."""

import json

import pytest

from lm_accounting.analytic.ops import predict_step, unsupported
from lm_accounting.hf_config import config_from_hf
from lm_accounting.setup import TrainingSetup

pytest.importorskip("transformers")
from test_ops_transformers_llama import check  # B = 1, 2, 3 against transformers' own model on meta
from test_ops_transformers_zoo import check_plain  # the plain CPU run against the CPU allocator

MAMBA = dict(
    model_type="mamba",
    vocab_size=96,
    hidden_size=16,
    state_size=4,
    expand=2,
    conv_kernel=4,
    time_step_rank=4,
)
"""A mixer of E = 32 channels (expand 2 of d 16), state 4, dt rank 4, a conv of 4 taps; tied head (the default)."""


def tiny(model_type: str, layers: int, **fields):
    return config_from_hf({**MAMBA, "model_type": model_type, "num_hidden_layers": layers, **fields})


def label(setup: TrainingSetup) -> str:
    return "-".join(setup.to_dict().values())


CASES = [
    # (model_type, layers, S, setup): S = 5 replays every step of the scan, S >= 9 its middle steps once
    ("mamba", 2, 5, TrainingSetup(attention="naive")),
    ("mamba", 3, 12, TrainingSetup(attention="naive")),
    ("mamba", 2, 12, TrainingSetup(attention="naive", precision="bf16")),
    ("mamba", 4, 9, TrainingSetup(attention="naive", checkpoint="full")),
    ("mamba", 3, 16, TrainingSetup(precision="bf16", checkpoint="full")),
    ("falcon_mamba", 3, 12, TrainingSetup(attention="naive")),
    ("falcon_mamba", 2, 9, TrainingSetup(attention="naive", precision="bf16", checkpoint="full")),
    ("falcon_mamba", 3, 5, TrainingSetup(precision="bf16")),
    # amp-bf16: the projections, the conv1d and each step's matmul in bf16, softplus in fp32
    ("mamba", 3, 12, TrainingSetup(attention="naive", precision="amp-bf16")),
    ("falcon_mamba", 3, 12, TrainingSetup(precision="amp-bf16", checkpoint="full")),
]


def test_a_bf16_residual_equals_transformers():
    """``residual_in_fp32`` false: the residual stays bf16 between blocks (modeling_mamba.py:526), a smaller step."""
    setup = TrainingSetup(attention="naive", precision="bf16")
    check(tiny("mamba", 3, residual_in_fp32=False), 12, setup)
    check(tiny("falcon_mamba", 2, residual_in_fp32=False), 9, setup)


@pytest.mark.parametrize(
    "model_type, layers, seq, setup", CASES, ids=lambda v: v if isinstance(v, str | int) else label(v)
)
def test_mamba_equals_transformers(model_type, layers, seq, setup):
    """``MambaBlock``s (the RMSNorm, the fp32 residual, the mixer: ``in_proj``, the depthwise conv1d cut to S,
    ``x_proj``, Falcon-Mamba's weightless norms on dt, B and C, ``dt_proj.weight @`` copied contiguous, the
    discretisation in fp32, the sequential scan, the D residual and the SiLU gate, ``out_proj``), ``norm_f`` and the
    tied head, against transformers' class on meta at B = 1, 2 and 3 (sdpa builds the same model: no attention)."""
    check(tiny(model_type, layers), seq, setup)


def test_untied_head_and_wide_state_equal_transformers():
    """An untied ``lm_head`` (its own parameter), a state of 16 and a dt rank of 8 (Falcon-Mamba's)."""
    cfg = tiny("falcon_mamba", 3, tie_word_embeddings=False, state_size=16, time_step_rank=8)
    check(cfg, 10, TrainingSetup(attention="naive", precision="bf16"))


@pytest.mark.parametrize(
    "model_type, setup",
    [
        ("mamba", TrainingSetup(attention="naive")),
        ("mamba", TrainingSetup(attention="naive", precision="bf16", checkpoint="full")),
        ("falcon_mamba", TrainingSetup(attention="naive", checkpoint="full")),
        ("falcon_mamba", TrainingSetup(attention="naive", precision="bf16")),
        ("mamba", TrainingSetup(attention="naive", precision="amp-bf16", checkpoint="full")),
    ],
    ids=lambda v: v if isinstance(v, str) else label(v),
)
@pytest.mark.parametrize("batch", [1, 2])
def test_mamba_plain_cpu_run_equals_the_cpu_allocator(model_type, setup, batch):
    """No dispatch mode: gradients summed in place, Python numbers wrapped, checkpoint's saved CPU RNG state."""
    check_plain(tiny(model_type, 3), 12, batch, setup)


def test_what_is_not_transliterated_is_refused():
    """Selective checkpointing (transformers has none) is refused with its reason."""
    cfg, setup, reason = (
        tiny("mamba", 2),
        TrainingSetup(checkpoint="selective"),
        "no selective activation checkpointing",
    )
    reasons = unsupported(cfg, setup, "transformers")
    assert any(reason in r for r in reasons), reasons
    with pytest.raises(ValueError, match=reason):
        predict_step(cfg, 12, setup, impl="transformers")
    for model_type in ("mamba", "falcon_mamba"):
        for setup in (TrainingSetup(), TrainingSetup(precision="amp-bf16", checkpoint="full")):
            assert unsupported(tiny(model_type, 2), setup, "transformers") == []


@pytest.mark.parametrize("model_type, precision", [("mamba", "fp32"), ("falcon_mamba", "bf16")])
def test_memory_prints_the_exact_step_of_a_mamba_config_json(run_cli, tmp_path, model_type, precision):
    """``lm-account memory`` on a Mamba config.json gives the replayed step (not the model states alone), and
    ``--measure meta`` finds transformers' model equal to it at every phase."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**MAMBA, "model_type": model_type, "num_hidden_layers": 3}))
    r = run_cli("memory", path, "-S", "64", "--precision", precision, "--measure", "meta")
    assert r.code == 0, r.err
    assert "model states only" not in r.out and "step peak" in r.out
    rows = [line for line in r.out.splitlines() if "+0.0000%" in line]
    assert len(rows) == 7, r.out  # baseline, and each phase's peak and end, equal to the measurement


JAMBA = dict(
    model_type="jamba",
    vocab_size=96,
    hidden_size=16,
    intermediate_size=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    mamba_d_state=4,
    mamba_d_conv=4,
    mamba_expand=2,
    mamba_dt_rank=4,
    max_position_embeddings=64,
    num_experts_per_tok=2,
    expert_layer_period=2,
    expert_layer_offset=1,
)
"""Jamba's fields: GQA 4 heads over 2 K/V heads of 4, SwiGLU of 32, the mixer of ``MAMBA``; experts on odd layers."""


def jamba(layers: int, period: int, offset: int, experts: int = 1, **fields):
    data = {**JAMBA, "num_hidden_layers": layers, "attn_layer_period": period, "attn_layer_offset": offset}
    return config_from_hf({**data, "num_experts": experts, **fields})


JAMBA_CASES = [
    # (layers, attention period, offset, experts, S, setup); grouped_mm's meta kernel takes bf16 experts only
    (4, 2, 1, 1, 12, TrainingSetup(attention="naive")),
    (5, 3, 1, 4, 12, TrainingSetup(precision="bf16")),
    (4, 2, 0, 4, 9, TrainingSetup(attention="naive", precision="bf16", checkpoint="full")),
    (6, 4, 2, 1, 12, TrainingSetup(checkpoint="full")),
    (3, 2, 1, 1, 5, TrainingSetup(precision="bf16")),
    (4, 2, 1, 1, 12, TrainingSetup(attention="naive", precision="amp-bf16", checkpoint="full")),
]


@pytest.mark.parametrize(
    "layers, period, offset, experts, seq, setup",
    JAMBA_CASES,
    ids=[f"{n}-layers-attn-{p}-{o}-{'moe' if e > 1 else 'dense'}-{s}-{label(x)}" for n, p, o, e, s, x in JAMBA_CASES],
)
def test_jamba_equals_transformers(layers, period, offset, experts, seq, setup):
    """Jamba's layers: attention without RoPE (eager or sdpa) or Mamba's mixer with RMSNorms with gains on dt, B and
    C (no ``mamba_inner_fn`` call), each then a SwiGLU or, on the expert layers, a router left unnormalised and
    grouped_mm experts; a checkpointed Mamba layer holds no mask; against its class on meta at B = 1, 2 and 3."""
    check(jamba(layers, period, offset, experts), seq, setup)


@pytest.mark.parametrize(
    "setup",
    [TrainingSetup(attention="naive"), TrainingSetup(checkpoint="full"), TrainingSetup(precision="amp-bf16")],
    ids=label,
)
def test_jamba_fp32_experts_equal_transformers_on_cpu(setup):
    """fp32 experts (grouped_mm's meta kernel takes bf16 only): measured on cpu tensors under the storage tracker;
    under amp-bf16 the router's top-k stays fp32 (cast to the input's dtype, not the bf16 logits')."""
    from lm_accounting.measure.hf import measure_hf_step

    cfg = jamba(4, 2, 1, 4)
    for batch in (1, 2):
        lines = predict_step(cfg, 12, setup, impl="transformers", batch=batch, device="cpu")
        assert lines.at(batch) == measure_hf_step(cfg, 12, batch, setup, device="cpu"), batch


@pytest.mark.parametrize(
    "experts, setup",
    [(4, TrainingSetup(attention="naive")), (1, TrainingSetup(precision="bf16", checkpoint="full"))],
    ids=["moe-fp32-eager", "dense-bf16-sdpa-full"],
)
def test_jamba_plain_cpu_run_equals_the_cpu_allocator(experts, setup):
    check_plain(jamba(4, 2, 1, experts), 12, 2, setup)


def test_memory_prints_the_exact_step_of_a_jamba_config_json(run_cli, tmp_path):
    path = tmp_path / "config.json"
    data = {**JAMBA, "num_hidden_layers": 4, "attn_layer_period": 2, "attn_layer_offset": 1, "num_experts": 4}
    path.write_text(json.dumps(data))
    r = run_cli("memory", path, "-S", "64", "--precision", "bf16", "--measure", "meta")
    assert r.code == 0, r.err
    assert "model states only" not in r.out and "step peak" in r.out
    rows = [line for line in r.out.splitlines() if "+0.0000%" in line]
    assert len(rows) == 7, r.out
    assert unsupported(config_from_hf(data), TrainingSetup(checkpoint="selective"), "transformers")


@pytest.mark.parametrize("name", ["mamba-130m", "falcon-mamba-7b", "jamba-v0.1"])
def test_full_size_configs_write_back_to_the_same_model(name):
    """``to_hf_dict`` (what the programs' measurements build) of Mamba-130m, Falcon-Mamba-7B and Jamba-v0.1 (cut to
    4 layers, Jamba to 8: its attention on layer 4 written back as a period and an offset) gives transformers' class of the same
    parameter count, on meta, with the same layer pattern."""
    import torch
    import transformers
    from test_arch_mamba import FALCON_MAMBA_7B, JAMBA_V01, MAMBA_130M

    from lm_accounting.analytic.params import parameter_breakdown
    from lm_accounting.hf_config import to_hf_dict

    data = {"mamba-130m": MAMBA_130M, "falcon-mamba-7b": FALCON_MAMBA_7B, "jamba-v0.1": JAMBA_V01}[name]
    cfg = config_from_hf({**data, "num_hidden_layers": 8 if data["model_type"] == "jamba" else 4})
    values = to_hf_dict(cfg)  # refuses a config whose written fields build another model (``_built``)
    assert config_from_hf(values).layer_pattern == cfg.layer_pattern
    config = transformers.AutoConfig.for_model(values.pop("model_type"), **values)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == parameter_breakdown(cfg).total


def test_mamba_130m_widths_equal_transformers():
    """Mamba-130m's widths (d 768, E 1,536, state 16, dt rank 48) cut to 3 layers and a 512-token vocabulary, at
    S = 16 in bf16: the scan's middle 12 steps replayed once in every layer."""
    from test_arch_mamba import MAMBA_130M

    cfg = config_from_hf({**MAMBA_130M, "num_hidden_layers": 3, "vocab_size": 512})
    check(cfg, 16, TrainingSetup(precision="bf16"))
