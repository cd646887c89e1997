"""transformers' models of the zoo (``ZOO``: gpt2, gemma2, gemma3_text, olmo2, phi3, the Llama program's other
classes, and issue 26's smollm3, starcoder2, exaone4, helium, ernie4_5, glm, glm4, ministral3, vaultgemma,
hyperclovax, olmo, seed_oss and stablelm) replayed by the op library (``analytic.ops.transformers.PROGRAMS``) equal
transformers' own models measured by the storage tracker on meta, phase by phase, byte for byte.

The measured side is the library's class, ``AutoModelForCausalLM.from_config`` (``measure.hf``), trained one
step as the Trainer does; the predicted side never imports torch.  The configs are small config.json objects
read by ``hf_config.config_from_hf`` (the class defaults fill the rest: GPT-2's 0.1 dropouts, Gemma 2's
soft-capping).  The exact lines in B are checked at B = 2 and 3 from one replay, B = 1 by its own replay.  The
plain CPU run (no dispatch mode) is checked against the CPU allocator's events at S = 8, B = 1 and 2."""

import dataclasses

import pytest

from lm_accounting.analytic.ops import predict_step, unsupported
from lm_accounting.hf_config import config_from_hf
from lm_accounting.setup import TrainingSetup

pytest.importorskip("transformers")
from test_ops_transformers_llama import check  # B = 1, 2, 3 against transformers' own model on meta

from lm_accounting.measure.hf import measure_hf_step

LLAMA_LIKE = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)
ZOO = {
    "gpt2": dict(vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=64),
    "olmo2": LLAMA_LIKE,
    # Phi3Config's pad_token_id is 32000: the embedding needs more rows than that
    "phi3": {**LLAMA_LIKE, "vocab_size": 32064, "sliding_window": 10},
    "gemma2": {**LLAMA_LIKE, "head_dim": 8, "sliding_window": 10},
    "gemma3_text": {
        **LLAMA_LIKE,
        "num_hidden_layers": 3,
        "head_dim": 8,
        "sliding_window": 10,
        "sliding_window_pattern": 2,
    },
    # OLMo-3: OLMo-2's program, layers 0-2 and 4 windowed, 3 full (both masks, a rotary table per type)
    "olmo3": {**LLAMA_LIKE, "num_hidden_layers": 5, "sliding_window": 10},
    "ministral": {
        **LLAMA_LIKE,
        "head_dim": 8,
        "num_hidden_layers": 4,
        "sliding_window": 10,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
    },
    # StarCoder2: LayerNorms, biases everywhere (``use_bias``), c_fc/c_proj GELU MLP, a window on every layer
    "starcoder2": {**LLAMA_LIKE, "sliding_window": 10},
    # EXAONE 4: post-norms, per-head q/k norms; layers 0-2 windowed, 3 full and without RoPE (``nope_layers``), 4
    "exaone4": {**LLAMA_LIKE, "num_hidden_layers": 5, "sliding_window": 10, "sliding_window_pattern": 4},
    # Helium and ERNIE 4.5: Llama's with RoPE over interleaved pairs (``interleaved``)
    "helium": {**LLAMA_LIKE, "head_dim": 8},  # its class's 128 would not fit the square o_proj
    "ernie4_5": {**LLAMA_LIKE, "use_bias": True},
    # GLM and GLM-4-0414: RoPE on half of each head (interleaved), a fused gate_up_proj, q/k/v biases
    "glm": {**LLAMA_LIKE, "head_dim": 8},
    "glm4": {**LLAMA_LIKE, "head_dim": 8},
    # Ministral 3: Mistral's with Llama 4's attention scale on q; an optional window on every layer
    "ministral3": {**LLAMA_LIKE, "head_dim": 8, "sliding_window": 10},
    # VaultGemma: Gemma 2 without its post-norms; a window on every other layer
    "vaultgemma": {**LLAMA_LIKE, "num_hidden_layers": 4, "head_dim": 8, "sliding_window": 10},
    # HyperCLOVA X: Granite's with a norm after each sub-block (``use_post_norm``, its default)
    "hyperclovax": {**LLAMA_LIKE, "embedding_multiplier": 2.0, "residual_multiplier": 0.5, "logits_scaling": 0.25},
    # OLMo (v1): Llama's with weightless LayerNorms and fp32 rotary tables
    "olmo": LLAMA_LIKE,
    # Seed-OSS: Llama's with o_proj's own bias; its class's dropouts (0.1) set to 0
    "seed_oss": {
        **LLAMA_LIKE,
        "head_dim": 8,
        "attention_bias": True,
        "attention_out_bias": False,
        "attention_dropout": 0.0,
        "residual_dropout": 0.0,
    },
    # StableLM: LayerNorms, RoPE on a quarter of each head (2 of 8), q/k/v biases
    "stablelm": {**LLAMA_LIKE, "use_qkv_bias": True},
    "gemma": {**LLAMA_LIKE, "head_dim": 8},  # v1: Llama's layer with Gemma's norm, GeGLU and scaled embedding
    # Llama's program under other classes (``PROGRAMS``)
    # SmolLM3: no RoPE on layer 3 of 0-4 (``no_rope_layer_interval`` 4): the runs [0] [1 2] [3] [4]
    "smollm3": {**LLAMA_LIKE, "num_hidden_layers": 5, "no_rope_layer_interval": 4},
    "iquestcoder": LLAMA_LIKE,
    "hunyuan_v1_dense": {**LLAMA_LIKE, "head_dim": 8},
    "granite": {
        **LLAMA_LIKE,
        "embedding_multiplier": 12.0,
        "residual_multiplier": 0.22,
        "attention_multiplier": 0.0078125,
        "logits_scaling": 16.0,
        "attention_bias": True,
        "mlp_bias": True,
    },
}
"""A window of 10 keys: S = 8 leaves it out of the masks' reach, S = 12 makes the windowed mask."""


