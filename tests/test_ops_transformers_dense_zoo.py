"""transformers' dense models added to the op library for issue 26 (``DENSE``: gpt_bigcode, bloom, falcon, nemotron,
opt) replayed by their programs (``analytic.ops.transformers.PROGRAMS``) equal transformers' own models measured by
the storage tracker on meta, phase by phase, byte for byte, at B = 1, 2 and 3 (``test_ops_transformers_llama.check``),
and the plain CPU run equals the CPU allocator's events (``test_ops_transformers_zoo.check_plain``); also at
published widths (S = 256) and for one rank of FSDP2 on the fake process group.

The configs are small config.json objects read by ``hf_config.config_from_hf`` (the class defaults fill the rest:
GPTBigCode's 0.1 dropouts and multi-query attention, OPT's 0.1 dropout, Falcon-7B's block layout, Nemotron's half
rotary share)."""

import pytest

from lm_accounting.analytic.ops import predict_step, unsupported
from lm_accounting.hf_config import config_from_hf
from lm_accounting.setup import TrainingSetup

pytest.importorskip("transformers")
from test_ops_transformers_llama import check  # B = 1, 2, 3 against transformers' own model on meta
from test_ops_transformers_zoo import check_plain  # the plain CPU run against the CPU allocator

from lm_accounting.measure.hf import measure_hf_step

DENSE = {
    # GPTBigCode: GPT-2's model with nn.Linear projections, one K/V head (multi_query, its default), gelu_pytorch_tanh
    "gpt_bigcode": dict(vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=64),
    # OPT: learned positions at ids + 2 from a cumsum of ones, q scaled after q_proj, ReLU, dropout 0.1 (its class's)
    # BLOOM: ALiBi, an embedding LayerNorm, the fused query_key_value selected per q/k/v, its own GELU Function
    "bloom": dict(vocab_size=96, hidden_size=32, n_layer=3, n_head=4),
    # Falcon: Falcon-7B's layout by default (one K/V head, attention and MLP side by side from one norm), RoPE
    "falcon": dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4),
    # Nemotron: LayerNorm1P (weight + 1), squared-ReLU MLP, RoPE on half of each head, 2 K/V heads
    "nemotron": dict(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    ),
    "opt": dict(
        vocab_size=96,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        ffn_dim=64,
        max_position_embeddings=64,
    ),
}


def tiny(model_type: str, **fields):
    return config_from_hf({"model_type": model_type, **DENSE[model_type], **fields})


SETUPS = [
    TrainingSetup(attention="naive", precision="bf16"),
    TrainingSetup(attention="sdpa", checkpoint="full"),
    TrainingSetup(attention="sdpa", precision="amp-bf16"),
]
"""eager/sdpa x checkpointing none/full x fp32/bf16/amp-bf16, three of the twelve."""


def label(setup: TrainingSetup) -> str:
    return "-".join(setup.to_dict().values())


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"multi_query": False},
        {"attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "activation_function": "gelu_new"},
        {"tie_word_embeddings": False, "n_inner": 48},
    ],
    ids=["mqa-dropout", "mha", "no-dropout-gelu_new", "untied"],
)
@pytest.mark.parametrize("setup", SETUPS, ids=label)
def test_gpt_bigcode_equals_transformers(fields, setup):
    """GPTBigCode: GPT-2's model with nn.Linear projections, multi-query attention (one K/V head split off the fused
    ``c_attn``, repeated by eager, ``enable_gqa`` in sdpa's math path with dropout), or per-head splits without it,
    the class's 0.1 dropouts or none (sdpa's flash kernel), against its class on meta and the plain run against the
    CPU allocator."""
    cfg = tiny("gpt_bigcode", **fields)
    check(cfg, 12, setup)
    check_plain(cfg, 8, 2, setup)


def test_gpt_bigcode_dropouts_at_any_probability_are_modelled():
    """GPTBigCode's three dropouts are replayed at the config.json's probability (the class's 0.1 where left out):
    none is refused, and a step at 0.2 equals transformers' (the same noise tensors as at 0.1)."""
    cfg = tiny("gpt_bigcode", attn_pdrop=0.2, resid_pdrop=0.0)
    assert unsupported(cfg, TrainingSetup(), "transformers") == []
    setup = TrainingSetup(attention="sdpa", precision="bf16")
    lines = predict_step(cfg, 12, setup, impl="transformers", batch=2)
    assert lines.at(2) == measure_hf_step(cfg, 12, 2, setup, device="meta")


