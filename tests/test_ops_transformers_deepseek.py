"""transformers' DeepSeek-V3 and DeepSeek-V2 replayed by the op library (``analytic.ops.transformers.deepseek``, ``deepseek_v2``)
equal transformers' own ``DeepseekV3ForCausalLM`` and ``DeepseekV2ForCausalLM``, phase by phase, byte for byte.

As for Mixtral and Qwen3-MoE (test_ops_transformers_moe.py): the experts run ``grouped_mm``, whose meta kernel
takes bf16 only, so fp32 and amp-bf16 are measured by the storage tracker on cpu tensors, bf16 on meta too,
and the plain run by the CPU allocator.  Widths keep every grouped_mm row a multiple of 16 bytes in bf16.  The
value head (6) differs from the query/key head (8 + 4), so CPU sdpa takes torch's math path; ``v_head_dim``
12 gives the flash kernel.  The router's weight and bias stay fp32 in a bf16 model
(``_keep_in_fp32_modules_strict``), a second dtype group for foreach AdamW.  DeepSeek-V2 (the ``v2-*``
variants) shares the attention's projections and ``expand_kv``, with a softmax router and complex RoPE."""

import pytest

from lm_accounting.analytic.ops import predict_step, unsupported
from lm_accounting.hf_config import config_from_hf
from lm_accounting.setup import TrainingSetup

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from test_ops_transformers_llama import PLAIN_SETUPS  # attention × precision × checkpointing
from test_ops_transformers_moe import check  # B = 1, 2, 3 against the storage tracker

from lm_accounting.measure.hf import measure_hf_step

SHAPE = dict(
    model_type="deepseek_v3",
    vocab_size=96,
    hidden_size=16,
    intermediate_size=32,
    moe_intermediate_size=16,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_routed_experts=8,
    n_group=2,
    topk_group=1,
    num_experts_per_tok=2,
    first_k_dense_replace=1,
    n_shared_experts=1,
    kv_lora_rank=16,
    q_lora_rank=12,
    qk_rope_head_dim=4,
    qk_nope_head_dim=8,
    v_head_dim=6,
    max_position_embeddings=64,
)
VARIANTS = {
    "base": {},  # q_lora, interleaved RoPE, 2 groups keeping 1, normalised top-k (the class's default)
    "plain-q": {"q_lora_rank": None},
    "rotate-half": {"rope_interleave": False},
    "two-dense": {"first_k_dense_replace": 2, "num_hidden_layers": 4},  # the middle layers differ
    # layers d d d m m m: the middle runs [d d] and [m m], each replayed once (``alike_runs``)
    "three-dense": {"first_k_dense_replace": 3, "num_hidden_layers": 6, "model_type": "deepseek_v2"},
    "four-groups": {"n_group": 4, "topk_group": 2},
    "one-group": {"n_group": 1, "topk_group": 1},
    "unnormalised": {"norm_topk_prob": False},
    "flash": {"v_head_dim": 12},  # one head size for q, k and v: the CPU flash kernel
    "two-shared": {"n_shared_experts": 2},
    # DeepSeek-V2: a softmax router (greedy: no groups; group-limited: each group's max), complex RoPE
    "v2-greedy": {"model_type": "deepseek_v2", "n_group": None, "topk_group": None},
    "v2-group-limited": {
        "model_type": "deepseek_v2",
        "topk_method": "group_limited_greedy",
        "n_group": 4,
        "topk_group": 2,
        "q_lora_rank": None,
    },
    "v2-flash": {"model_type": "deepseek_v2", "n_group": None, "topk_group": None, "v_head_dim": 12},
}


def tiny(name: str = "base"):
    return config_from_hf({**SHAPE, **VARIANTS[name]})


SETUPS = [
    TrainingSetup(attention="sdpa"),
    TrainingSetup(attention="naive", precision="amp-bf16", checkpoint="full"),
    TrainingSetup(attention="sdpa", precision="amp-bf16"),
    TrainingSetup(attention="naive", precision="bf16"),
]


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("setup", SETUPS, ids=["sdpa-fp32", "eager-amp-full", "sdpa-amp", "eager-bf16"])
def test_deepseek_v3_equals_transformers_under_the_tracker(name, setup):
    """MLA (the LoRA query or not, the latent's norm, RoPE interleaved or halves, the query's cat, expand_kv's
    new_empty and two CopySlices), eager or sdpa (math or flash), the group-limited sigmoid router (fp32 weight,
    masked_fill's saved mask, gather, the in-place division, the fp32 sum under autocast), the experts, the
    shared MLP, dense first layers; checkpointing's early stop."""
    check(tiny(name), 8, setup)