def tiny(model_type: str, **fields):
    return config_from_hf({"model_type": model_type, **ZOO[model_type], **fields})


@pytest.mark.parametrize("attention", ["naive", "sdpa"])
def test_gpt2_equals_transformers_on_meta(attention):
    """Conv1D's addmm, LayerNorm, gelu_new, learned positions and the 0.1 dropouts; sdpa with dropout runs
    torch's math path (upcast to fp32 in bf16)."""
    check(tiny("gpt2"), 8, TrainingSetup(attention=attention, precision="bf16"))


def test_gpt2_full_checkpointing_equals_transformers():
    check(tiny("gpt2"), 12, TrainingSetup(checkpoint="full"))


@pytest.mark.parametrize("model_type", ["gpt2", "gemma3_text"])
def test_amp_bf16_equals_transformers_under_accelerates_autocast(model_type):
    """fp32 parameters, the forward and the loss under autocast with its weight cache (``measure.hf``'s
    emulation of CUDA's lists: Conv1D's addmm casts its cached weight and bias before its input, LayerNorm
    runs in fp32, the sdpa math path's own ops are not autocast)."""
    check(tiny(model_type), 12, TrainingSetup(attention="sdpa", precision="amp-bf16"))


@pytest.mark.parametrize(
    "model_type, setup",
    [
        ("olmo2", TrainingSetup(attention="naive", precision="bf16")),  # fp32 rotary tables in a bf16 model
        ("olmo2", TrainingSetup(attention="sdpa", checkpoint="full")),
        ("phi3", TrainingSetup(attention="sdpa", precision="bf16")),  # a contiguous q into the flash kernel
        ("phi3", TrainingSetup(attention="naive", checkpoint="full")),
        ("gemma2", TrainingSetup(attention="naive", precision="bf16")),  # soft-capping, both masks
        ("gemma2", TrainingSetup(attention="naive", checkpoint="full")),
        ("gemma3_text", TrainingSetup(attention="sdpa", precision="bf16")),
        ("gemma3_text", TrainingSetup(attention="naive", checkpoint="full")),
    ],
    ids=lambda v: v if isinstance(v, str) else "-".join(v.to_dict().values()),
)
def test_zoo_equals_transformers_on_meta(model_type, setup):
    check(tiny(model_type), 12, setup)