def test_refusals_name_what_is_not_transliterated():
    for model_type in DENSE:
        cfg = tiny(model_type)
        assert unsupported(cfg, TrainingSetup(attention="naive"), "transformers") == []
        assert unsupported(cfg, TrainingSetup(checkpoint="selective"), "transformers")


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"attention_dropout": 0.1, "enable_bias": False, "layer_norm_elementwise_affine": False},
        {"dropout": 0.0, "activation_function": "gelu", "tie_word_embeddings": False},
    ],
    ids=["relu-dropout", "attention-dropout-no-bias-no-affine", "no-dropout-gelu-untied"],
)
@pytest.mark.parametrize("setup", SETUPS, ids=label)
def test_opt_equals_transformers(fields, setup):
    """OPT: learned positions looked up at ``cumsum(ones) * ones - 1 + 2`` (fp32 ids made long), q scaled before its
    view, ReLU (or GELU) between ``fc1`` and ``fc2`` on the (B·S, d) view, the class's 0.1 dropout after the
    attention and the MLP, attention dropout (sdpa's math path) when set, LayerNorms with or without gain and bias,
    against its class on meta and the plain run against the CPU allocator."""
    cfg = tiny("opt", **fields)
    check(cfg, 12, setup)
    check_plain(cfg, 8, 2, setup)


def test_opt_layerdrop_is_refused():
    """OPT's ``layerdrop`` above 0 skips whole layers at random in training: refused, the field named."""
    reasons = unsupported(tiny("opt", layerdrop=0.1), TrainingSetup(), "transformers")
    assert any("layerdrop 0.1" in r for r in reasons)


def published(name: str) -> dict:
    """A published config.json of the tests (``test_hf_zoo.PUBLISHED``, ``test_arch_relu``, ``test_arch_bloom``)."""
    from test_arch_bloom import BLOOM_560M
    from test_arch_parallel_block import FALCON_7B, FALCON_40B
    from test_arch_relu import OPT_125M
    from test_hf_zoo import PUBLISHED

    return {
        "starcoderbase": PUBLISHED["starcoderbase"],
        "opt-125m": OPT_125M,
        "bloom-560m": BLOOM_560M,
        "falcon-7b": FALCON_7B,
        "falcon-40b": FALCON_40B,
        # NemotronConfig's defaults (nemotron-15b's shape: d 6,144, 48 heads, relu² of 24,576) with 8 K/V heads
        "nemotron-defaults": {
            "model_type": "nemotron",
            "hidden_size": 6144,
            "intermediate_size": 24576,
            "num_attention_heads": 48,
            "num_key_value_heads": 8,
            "max_position_embeddings": 4096,
        },
    }[name]


WIDE = [
    ("starcoderbase", TrainingSetup(attention="naive", precision="bf16")),
    ("starcoderbase", TrainingSetup(attention="sdpa", precision="amp-bf16")),
    ("opt-125m", TrainingSetup(attention="naive", precision="bf16")),
    ("opt-125m", TrainingSetup(attention="sdpa", precision="amp-bf16")),
    ("bloom-560m", TrainingSetup(attention="naive", precision="bf16")),
    ("bloom-560m", TrainingSetup(attention="naive", precision="amp-bf16", checkpoint="full")),
    ("falcon-7b", TrainingSetup(attention="naive", precision="bf16")),
    ("falcon-7b", TrainingSetup(attention="sdpa", precision="amp-bf16")),
    ("falcon-40b", TrainingSetup(attention="sdpa", precision="bf16", checkpoint="full")),
    ("nemotron-defaults", TrainingSetup(attention="sdpa", precision="bf16")),
    ("nemotron-defaults", TrainingSetup(attention="naive", checkpoint="full")),
]


@pytest.mark.parametrize("name, setup", WIDE, ids=lambda v: v if isinstance(v, str) else v.label)
def test_dense_programs_at_real_widths_equal_transformers(name, setup):
    """Published config.json files cut to 2 layers and a 512-token vocabulary, at S = 256: starcoderbase (d 6,144,
    one K/V head, d_ff 24,576), opt-125m (d 768, d_ff 3,072) and bloom-560m (d 1,024, 16 heads), where realistic
    relative sizes decide which tensor sets a peak; also falcon-7b, falcon-40b and Nemotron's class defaults."""
    base = published(name)
    layers = "n_layer" if name in ("starcoderbase", "bloom-560m") else "num_hidden_layers"
    data = {**base, layers: 2, "vocab_size": 512, "pad_token_id": None, "bos_token_id": None, "eos_token_id": None}
    check(config_from_hf(data), 256, setup)