@pytest.mark.parametrize("name", ["base", "flash", "v2-greedy", "v2-group-limited"])
@pytest.mark.parametrize("checkpoint", ["none", "full"])
def test_bf16_runs_on_meta_and_equals(name, checkpoint):
    check(tiny(name), 12, TrainingSetup(attention="sdpa", precision="bf16", checkpoint=checkpoint), device="meta")


@pytest.mark.grid
@pytest.mark.parametrize("setup", PLAIN_SETUPS, ids=lambda s: "-".join(s.to_dict().values()))
@pytest.mark.parametrize("name", list(VARIANTS))
def test_deepseek_v3_grid(name, setup):
    check(tiny(name), 8, setup)


@pytest.mark.parametrize(
    "name, setup",
    [
        ("base", TrainingSetup(attention="sdpa")),
        ("plain-q", TrainingSetup(attention="naive", precision="amp-bf16", checkpoint="full")),
        ("flash", TrainingSetup(attention="sdpa", precision="bf16")),  # two dtype groups in foreach AdamW
        ("base", TrainingSetup(attention="naive", precision="bf16", optimizer="for-loop")),
        ("v2-greedy", TrainingSetup(attention="sdpa")),
        ("v2-group-limited", TrainingSetup(attention="naive", precision="amp-bf16", checkpoint="full")),
        ("v2-flash", TrainingSetup(attention="sdpa", precision="bf16")),
    ],
)
def test_plain_cpu_run_equals_the_cpu_allocator(name, setup):
    cfg = tiny(name)
    threads = torch.get_num_threads()
    for batch in (1, 2):
        plain = predict_step(
            cfg, 8, setup, impl="transformers", batch=batch, mode="plain", device="cpu", cpu_threads=threads
        )
        assert plain.at(batch) == measure_hf_step(cfg, 8, batch, setup, device="cpu", method="allocator")


@pytest.mark.parametrize(
    "setup",
    [TrainingSetup(attention="sdpa"), TrainingSetup(attention="naive", precision="amp-bf16", checkpoint="full")],
    ids=["sdpa-fp32", "eager-amp-full"],
)
def test_sarvam_mla_is_deepseek_v3s_program(setup):
    """``sarvam_mla``: transformers builds ``DeepseekV3ForCausalLM`` for it (its class's defaults: one group, a
    plain query projection)."""
    absent = ("n_group", "topk_group", "q_lora_rank")
    cfg = config_from_hf({**{k: v for k, v in SHAPE.items() if k not in absent}, "model_type": "sarvam_mla"})
    assert (cfg.expert_groups, cfg.q_lora_rank, cfg.norm_topk_prob, cfg.rope_interleave) == (1, None, True, True)
    check(cfg, 8, setup)


@pytest.mark.parametrize("dense", [1, 2])
@pytest.mark.parametrize(
    "setup",
    [TrainingSetup(attention="sdpa"), TrainingSetup(attention="naive", precision="amp-bf16", checkpoint="full")],
    ids=["sdpa-fp32", "eager-amp-full"],
)
def test_glm4_moe_lite_is_deepseek_v3s_program(setup, dense):
    """``glm4_moe_lite`` (GLM-4.7-Flash): ``Glm4MoeLiteForCausalLM`` has DeepSeek-V3's attention, router and
    block line for line; its dense first layers come from ``mlp_layer_types``."""
    values = {k: v for k, v in SHAPE.items() if k != "first_k_dense_replace"}
    types = ["dense"] * dense + ["sparse"] * (4 - dense)
    cfg = config_from_hf({**values, "model_type": "glm4_moe_lite", "num_hidden_layers": 4, "mlp_layer_types": types})
    assert cfg.dense_layers_first == dense
    check(cfg, 8, setup)


YOUTU_DROPS = ("n_routed_experts", "n_group", "topk_group", "num_experts_per_tok", "first_k_dense_replace")
YOUTU_DROPS += ("n_shared_experts", "moe_intermediate_size")