def test_for_loop_adamw_follows_the_parameter_order():
    """The for-loop AdamW keeps the previous tensor's quotient while it makes the next one's root and quotient, so
    its peak depends on the order of the parameters: ``model.parameters()``'s (GPT-2: wte, then a 1,024-row wpe)."""
    check(tiny("gpt2", n_positions=1024), 8, TrainingSetup(precision="bf16", optimizer="for-loop"))


def test_gpt2_on_a_cpu_target_equals_transformers_on_cpu():
    """A cpu run makes LayerNorm's mean and rstd in the input's dtype (meta: fp32), so a bf16 GPT-2 differs
    by 2 x B·S x 2 bytes per norm between the targets; the program takes the target."""
    from lm_accounting.analytic.ops.engine import Affine
    from lm_accounting.analytic.ops.step import training_step
    from lm_accounting.analytic.ops.transformers import gpt2

    cfg, setup = tiny("gpt2"), TrainingSetup(precision="bf16")
    lines = training_step(lambda: gpt2.causal_lm(cfg, 8, setup, Affine(1), "cpu"), device="cpu")
    measured = measure_hf_step(cfg, 8, 2, setup, device="cpu")
    assert lines.at(2) == measured
    on_meta = predict_step(cfg, 8, setup, impl="transformers", batch=2).at(2)
    norms = 2 * cfg.num_layers + 1
    saved_meta = on_meta.forward.end - on_meta.baseline  # (the cpu baseline has AdamW's step counters)
    saved_cpu = measured.forward.end - measured.baseline
    assert saved_meta - saved_cpu == norms * 2 * (2 * 8) * 2  # mean and rstd, fp32 on meta, bf16 on cpu


def setups(model_type: str) -> list[TrainingSetup]:
    attentions = ("naive",) if model_type in ("gemma2", "vaultgemma") else ("naive", "sdpa")
    return [
        TrainingSetup(attention=a, precision=p, checkpoint=c)
        for a in attentions
        for p in ("fp32", "bf16", "amp-bf16")
        for c in ("none", "full")
    ]


GRID = [(m, s) for m in ZOO for s in setups(m)]


@pytest.mark.grid
@pytest.mark.parametrize(
    "model_type, setup", GRID, ids=lambda v: v if isinstance(v, str) else "-".join(v.to_dict().values())
)
@pytest.mark.parametrize("seq", [8, 12])
def test_zoo_grid(model_type, seq, setup):
    check(tiny(model_type), seq, setup)