@pytest.mark.parametrize(
    "fields", [{}, {"n_head": 6, "hidden_size": 48, "tie_word_embeddings": False}], ids=["4-heads", "6-heads-untied"]
)
@pytest.mark.parametrize(
    "setup",
    [
        TrainingSetup(attention="naive", precision="bf16"),
        TrainingSetup(attention="naive", checkpoint="full"),
        TrainingSetup(attention="naive", precision="amp-bf16"),
    ],
    ids=label,
)
def test_bloom_equals_transformers(fields, setup):
    """BLOOM (eager only): ALiBi slopes made on the device (6 heads: the power-of-2 slopes and the odd extras
    concatenated), the scores from ``baddbmm`` over them, q/k/v selected from the fused projection and reshaped
    (copies), ``BloomGelu``'s own forward and backward, the block's probabilities held through the next block,
    against its class on meta and the plain run against the CPU allocator."""
    cfg = tiny("bloom", **fields)
    check(cfg, 12, setup)
    check_plain(cfg, 8, 2, setup)


FALCON_BLOCKS = {
    "7b-multi-query-parallel": {},
    "new-architecture-two-norms": {"new_decoder_architecture": True, "num_kv_heads": 2, "bias": True},
    "new-architecture-one-norm": {"new_decoder_architecture": True, "num_kv_heads": 2, "num_ln_in_parallel_attn": 1},
    "sequential-heads": {"multi_query": False, "parallel_attn": False, "activation": "gelu_pytorch_tanh"},
}


@pytest.mark.parametrize("fields", list(FALCON_BLOCKS.values()), ids=list(FALCON_BLOCKS))
@pytest.mark.parametrize(
    "setup",
    [
        TrainingSetup(attention="naive", precision="bf16"),
        TrainingSetup(attention="naive", checkpoint="full"),
        TrainingSetup(attention="naive", precision="amp-bf16"),
    ],
    ids=label,
)
def test_falcon_equals_transformers(fields, setup):
    """Falcon (RoPE): FalconLinear's matmul then bias, the fused projection split per layout (selects; a slice
    and two indexed copies; the new architecture's broadcast and flattened copies), eager attention's in-place
    scaling, the mask made for every layer, the attention output added in place to the MLP's, against its class
    on meta and the plain run against the CPU allocator."""
    cfg = tiny("falcon", **fields)
    check(cfg, 12, setup)
    check_plain(cfg, 8, 2, setup)


@pytest.mark.parametrize("block", ["new-architecture-two-norms", "sequential-heads", "7b-multi-query-parallel"])
@pytest.mark.parametrize(
    "setup",
    [TrainingSetup(attention="sdpa", precision="bf16"), TrainingSetup(attention="sdpa", checkpoint="full")],
    ids=label,
)
def test_falcon_sdpa_equals_transformers(block, setup):
    """Falcon's sdpa, the (B, 1, S, S) bool mask made anyway (``allow_is_causal_skip=False``): with K/V on every
    head (the new architecture broadcasts them; one head each without ``multi_query``) into the CPU's flash kernel;
    with Falcon-7B's one K/V head torch's math path (the mask made additive in the 16-bit dtype before the fp32
    upcast, K and V broadcast by its matmuls: copies)."""
    cfg = tiny("falcon", **FALCON_BLOCKS[block])
    check(cfg, 12, setup)
    check_plain(cfg, 8, 2, setup)


@pytest.mark.parametrize(
    "fields",
    [{}, {"attention_bias": True, "mlp_bias": True, "hidden_act": "relu", "partial_rotary_factor": 1.0}],
    ids=["relu2-half-rotary", "biases-relu-full-rotary"],
)
@pytest.mark.parametrize(
    "setup",
    [
        TrainingSetup(attention="naive", precision="bf16"),
        TrainingSetup(attention="sdpa", checkpoint="full"),
        TrainingSetup(attention="sdpa", precision="bf16"),
    ],
    ids=label,
)
def test_nemotron_equals_transformers(fields, setup):
    """Nemotron: Llama's program with LayerNorm1P (``weight + 1.0`` made per call and saved), the squared ReLU
    (or ReLU) between ``up_proj`` and ``down_proj``, RoPE on the rotated share of each head, against its class on
    meta and the plain run against the CPU allocator."""
    cfg = tiny("nemotron", **fields)
    check(cfg, 12, setup)
    check_plain(cfg, 8, 2, setup)