@pytest.mark.parametrize("extra", [{}, {"rope_interleave": False, "q_lora_rank": None, "tie_word_embeddings": False}])
@pytest.mark.parametrize(
    "setup",
    [TrainingSetup(attention="sdpa"), TrainingSetup(attention="naive", precision="amp-bf16", checkpoint="full")],
    ids=["sdpa-fp32", "eager-amp-full"],
)
def test_youtu_is_deepseek_v3s_attention_with_dense_layers(setup, extra):
    """``youtu``: Llama's model and decoder layer with ``DeepseekV3Attention`` and a dense MLP in every layer,
    tied by default."""
    values = {k: v for k, v in SHAPE.items() if k not in YOUTU_DROPS}
    cfg = config_from_hf({**values, "model_type": "youtu", **extra})
    assert not cfg.moe and cfg.tie_embeddings == (extra == {})
    check(cfg, 8, setup)


def test_the_router_stays_fp32_in_a_bf16_model():
    """What the prediction assumes, read off transformers' model: the router's weight and bias buffer are fp32
    in a bf16 model, every other parameter bf16."""
    from lm_accounting.measure.hf import build_hf_model

    model = build_hf_model(tiny(), TrainingSetup(precision="bf16"), device="meta")
    fp32 = {n for n, p in [*model.named_parameters(), *model.named_buffers()] if p.dtype == torch.float32}
    routers = {f"model.layers.{i}.mlp.gate.{k}" for i in (1, 2) for k in ("weight", "e_score_correction_bias")}
    rotary = {"model.rotary_emb.inv_freq", "model.rotary_emb.original_inv_freq"}
    assert fp32 == routers | rotary


@pytest.mark.parametrize("name", ["base", "v2-greedy", "two-dense"])
def test_the_model_states_count_the_fp32_routers(name):
    """``memory``'s model states for transformers' bf16 DeepSeek (parameters, gradients, m, v, each with the
    routers' 4 bytes a weight) and foreach AdamW's step temporaries equal the bytes of transformers' own
    parameters."""
    from lm_accounting.analytic.program_report import implementation_account
    from lm_accounting.measure.hf import build_hf_model

    cfg, setup = tiny(name), TrainingSetup(attention="naive", precision="bf16")
    model = build_hf_model(cfg, setup, device="meta")
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    account = implementation_account(cfg, 8, 1, impl="transformers", setup=setup, device="cpu")
    assert [item.total for item in account.states] == [nbytes] * 4
    assert account.step_temporaries == nbytes


def test_what_the_router_needs_is_read_and_written_back():
    """n_group, topk_group, norm_topk_prob and rope_interleave reach the model transformers builds."""
    from lm_accounting.measure.hf import hf_pretrained_config

    config = hf_pretrained_config(tiny("four-groups"))
    assert (config.n_group, config.topk_group, config.norm_topk_prob, config.rope_interleave) == (4, 2, True, True)
    config = hf_pretrained_config(tiny("rotate-half"))
    assert config.rope_interleave is False
    absent = {k: v for k, v in SHAPE.items() if k not in ("n_group", "topk_group")}
    defaults = config_from_hf({**absent, "n_routed_experts": 16})  # the class's 8 groups, 4 kept
    assert (defaults.expert_groups, defaults.expert_groups_per_token, defaults.norm_topk_prob) == (8, 4, True)


def test_a_router_transformers_cannot_run_is_named():
    cfg = config_from_hf({**SHAPE, "n_group": 3})  # 8 experts in 3 groups: the router's view fails
    assert any("n_group" in r for r in unsupported(cfg, TrainingSetup(), "transformers"))
    greedy = config_from_hf({**SHAPE, "model_type": "deepseek_v2", "n_group": 3})  # V2's greedy takes no groups
    assert unsupported(greedy, TrainingSetup(), "transformers") == []


def test_a_v2_router_transformers_cannot_run_is_refused_when_read():
    from lm_accounting.config import ConfigError

    with pytest.raises(ConfigError, match="topk_method"):
        config_from_hf({**SHAPE, "model_type": "deepseek_v2", "topk_method": "noaux_tc"})


def test_fsdp2_over_deepseek_is_refused():
    """torch's ``fully_shard`` refuses a bf16 DeepSeek (its fp32 router weight beside bf16 ones: "FSDP expects
    uniform original parameter dtype"); in fp32 the fake-PG job was not matched: refused, not guessed."""
    from lm_accounting.layout import ParallelLayout

    for name in ("base", "v2-greedy"):
        with pytest.raises(ValueError, match="FSDP2 over transformers' deepseek_v"):
            predict_step(tiny(name), 8, TrainingSetup(), impl="transformers", layout=ParallelLayout(dp=4, zero=2))