def check_plain(cfg, seq, batch, setup):
    """The plain CPU run (no dispatch mode) against the CPU allocator's events (``measure.allocator``)."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()  # the CPU flash kernel's scratch is per thread
    plain = predict_step(
        cfg, seq, setup, impl="transformers", batch=batch, mode="plain", device="cpu", cpu_threads=threads
    )
    assert plain.at(batch) == measure_hf_step(cfg, seq, batch, setup, device="cpu", method="allocator"), setup


@pytest.mark.parametrize(
    "model_type, setup",
    [
        ("gpt2", TrainingSetup(attention="sdpa", precision="bf16")),
        # ``x / cap`` is div.Tensor with a wrapped number: DivBackward0 saves the 8-byte wrapper, one per layer
        # and one for the final logits, held by a checkpointed layer too (24 bytes here)
        ("gemma2", TrainingSetup(attention="naive")),
        ("gemma2", TrainingSetup(attention="naive", precision="amp-bf16", checkpoint="full")),
        ("gemma3_text", TrainingSetup(attention="sdpa", precision="amp-bf16", checkpoint="full")),
        ("olmo2", TrainingSetup(attention="naive", precision="bf16")),
        ("phi3", TrainingSetup(attention="sdpa", checkpoint="full")),
    ],
    ids=lambda v: v if isinstance(v, str) else "-".join(v.to_dict().values()),
)
def test_plain_cpu_run_equals_the_cpu_allocator(model_type, setup):
    """No dispatch mode: gradients summed in place, Python numbers wrapped in 8-byte tensors (and cast), the
    CPU flash kernel's per-thread scratch, checkpoint's saved CPU RNG state."""
    check_plain(tiny(model_type), 8, 2, setup)


@pytest.mark.grid
@pytest.mark.parametrize(
    "model_type, setup", GRID, ids=lambda v: v if isinstance(v, str) else "-".join(v.to_dict().values())
)
@pytest.mark.parametrize("batch", [1, 2])
def test_plain_cpu_grid(model_type, batch, setup):
    check_plain(tiny(model_type), 8, batch, setup)


def test_gemma_variants_equal_transformers():
    """An untied Gemma 2 head; Gemma 3 with one full-attention layer in six (its default pattern)."""
    check(tiny("gemma2", tie_word_embeddings=False), 12, TrainingSetup(precision="bf16"))
    six = tiny("gemma3_text", num_hidden_layers=6, sliding_window_pattern=6)
    check(six, 12, TrainingSetup(attention="sdpa", checkpoint="full"))


@pytest.mark.parametrize(
    "setup",
    [
        TrainingSetup(attention="naive", precision="bf16"),
        TrainingSetup(attention="sdpa", precision="amp-bf16", checkpoint="full"),
        TrainingSetup(attention="sdpa"),
    ],
    ids=lambda s: "-".join(s.to_dict().values()),
)
def test_olmo3_windows_equal_transformers(setup):
    """OLMo-3 at S = 12, past its 10-key window: both masks every forward, a table per layer type, the windowed
    layers in runs (``alike_runs``), against its class on meta and the plain run against the CPU allocator."""
    check(tiny("olmo3"), 12, setup)
    check_plain(tiny("olmo3"), 12, 2, setup)


@pytest.mark.parametrize("model_type", ["iquestcoder", "hunyuan_v1_dense", "granite", "gemma", "ministral", "smollm3"])
@pytest.mark.parametrize(
    "setup",
    [TrainingSetup(attention="naive", precision="amp-bf16"), TrainingSetup(attention="sdpa", checkpoint="full")],
    ids=lambda s: "-".join(s.to_dict().values()),
)
def test_more_classes_equal_their_programs(model_type, setup):
    """IQuest-Coder and HunYuan-Dense (q/k norms after RoPE) are Llama's program, Granite Llama's with its
    multipliers' three elementwise ops (``granite``), Gemma (v1) Llama's layer with Gemma's pieces (``gemma``),
    Ministral Mistral's with both masks built every forward (windowed and full layers alternating, S = 12 past the
    10-key window), SmolLM3 Llama's without RoPE on its NoPE layers, checked against their own classes, and the
    plain run against the CPU allocator (Granite's Python-number factors wrapped in 8-byte tensors)."""
    check(tiny(model_type), 12, setup)
    check_plain(tiny(model_type), 8, 2, setup)


def test_smollm3_nope_layer_sets_the_checkpointed_forward_peak():
    """SmolLM3's last layer of four skips RoPE (``no_rope_layer_interval`` 4): with checkpointing, the forward peak
    is inside that layer (d = 256), where Llama's RoPE would hold rotated q and k copies; transformers' model
    agrees with the NoPE replay, not with one that rotates every layer."""
    cfg = tiny("smollm3", num_hidden_layers=4, hidden_size=256, head_dim=64, intermediate_size=128)
    setup = TrainingSetup(attention="sdpa", checkpoint="full")
    assert cfg.nope_layers == (3,)
    check(cfg, 12, setup)
    roped = predict_step(dataclasses.replace(cfg, nope_layers=()), 12, setup, impl="transformers", batch=2)
    assert roped.at(2) != measure_hf_step(cfg, 12, 2, setup, device="meta")
    assert dataclasses.replace(cfg, num_layers=1).num_layers == 1  # a pipeline stage's slice: index 3 names no layer


@pytest.mark.parametrize(
    "fields, setup",
    [
        ({}, TrainingSetup(attention="sdpa", precision="bf16")),  # the windowed mask into the CPU flash kernel
        ({"use_bias": False, "hidden_act": "gelu_new"}, TrainingSetup(attention="naive", checkpoint="full")),
        ({"sliding_window": None, "tie_word_embeddings": False}, TrainingSetup(attention="sdpa", precision="amp-bf16")),
    ],
    ids=["window-sdpa-bf16", "no-bias-gelu_new-naive-full", "no-window-untied-sdpa-amp"],
)
def test_starcoder2_equals_transformers(fields, setup):
    """StarCoder2: the LayerNorm skeleton with Llama's attention and layer order, ``c_fc``/``c_proj`` (GELU, tanh
    form by default, or GPT-2's eight ops), biases when ``use_bias``, a window on every layer (S = 12 past its 10
    keys: ``create_sliding_window_causal_mask``), against its class on meta and the plain run against the CPU
    allocator."""
    cfg = tiny("starcoder2", **fields)
    check(cfg, 12, setup)
    check_plain(cfg, 12, 2, setup)


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"sliding_window": None},  # no window: RoPE on every layer, the full mask alone
        {"sliding_window_pattern": 1},  # a window given, every layer full: no layer rotates
        {
            "num_hidden_layers": 4,
            "sliding_window_pattern": "LLLG",
            "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
        },
    ],
    ids=["pattern-4", "no-window", "all-full-nope", "LLLG"],
)
@pytest.mark.parametrize(
    "setup",
    [TrainingSetup(attention="naive", precision="bf16"), TrainingSetup(attention="sdpa", checkpoint="full")],
    ids=lambda s: "-".join(s.to_dict().values()),
)
def test_exaone4_equals_transformers(fields, setup):
    """EXAONE 4: OLMo-2's post-norm layer around Llama's attention with per-head q/k norms on the transposed states,
    both masks (S = 12 past the 10-key window), and its full layers without RoPE whenever a window is given,
    against its class on meta and the plain run against the CPU allocator."""
    cfg = tiny("exaone4", **fields)
    check(cfg, 12, setup)
    check_plain(cfg, 12, 2, setup)