@pytest.mark.parametrize(
    "setup",
    [
        TrainingSetup(attention="naive", precision="amp-bf16"),
        TrainingSetup(attention="sdpa", precision="amp-bf16", checkpoint="full"),
    ],
    ids=label,
)
def test_nemotron_under_autocast_equals_transformers_on_cpu(setup):
    """amp-bf16: LayerNorm1P casts its input, ``weight + 1`` and bias to bf16 when ``torch.is_autocast_enabled()``
    and runs the norm with autocast off (a bf16 norm, its bf16 copies saved); relu²'s ``torch.square`` has no
    autocast policy above the dispatcher.  On cpu tensors (the emulation sets CUDA's autocast flag and routes
    ``maybe_autocast`` to it) under the storage tracker, and the plain run against the CPU allocator.  Before, the
    program was refused; the relu² it had would have kept one fp32 copy per MLP (2,048 B a sequence here)."""
    from test_ops_transformers_moe import check as check_on

    cfg = tiny("nemotron")
    check_on(cfg, 8, setup, device="cpu")
    check_plain(cfg, 8, 2, setup)
    assert not unsupported(cfg, setup, "transformers")


def test_nemotron_under_autocast_on_meta_is_refused_in_one_line():
    """On meta transformers' own code fails (``torch.get_autocast_dtype("meta")``): refused before building."""
    from lm_accounting.config import AccountingError

    with pytest.raises(AccountingError, match="measure amp-bf16 on cpu"):
        measure_hf_step(tiny("nemotron"), 8, 1, TrainingSetup(precision="amp-bf16"), device="meta")


@pytest.mark.parametrize("model_type", list(DENSE))
@pytest.mark.parametrize(
    "setup, zero",
    [
        (TrainingSetup(attention="naive"), 3),
        (TrainingSetup(attention="naive", precision="bf16", checkpoint="full"), 2),
        (TrainingSetup(attention="naive", precision="amp-bf16"), 3),  # FSDP2's bf16 policy (``fsdp.POLICY_EXACT``)
    ],
    ids=lambda v: v.label if isinstance(v, TrainingSetup) else f"zero{v}",
)
def test_fsdp2_rank_of_the_dense_programs_equals_transformers(model_type, setup, zero):
    """One rank of FSDP2 at world 4 (``ops.fsdp``) over each program added here equals transformers' own model
    sharded on torch's fake process group (``measure_hf_step(..., layout=...)``)."""
    from lm_accounting.layout import ParallelLayout

    cfg, layout = tiny(model_type), ParallelLayout(dp=4, zero=zero)
    lines = predict_step(cfg, 12, setup, impl="transformers", batch=2, layout=layout)
    assert lines.at(2) == measure_hf_step(cfg, 12, 2, setup, device="meta", layout=layout)


def grid_setups(model_type: str) -> list[TrainingSetup]:
    attentions = ("naive",) if model_type == "bloom" else ("naive", "sdpa")
    precisions = ("fp32", "bf16") if model_type == "nemotron" else ("fp32", "bf16", "amp-bf16")
    return [
        TrainingSetup(attention=a, precision=p, checkpoint=c)
        for a in attentions
        for p in precisions
        for c in ("none", "full")
    ]


GRID = [(m, s) for m in DENSE for s in grid_setups(m)]
"""Every setup each program replays (BLOOM eager only, Nemotron without amp-bf16), over each type's ``DENSE``
config."""


@pytest.mark.grid
@pytest.mark.parametrize("model_type, setup", GRID, ids=lambda v: v if isinstance(v, str) else label(v))
@pytest.mark.parametrize("seq", [8, 12])
def test_dense_zoo_grid(model_type, seq, setup):
    check(tiny(model_type), seq, setup)


@pytest.mark.grid
@pytest.mark.parametrize("model_type, setup", GRID, ids=lambda v: v if isinstance(v, str) else label(v))
@pytest.mark.parametrize("batch", [1, 2])
def test_dense_plain_cpu_grid(model_type, batch, setup):
    check_plain(tiny(model_type), 8, batch, setup)