def test_exaone4_global_nope_sets_the_checkpointed_forward_peak():
    """The last of four layers is full attention without RoPE; with checkpointing at d = 256 the forward peak is
    inside it, so transformers' model agrees with the NoPE replay and not with one that rotates every layer."""
    cfg = tiny("exaone4", num_hidden_layers=4, hidden_size=256, head_dim=64, intermediate_size=128)
    setup = TrainingSetup(attention="sdpa", checkpoint="full")
    assert cfg.nope_layers == (3,)
    check(cfg, 12, setup)
    roped = predict_step(dataclasses.replace(cfg, nope_layers=()), 12, setup, impl="transformers", batch=2)
    assert roped.at(2) != measure_hf_step(cfg, 12, 2, setup, device="meta")


@pytest.mark.parametrize(
    "model_type, fields",
    [("helium", {}), ("helium", {"attention_bias": True}), ("ernie4_5", {}), ("ernie4_5", {"use_bias": False})],
    ids=["helium", "helium-qkv-bias", "ernie4_5", "ernie4_5-no-bias"],
)
@pytest.mark.parametrize(
    "setup",
    [TrainingSetup(attention="naive", precision="bf16"), TrainingSetup(attention="sdpa", checkpoint="full")],
    ids=lambda s: "-".join(s.to_dict().values()),
)
def test_interleaved_rope_models_equal_transformers(model_type, fields, setup):
    """Helium and ERNIE 4.5: Llama's with RoPE over interleaved pairs (the half table repeat-interleaved per layer,
    Cohere's ``rotate_half``); Helium's norm casts its weight to fp32 and its square ``o_proj`` has no bias even
    with ``attention_bias``; ERNIE's table stays fp32 and its products run in fp32.  Against their classes on meta
    and the plain run against the CPU allocator."""
    cfg = tiny(model_type, **fields)
    check(cfg, 12, setup)
    check_plain(cfg, 8, 2, setup)


@pytest.mark.parametrize(
    "model_type, fields",
    [
        ("glm", {}),
        ("glm", {"partial_rotary_factor": 1.0, "attention_bias": False}),  # the whole head: an alias, an empty pass
        ("glm4", {}),
        ("glm4", {"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.75}}),
    ],
    ids=["glm", "glm-full-rotary-no-bias", "glm4", "glm4-three-quarters"],
)
@pytest.mark.parametrize(
    "setup",
    [TrainingSetup(attention="naive", precision="bf16"), TrainingSetup(attention="sdpa", checkpoint="full")],
    ids=lambda s: "-".join(s.to_dict().values()),
)
def test_glm_equals_transformers(model_type, fields, setup):
    """GLM and GLM-4-0414: Llama's model, Phi-3's fused MLP, RoPE over interleaved pairs of the rotated share of each
    head (a table of that many frequencies, the rest passed through and concatenated), q/k/v biases, and GLM-4's
    sandwich norms; against their classes on meta and the plain run against the CPU allocator."""
    cfg = tiny(model_type, **fields)
    check(cfg, 12, setup)
    check_plain(cfg, 8, 2, setup)


@pytest.mark.parametrize(
    "model_type",
    ["smollm3", "starcoder2", "exaone4", "helium", "ernie4_5", "glm", "glm4", "ministral3", "olmo", "granite"]
    + ["hyperclovax", "seed_oss", "stablelm"],
)
@pytest.mark.parametrize(
    "setup, zero",
    [
        (TrainingSetup(), 3),
        (TrainingSetup(attention="sdpa", precision="bf16", checkpoint="full"), 2),
        (TrainingSetup(attention="sdpa", precision="amp-bf16"), 3),  # FSDP2's bf16 policy (``fsdp.POLICY_EXACT``)
    ],
    ids=lambda v: v.label if isinstance(v, TrainingSetup) else f"zero{v}",
)
def test_fsdp2_rank_of_the_new_programs_equals_transformers(model_type, setup, zero):
    """One rank of FSDP2 at world 4 (``ops.fsdp``) over each program added for issue 26 equals transformers' own model
    sharded on torch's fake process group (``measure_hf_step(..., layout=...)``), at S = 12 past the windows."""
    from lm_accounting.layout import ParallelLayout

    cfg, layout = tiny(model_type), ParallelLayout(dp=4, zero=zero)
    lines = predict_step(cfg, 12, setup, impl="transformers", batch=2, layout=layout)
    assert lines.at(2) == measure_hf_step(cfg, 12, 2, setup, device="meta", layout=layout)


WIDE = {
    # published config.json files (tests/test_hf_zoo.py ``PUBLISHED``), cut to a few layers and a 512-token vocabulary
    "SmolLM3-3B": dict(num_hidden_layers=4),  # layer 3 without RoPE
    "starcoder2-7b": dict(num_hidden_layers=3, sliding_window=128),  # a window inside S = 256
    "GLM-4-9B-0414": dict(num_hidden_layers=3),
    "glm-4-9b-chat-hf": dict(num_hidden_layers=3),
    "stablelm-2-1_6b": dict(num_hidden_layers=3),
    "stablelm-3b-4e1t": dict(num_hidden_layers=3),
    # widths picked by hand (d 2,048, 32 heads of 64, 8 K/V heads, d_ff 8,192): no published file is claimed
    "wide-exaone4": dict(model_type="exaone4", num_hidden_layers=4, sliding_window=128),
    "wide-helium": dict(model_type="helium", num_hidden_layers=3),
    "wide-ernie4_5": dict(model_type="ernie4_5", num_hidden_layers=3),
    "wide-ministral3": dict(model_type="ministral3", num_hidden_layers=3, sliding_window=128),
}
HAND = dict(
    hidden_size=2048,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=64,
    intermediate_size=8192,
    max_position_embeddings=4096,
)


@pytest.mark.parametrize("name", list(WIDE))
@pytest.mark.parametrize(
    "setup",
    [
        TrainingSetup(attention="naive", precision="bf16"),
        TrainingSetup(attention="sdpa", precision="amp-bf16", checkpoint="full"),
        TrainingSetup(attention="sdpa"),
    ],
    ids=lambda s: s.label,
)
def test_new_programs_at_real_widths_equal_transformers(name, setup):
    """Real widths at S = 256, where tensors of realistic relative sizes decide which one sets a peak."""
    from test_hf_zoo import PUBLISHED

    fields = WIDE[name]
    base = HAND if name.startswith("wide-") else PUBLISHED[name]
    data = {**base, **fields, "vocab_size": 512, "pad_token_id": None, "bos_token_id": None, "eos_token_id": None}
    check(config_from_hf(data), 256, setup)


@pytest.mark.parametrize("fields", [{}, {"sliding_window": None}], ids=["window", "no-window"])
@pytest.mark.parametrize(
    "setup",
    [TrainingSetup(attention="naive", precision="bf16"), TrainingSetup(attention="sdpa", checkpoint="full")],
    ids=lambda s: "-".join(s.to_dict().values()),
)
def test_ministral3_equals_transformers(fields, setup):
    """Ministral 3: Mistral's with Llama 4's attention scale computed from the positions in every layer and
    multiplied into q after RoPE (the product saving it), against its class on meta and the plain run against the
    CPU allocator (the scale's Python numbers wrapped)."""
    cfg = tiny("ministral3", **fields)
    check(cfg, 12, setup)
    check_plain(cfg, 8, 2, setup)


@pytest.mark.parametrize(
    "setup",
    [
        TrainingSetup(attention="naive", precision="bf16"),
        TrainingSetup(attention="naive", checkpoint="full"),
        TrainingSetup(attention="naive", precision="amp-bf16"),
    ],
    ids=lambda s: "-".join(s.to_dict().values()),
)
def test_vaultgemma_equals_transformers(setup):
    """VaultGemma: Gemma 2's model (soft-capping, both masks, one rotary table, scaled embeddings) with Llama's
    pre-norm layer, eager only, against its class on meta and the plain run against the CPU allocator, and one rank
    of FSDP2 (ZeRO-3, world 4) on the fake process group."""
    from lm_accounting.layout import ParallelLayout

    cfg = tiny("vaultgemma")
    check(cfg, 12, setup)
    check_plain(cfg, 8, 2, setup)
    layout = ParallelLayout(dp=4, zero=3)
    lines = predict_step(cfg, 12, setup, impl="transformers", batch=2, layout=layout)
    assert lines.at(2) == measure_hf_step(cfg, 12, 2, setup, device="meta", layout=layout)
    assert any("eager" in r for r in unsupported(cfg, TrainingSetup(attention="sdpa"), "transformers"))


@pytest.mark.parametrize("fields", [{}, {"use_post_norm": False}], ids=["post-norms", "no-post-norms"])
@pytest.mark.parametrize(
    "setup",
    [TrainingSetup(attention="naive", precision="amp-bf16"), TrainingSetup(attention="sdpa", checkpoint="full")],
    ids=lambda s: "-".join(s.to_dict().values()),
)
def test_hyperclovax_equals_transformers(fields, setup):
    """HyperCLOVA X: Granite's program (its multipliers' elementwise ops, the logits multiplied) with an RMSNorm
    after each sub-block when ``use_post_norm``, against its class on meta and the plain run against the CPU
    allocator."""
    cfg = tiny("hyperclovax", **fields)
    check(cfg, 12, setup)
    check_plain(cfg, 8, 2, setup)


@pytest.mark.parametrize("fields", [{}, {"attention_bias": True}], ids=["no-bias", "qkvo-bias"])
@pytest.mark.parametrize(
    "setup",
    [TrainingSetup(attention="naive", precision="bf16"), TrainingSetup(attention="sdpa", checkpoint="full")],
    ids=lambda s: "-".join(s.to_dict().values()),
)
def test_olmo_equals_transformers(fields, setup):
    """OLMo (v1): Llama's with weightless LayerNorms in fp32 (no parameter) and OLMo-2's fp32 rotary tables, against
    its class on meta and the plain run against the CPU allocator (the norms' statistics in the fp32 input's dtype)."""
    cfg = tiny("olmo", **fields)
    check(cfg, 12, setup)
    check_plain(cfg, 8, 2, setup)


@pytest.mark.parametrize(
    "fields",
    [{}, {"attention_bias": False, "attention_out_bias": True, "mlp_bias": True}],
    ids=["qkv-bias", "o-and-mlp-bias"],
)
@pytest.mark.parametrize(
    "setup",
    [TrainingSetup(attention="naive", precision="bf16"), TrainingSetup(attention="sdpa", checkpoint="full")],
    ids=lambda s: "-".join(s.to_dict().values()),
)
def test_seed_oss_equals_transformers(fields, setup):
    """Seed-OSS: Llama's program (o_proj's bias its own field, the residual dropouts at p = 0 return their input),
    against its class on meta and the plain run against the CPU allocator."""
    cfg = tiny("seed_oss", **fields)
    check(cfg, 12, setup)
    check_plain(cfg, 8, 2, setup)


def test_seed_oss_dropout_left_to_its_class_is_refused():
    """``SeedOssConfig`` trains with ``attention_dropout`` and ``residual_dropout`` 0.1: a config.json that leaves one
    out gets model states, the field named (one that sets it above 0 is ``unmodelled_dropout``'s refusal)."""
    fields = {k: v for k, v in ZOO["seed_oss"].items() if k != "residual_dropout"}
    cfg = config_from_hf({"model_type": "seed_oss", **fields})
    assert any("residual_dropout at its class's 0.1" in r for r in unsupported(cfg, TrainingSetup(), "transformers"))
    reasons = unsupported(tiny("seed_oss", attention_dropout=0.1), TrainingSetup(), "transformers")
    assert any("attention_dropout 0.1" in r for r in reasons)


@pytest.mark.parametrize(
    "fields",
    [{}, {"use_parallel_residual": True, "use_qkv_bias": False}, {"partial_rotary_factor": 1.0}],
    ids=["sequential", "parallel-no-bias", "full-rotary"],
)
@pytest.mark.parametrize(
    "setup",
    [TrainingSetup(attention="naive", precision="bf16"), TrainingSetup(attention="sdpa", checkpoint="full")],
    ids=lambda s: "-".join(s.to_dict().values()),
)
def test_stablelm_equals_transformers(fields, setup):
    """StableLM: the LayerNorm skeleton with Llama's projections and RoPE on the first quarter of each head (sliced,
    rotated, concatenated back; the whole head an alias), its sequential or parallel layer, against its class on
    meta and the plain run against the CPU allocator."""
    cfg = tiny("stablelm", **fields)
    check(cfg, 12, setup)
    check_plain(cfg, 8, 2, setup)


def test_starcoder2_residual_dropout_is_refused():
    """StarCoder2's ``residual_dropout`` and ``embedding_dropout`` (0 in its class and in starcoder2-7b's
    config.json) keep masks for the backward at p > 0, which the program does not transliterate: refused, the field
    named."""
    reasons = unsupported(tiny("starcoder2", residual_dropout=0.1), TrainingSetup(), "transformers")
    assert any("residual_dropout 0.1" in r for r in reasons)


@pytest.mark.parametrize(
    "model_type, fields, setup",
    [
        # layers s s f s s f s s f: the middle runs [s] [f] [s s] [f] [s s], each replayed once (``alike_runs``)
        ("gemma3_text", dict(num_hidden_layers=9, sliding_window_pattern=3), TrainingSetup(attention="naive")),
        ("gemma3_text", dict(num_hidden_layers=9, sliding_window_pattern=3), TrainingSetup(checkpoint="full")),
        ("gemma2", dict(num_hidden_layers=5), TrainingSetup(attention="naive", precision="amp-bf16")),
        ("olmo2", dict(num_hidden_layers=5), TrainingSetup(attention="sdpa", precision="bf16")),
        ("phi3", dict(num_hidden_layers=5), TrainingSetup(attention="naive", checkpoint="full")),
    ],
    ids=lambda v: (
        v if isinstance(v, str) else "-".join(map(str, v.to_dict().values() if hasattr(v, "to_dict") else v.values()))
    ),
)
def test_runs_of_alike_layers_replayed_once_equal_transformers(model_type, fields, setup):
    """Deeper models than the grid's: the middle layers in runs of one kind, each run replayed once for all its
    layers, against every layer of transformers' model on meta, and the plain run against the CPU allocator."""
    cfg = tiny(model_type, **fields)
    check(cfg, 12, setup)
    check_plain(cfg, 8, 2, setup)


def test_refusals_name_what_is_not_transliterated():
    """Gemma 2 with sdpa is transformers' own refusal; selective checkpointing does not exist there."""
    assert any("eager" in r for r in unsupported(tiny("gemma2"), TrainingSetup(attention="sdpa"), "transformers"))
    for model_type in ZOO:
        cfg = tiny(model_type)
        assert unsupported(cfg, TrainingSetup(attention="naive"), "transformers") == []
        assert unsupported(cfg, TrainingSetup(checkpoint="selective"), "transformers")
    with pytest.raises(ValueError, match="eager"):
        predict_step(tiny("gemma2"), 8, TrainingSetup(attention="sdpa"), impl="transformers")
