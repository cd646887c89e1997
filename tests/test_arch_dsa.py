"""DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): parameters and forward FLOPs, exact against transformers 5.24.

transformers' models/deepseek_v32/modeling_deepseek_v32.py (and models/glm_moe_dsa/): DeepSeek-V3's latent attention
and experts, and in every layer's attention a ``DeepseekV32Indexer`` registered after ``o_proj``: ``wq_b``
(q_lora_rank -> H_I·d_I, from the query latent), ``wk`` (d -> d_I, one key), ``k_norm`` (a LayerNorm with bias),
``weights_proj`` (d -> H_I); its forward scores every query against every key (``torch.matmul(q, kᵀ)``, the full
S x S square per head), ReLUs and sums them over the heads with the per-token weights (a second matmul), adds the
causal mask and keeps the top ``index_topk``.  The attention then runs dense: eager (and sdpa) fold the unselected
keys into the mask (``index_mask``), so FlopCounterMode counts the full S x S QKᵀ and AV as for DeepSeek-V3.  Our
totals count what transformers computes; ``flops.sparse_attention_flops`` states the sparse meaning (each query's
Σ min(i+1, k) attended pairs), checked here against the mask transformers' eager attention receives.

Method: parameters by name on meta (``build_hf``) at the published widths (``DeepseekV32Config``'s and
``GlmMoeDsaConfig``'s defaults, which their docstrings name as deepseek-ai/DeepSeek-V3.2-Exp and zai-org/GLM-5; not a
downloaded config.json) with 4 layers (1 dense), and at the full 61 and 78 layers by hand; forward FLOPs with
FlopCounterMode module by module on meta at 1,024 and 4,096 tokens (below and above index_topk = 2,048; the
packed-sequence check's ``.item()`` patched, ``meta_masks``), and on small real CPU tensors (index_topk = 8; two
sequences of 6 and of 20 tokens, below and above it).
"""

import json
from collections import defaultdict

import pytest

from lm_accounting.analytic.flops import (
    attended_pairs,
    forward_flops,
    indexer_flops,
    sparse_attention_flops,
    training_flops,
)
from lm_accounting.analytic.hf_tensors import hf_parameter_tensor_sizes
from lm_accounting.analytic.params import parameter_breakdown
from lm_accounting.config import AccountingError, ConfigError, ModelConfig
from lm_accounting.hf_config import config_from_hf, to_hf_dict
from lm_accounting.model import build_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_components import (
    LLAMA_PREFIX,
    LLAMA_TOP,
    assert_parameters_equal,
    cpu_forward_flops,
    cpu_model,
    layer_keys,
)
from test_transformers_truth import build_hf, hf_forward_flops, meta_masks  # noqa: F401

# the published widths: DeepseekV32Config's and GlmMoeDsaConfig's defaults written out (transformers 5.24), 61 and 78
# layers with the first 3 dense
DEEPSEEK_V32 = {
    "model_type": "deepseek_v32",
    "vocab_size": 129280,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_shared_experts": 1,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "qk_nope_head_dim": 128,
    "n_group": 8,
    "topk_group": 4,
    "first_k_dense_replace": 3,
    "max_position_embeddings": 163840,
    "index_topk": 2048,
    "index_head_dim": 128,
    "index_n_heads": 64,
}
GLM_5 = {
    "model_type": "glm_moe_dsa",
    "vocab_size": 154880,
    "hidden_size": 6144,
    "intermediate_size": 12288,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 78,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "n_shared_experts": 1,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "kv_lora_rank": 512,
    "q_lora_rank": 2048,
    "qk_rope_head_dim": 64,
    "v_head_dim": 256,
    "qk_nope_head_dim": 192,
    "first_k_dense_replace": 3,
    "max_position_embeddings": 202752,
    "index_topk": 2048,
    "index_head_dim": 128,
    "index_n_heads": 32,
}
FULL = {"deepseek-v3.2": DEEPSEEK_V32, "glm-5": GLM_5}
CONFIGS = {name: {**v, "num_hidden_layers": 4, "first_k_dense_replace": 1} for name, v in FULL.items()}
# GLM-5's shared top-k (indexer_types from index_topk_freq 4 and index_skip_topk_offset 3, the schedule of a later GLM-5
# release as public copies of its config give it; illustrative here): 8 layers, F F F S S S F S
CONFIGS["glm-5-shared"] = {**GLM_5, "num_hidden_layers": 8, "index_topk_freq": 4, "index_skip_topk_offset": 3}
TINY = {  # small real tensors: index_topk 8
    "vocab_size": 101,
    "hidden_size": 64,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 3,
    "first_k_dense_replace": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_group": 1,
    "topk_group": 1,
    "kv_lora_rank": 16,
    "q_lora_rank": 24,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 12,
    "max_position_embeddings": 64,
    "index_topk": 8,
    "index_head_dim": 16,
    "index_n_heads": 4,
}
TINY_CONFIGS = {
    "tiny-deepseek-v3.2": {"model_type": "deepseek_v32", **TINY},
    "tiny-glm-5": {"model_type": "glm_moe_dsa", **TINY},
    # 4 layers, indexer_types F S F S (index_topk_freq 2, index_skip_topk_offset 1)
    "tiny-glm-5-shared": {
        "model_type": "glm_moe_dsa",
        **TINY,
        "num_hidden_layers": 4,
        "index_topk_freq": 2,
        "index_skip_topk_offset": 1,
    },
}

LAYER_MAP = {  # transformers' module (or parameter) inside a layer -> our component keys
    "self_attn.q_a_proj": ("attn.q_a_proj",),
    "self_attn.q_a_layernorm": ("attn.q_a_norm",),
    "self_attn.q_b_proj": ("attn.q_b_proj",),
    "self_attn.kv_a_proj_with_mqa": ("attn.kv_a_proj",),
    "self_attn.kv_a_layernorm": ("attn.kv_a_norm",),
    "self_attn.kv_b_proj": ("attn.kv_b_proj",),
    "self_attn.o_proj": ("attn.output_proj",),
    "self_attn.indexer.wq_b": ("attn.indexer.q_proj",),
    "self_attn.indexer.wk": ("attn.indexer.k_proj",),
    "self_attn.indexer.k_norm": ("attn.indexer.k_norm",),
    "self_attn.indexer.k_norm.bias": ("attn.indexer.k_norm",),
    "self_attn.indexer.weights_proj": ("attn.indexer.weights_proj",),
    "input_layernorm": ("ln1",),
    "post_attention_layernorm": ("ln2",),
    "mlp.gate_proj": ("ffn.w1",),
    "mlp.up_proj": ("ffn.w3",),
    "mlp.down_proj": ("ffn.w2",),
    "mlp.gate": ("moe.router",),
    "mlp.experts": ("moe.experts.w1", "moe.experts.w3", "moe.experts.w2"),
    "mlp.experts.gate_up_proj": ("moe.experts.w1", "moe.experts.w3"),
    "mlp.experts.down_proj": ("moe.experts.w2",),
    "mlp.shared_experts.gate_proj": ("moe.shared.w1",),
    "mlp.shared_experts.up_proj": ("moe.shared.w3",),
    "mlp.shared_experts.down_proj": ("moe.shared.w2",),
}
TOP, PREFIX = LLAMA_TOP, LLAMA_PREFIX
our_keys = layer_keys(LAYER_MAP)


@pytest.fixture(scope="module")
def models():
    return {name: build_hf(values) for name, values in CONFIGS.items()}


# -- parameters ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", CONFIGS)
def test_parameters_equal_transformers(name, models):
    cfg = config_from_hf(CONFIGS[name], name=name)
    model = models[name]
    assert_parameters_equal(cfg, model, our_keys)


@pytest.mark.parametrize("name", CONFIGS)
def test_transformers_parameter_tensors(name, models):
    """Each tensor's numel in ``model.parameters()`` order (the indexer's five after o_proj)."""
    cfg = config_from_hf(CONFIGS[name])
    assert hf_parameter_tensor_sizes(cfg) == [p.numel() for p in models[name].parameters()]


def indexer_by_hand(d: int, r_q: int, heads: int, dim: int) -> int:
    """wq_b, wk, k_norm (weight and bias), weights_proj (DeepseekV32Indexer.__init__)."""
    return r_q * heads * dim + d * dim + 2 * dim + d * heads


def deepseek_v32_by_hand() -> int:
    """DeepSeek-V3.2 at the class's widths, from modeling_deepseek_v32.py: embeddings and head, per layer the latent
    attention (q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj), two
    RMSNorms and the indexer, 3 dense SwiGLU MLPs, 58 MoE blocks (router, 256 experts, one shared), the final norm."""
    d, h, V, L = 7168, 128, 129280, 61
    mla = d * 1536 + 1536 + 1536 * h * 192 + d * (512 + 64) + 512 + 512 * h * (128 + 128) + h * 128 * d
    dense = 3 * d * 18432
    moe = 256 * d + 256 * 3 * d * 2048 + 3 * d * 2048  # router (its score bias a buffer), experts, shared
    return 2 * V * d + L * (mla + 2 * d + indexer_by_hand(d, 1536, 64, 128)) + 3 * dense + 58 * moe + d


def test_parameters_by_hand():
    """The full models: the sum above, and DeepSeek-V3's count plus one indexer per layer; the indexer of
    DeepSeek-V3.2 is 13,959,424 parameters a layer, GLM-5's 9,371,904 (wq_b, wk, k_norm, weights_proj)."""
    assert indexer_by_hand(7168, 1536, 64, 128) == 1536 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64 == 13_959_424
    assert indexer_by_hand(6144, 2048, 32, 128) == 2048 * 32 * 128 + 6144 * 128 + 2 * 128 + 6144 * 32 == 9_371_904
    total = deepseek_v32_by_hand()
    assert parameter_breakdown(config_from_hf(DEEPSEEK_V32)).total == total
    v3 = {k: v for k, v in DEEPSEEK_V32.items() if not k.startswith("index_")}
    assert total - parameter_breakdown(config_from_hf({**v3, "model_type": "deepseek_v3"})).total == 61 * 13_959_424


def test_full_models_are_the_reduced_ones_plus_their_layers(models):
    """61 and 78 layers (3 dense): the 4-layer model transformers built (1 dense) plus 2 more of its dense layer and
    55 and 72 more of its MoE layer."""
    for name, full in FULL.items():
        small = parameter_breakdown(config_from_hf(CONFIGS[name]))
        moe_layer = sum(p.numel() for n, p in models[name].named_parameters() if n.startswith("model.layers.3."))
        more = full["num_hidden_layers"] - 4 - (full["first_k_dense_replace"] - 1)
        dense_layer = sum(p.numel() for n, p in models[name].named_parameters() if n.startswith("model.layers.0."))
        extra = more * moe_layer + (full["first_k_dense_replace"] - 1) * dense_layer
        assert parameter_breakdown(config_from_hf(full)).total == small.total + extra


# -- forward FLOPs ------------------------------------------------------------------------------------------------
def assert_equal_by_module(counted: dict[str, int], fwd) -> None:
    """The total, every mapped module, the attention's own FLOPs (its module less its children: eager QKᵀ and AV
    over the full square) and the indexer's own (less wq_b, wk, weights_proj: its scores and head sum)."""
    assert counted["total"] == fwd.total, (counted["total"], fwd.total)
    by_keys: dict[tuple[str, ...], int] = defaultdict(int)
    own = {"self_attn": 0, "self_attn.indexer": 0}
    for module, flops in counted.items():
        if module in TOP:
            by_keys[our_keys(module)] += flops
        elif module.startswith(PREFIX) and module.count(".") > 2:
            inner = module[len(PREFIX) :].partition(".")[2]
            if inner in own:
                depth = module.count(".") + 1
                children = sum(v for k, v in counted.items() if k.startswith(module + ".") and k.count(".") == depth)
                own[inner] += flops - children
            elif inner in LAYER_MAP:
                by_keys[our_keys(module)] += flops
    cores = {"layers.*.attn.qk", "layers.*.attn.av", "layers.*.attn.indexer.qk", "layers.*.attn.indexer.head_sum"}
    assert {k for keys in by_keys for k in keys} == {it.key for it in fwd} - cores
    for keys, flops in by_keys.items():
        assert sum(fwd[k].total for k in keys) == flops, (keys, flops)
    assert own["self_attn"] == fwd["layers.*.attn.qk"].total + fwd["layers.*.attn.av"].total
    assert (
        own["self_attn.indexer"] == fwd["layers.*.attn.indexer.qk"].total + fwd["layers.*.attn.indexer.head_sum"].total
    )


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("seq", [1024, 4096])
def test_forward_flops_equal_transformers_on_meta(name, seq, models, meta_masks):  # noqa: F811
    """The published widths on meta at 1,024 and 4,096 tokens: below and above index_topk = 2,048."""
    cfg = config_from_hf(CONFIGS[name], name=name).with_context(seq)
    assert_equal_by_module(hf_forward_flops(models[name], seq), forward_flops(cfg, seq))


@pytest.fixture(scope="module")
def tiny_models():
    return {name: cpu_model(values) for name, values in TINY_CONFIGS.items()}


@pytest.mark.parametrize("name", TINY_CONFIGS)
@pytest.mark.parametrize("seq", [6, 20])
def test_forward_flops_equal_transformers_on_cpu(name, seq, tiny_models):
    """Real tensors, two sequences, at 6 and 20 tokens (index_topk 8): the real top-k and scatter run."""
    cfg = config_from_hf(TINY_CONFIGS[name], name=name)
    assert_equal_by_module(cpu_forward_flops(tiny_models[name], 2, seq), forward_flops(cfg, seq, 2))


@pytest.mark.parametrize("seq", [6, 20])
def test_sparse_meaning_is_the_pairs_the_mask_keeps(seq, tiny_models, monkeypatch):
    """``sparse_attention_flops``: the (query, key) pairs transformers' eager attention leaves unmasked after the
    indexer's top-k (counted in the mask it receives, every layer and sequence) are Σ min(i+1, k) per sequence
    and layer, and the sparse FLOPs are 2·(d_qk + d_v)·h per pair."""
    import transformers.models.deepseek_v32.modeling_deepseek_v32 as dsv32

    kept = []
    real = dsv32.eager_attention_forward

    def counting(module, query, key, value, attention_mask, **kwargs):
        kept.append(int((attention_mask == 0).sum()))  # additive mask: 0 kept, the dtype's min masked
        return real(module, query, key, value, attention_mask, **kwargs)

    monkeypatch.setattr(dsv32, "eager_attention_forward", counting)
    cpu_forward_flops(tiny_models["tiny-deepseek-v3.2"], 2, seq)
    cfg = config_from_hf(TINY_CONFIGS["tiny-deepseek-v3.2"])
    assert kept == [2 * attended_pairs(seq, 8)] * cfg.num_layers
    assert attended_pairs(6, 8) == 6 * 7 // 2 and attended_pairs(20, 8) == 8 * 9 // 2 + 12 * 8
    assert sparse_attention_flops(cfg, seq, 2) == sum(kept) * 2 * (24 + 12) * 4


def test_indexer_flops_by_hand():
    """DeepSeek-V3.2 at S = 4,096, one sequence, per layer: the projections 2·S·(r_q·H·d_I + d·d_I + d·H), the
    scores 2·H·S²·d_I and the head sum 2·S²·H (the S² terms: every key, as transformers computes them)."""
    cfg = config_from_hf(DEEPSEEK_V32)
    S, d, r, H, dI = 4096, 7168, 1536, 64, 128
    fwd = forward_flops(cfg, S)
    assert fwd["layers.*.attn.indexer.qk"].per_layer == 2 * H * S * S * dI
    assert fwd["layers.*.attn.indexer.head_sum"].per_layer == 2 * S * S * H
    per_layer = 2 * S * (r * H * dI + d * dI + d * H) + 2 * H * S * S * dI + 2 * S * S * H
    assert indexer_flops(cfg, S) == 61 * per_layer


def test_training_flops_leave_out_the_indexers_backward():
    """transformers runs the indexer under torch.no_grad(): the step is 3 x the forward less 2 x the indexer's,
    and PaLM's estimate, corrected for it, still equals the step."""
    cfg = config_from_hf(CONFIGS["deepseek-v3.2"])
    t = training_flops(cfg, 1024)
    assert t.backward == 2 * (t.forward - indexer_flops(cfg, 1024))
    assert t.palm == t.step


def test_the_indexer_trains_nothing_in_transformers():
    """The indexer's parameters get no gradient from a training step's loss (what the no-backward convention
    rests on)."""
    model = cpu_model(TINY_CONFIGS["tiny-deepseek-v3.2"])
    ids = torch.randint(0, 101, (1, 12), generator=torch.Generator().manual_seed(2))
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    grads = {n: p.grad is not None for n, p in model.named_parameters()}
    assert not any(g for n, g in grads.items() if ".indexer." in n)
    assert all(g for n, g in grads.items() if ".indexer." not in n)


# -- reading, writing, refusing -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", TINY_CONFIGS)
def test_written_config_builds_the_same_model(name):
    """``to_hf_dict`` (what ``--impl transformers`` builds) gives transformers' class the same indexer."""
    cfg = config_from_hf(TINY_CONFIGS[name])
    written = to_hf_dict(cfg)
    assert config_from_hf(written) == cfg
    model = build_hf(written)
    assert sum(p.numel() for p in model.parameters()) == parameter_breakdown(cfg).total


def test_glm_indexer_schedule():
    """GLM-5's schedule as ``GlmMoeDsaConfig.__post_init__`` derives it: the default (index_topk_freq 1) is an
    indexer in every layer; freq 2 with offset 1 is full, shared, full (what transformers derives too); a schedule
    whose first layer is shared is refused in one line."""
    base = {"model_type": "glm_moe_dsa", **TINY}
    cfg = config_from_hf({**base, "indexer_types": ["full"] * 3})
    assert cfg == config_from_hf(base) == config_from_hf({**base, "index_topk_pattern": "FFF"})
    assert cfg.indexer_pattern is None and transformers.AutoConfig.for_model(**base).indexer_types == ["full"] * 3
    for shared in ({"indexer_types": ["full", "shared", "full"]}, {"index_topk_pattern": "FSF"}):
        assert config_from_hf({**base, **shared}).indexer_pattern == "FSF"
    every = {"index_topk_freq": 2, "index_skip_topk_offset": 1}
    assert config_from_hf({**base, **every}).indexer_pattern == "FSF"
    assert transformers.AutoConfig.for_model(**base, **every).indexer_types == ["full", "shared", "full"]
    for bad in ({"index_topk_pattern": "SFF"}, {"indexer_types": ["full", "shared"]}, {"index_topk_pattern": "FXF"}):
        with pytest.raises(ConfigError, match="must give 'full' or 'shared' for each of the 3 layers, the first"):
            config_from_hf({**base, **bad})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"index_n_heads": None}, "field 'index_n_heads'"),
        ({"index_head_dim": "128"}, "field 'index_head_dim'"),
        ({"index_topk": 0}, "field 'index_topk'"),
        ({"q_lora_rank": None}, "field 'q_lora_rank' = null is not supported"),
        ({"layer_types": ["full_attention"] * 3}, "field 'layer_types' is not supported"),
        ({"index_head_dim": 4}, "index_head_dim = 4 is narrower than its RoPE part"),
    ],
)
def test_a_bad_indexer_is_one_line(change, message, run_cli, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "deepseek_v32", **TINY, **change}))
    r = run_cli("account", path)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and message in r.err, r.err


def test_indexer_fields_are_all_or_none():
    base = dict(
        vocab_size=97, context_length=64, num_layers=2, d_model=32, num_heads=4, d_ff=48, kv_lora_rank=8,
        q_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
    )  # fmt: skip
    with pytest.raises(ConfigError, match="needs index_head_dim"):
        ModelConfig(**base, index_heads=4)
    with pytest.raises(ConfigError, match="latent attention with a query bottleneck"):
        ModelConfig(**{**base, "q_lora_rank": None}, index_heads=4, index_head_dim=8, index_topk=4)


def test_account_and_memory_run(run_cli, tmp_path):
    """``account`` gives the totals; ``memory`` gives transformers' replayed step (``ops.transformers.deepseek_v32``,
    tests/test_ops_transformers_dsa.py), and under the course convention the model states with the reason (the live
    model has no indexer, and refuses to be built)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(DEEPSEEK_V32))
    r = run_cli("account", path, "--format", "json", "--context", 4096)
    assert r.code == 0, r.err
    out = json.loads(r.out)
    assert out["parameters"]["total"] == deepseek_v32_by_hand()
    r = run_cli("memory", path, "--context", 1024)
    assert r.code == 0 and "model states only" not in r.out and "step peak" in r.out, r.err
    r = run_cli("memory", path, "--context", 1024, "--impl", "course")
    assert r.code == 0 and "model states only" in r.out and "a sparse-attention indexer (the live" in r.out, r.err
    with pytest.raises(AccountingError, match="no sparse-attention indexer"):
        build_model(config_from_hf(CONFIGS["deepseek-v3.2"]))


# -- the training step and the cache ------------------------------------------------------------------------------
def test_model_states_leave_out_the_indexer():
    """No gradient reaches the indexer (above), so AdamW keeps no gradient, m or v for it: the trained tensors are
    transformers' parameters less the indexer's five per layer."""
    from lm_accounting.analytic.params import frozen_parameter_count

    cfg = config_from_hf(TINY_CONFIGS["tiny-deepseek-v3.2"])
    model = cpu_model(TINY_CONFIGS["tiny-deepseek-v3.2"])
    indexer = [p.numel() for n, p in model.named_parameters() if ".indexer." in n]
    assert frozen_parameter_count(cfg) == sum(indexer) == 3 * indexer_by_hand(64, 24, 4, 16)
    trained = [p.numel() for n, p in model.named_parameters() if ".indexer." not in n]
    assert hf_parameter_tensor_sizes(cfg, trained=True) == trained


def test_hardware_step_flops_leave_out_the_indexers_backward():
    from lm_accounting.analytic.hardware_flops import step_flops

    cfg = config_from_hf(CONFIGS["deepseek-v3.2"])
    f = step_flops(cfg, 1024)
    assert f.hardware == f.model - 2 * indexer_flops(cfg, 1024) == training_flops(cfg, 1024).step


@pytest.mark.parametrize(("dtype", "name"), [(torch.float32, "fp32"), (torch.bfloat16, "bf16")])
def test_cache_equals_transformers_after_a_prefill(dtype, name):
    """Every layer's ``DynamicIndexedLayer``: the latent and RoPE key (B, 1, P, r_kv) and (B, 1, P, d_rope), and
    the indexer's keys (B, P, d_I), in the model's dtype: the bytes of every tensor of transformers' cache."""
    from lm_accounting.analytic.memory import kv_cache_bytes

    values = TINY_CONFIGS["tiny-deepseek-v3.2"]
    cfg = config_from_hf(values)
    model = cpu_model(values).to(dtype)
    B, P = 2, 13
    ids = torch.randint(0, 101, (B, P), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).past_key_values
    held = sum(
        t.numel() * t.element_size() for layer in cache.layers for t in vars(layer).values() if torch.is_tensor(t)
    )
    assert {tuple(t.shape) for t in vars(cache.layers[0]).values() if torch.is_tensor(t)} == {
        (B, 1, P, 16),
        (B, 1, P, 8),
        (B, P, 16),
    }
    assert held == kv_cache_bytes(cfg, P, B, name) == 3 * B * P * (16 + 8 + 16) * (4 if name == "fp32" else 2)


def test_infer_runs_and_an_engine_is_refused(run_cli, tmp_path):
    """transformers' programs (generate, forward) run; an engine's (the default) and its pool are refused: their
    sparse kernels and fp8 indexer cache are not modelled."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(DEEPSEEK_V32))
    r = run_cli("infer", path, "--prompt", "128", "--generate", "16", "--program", "generate")
    assert r.code == 0, r.err
    r = run_cli("infer", path, "--prompt", "128", "--generate", "16")  # the default program: engine
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "--program generate" in r.err, r.err
    r = run_cli("infer", path, "--prompt", "128", "--generate", "16", "--engine", "vllm")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "DeepSeek Sparse Attention" in r.err, r.err


def test_a_decode_step_and_a_cached_prefill_equal_transformers():
    """With transformers' cache, counted: the prefill is ``prefill_flops``; a decode step at p = 13 scores its query
    against the p + 1 cached indexer keys (2·B·H_I·(p+1)·d_I and 2·B·(p+1)·H_I a layer) and attends, expanding the
    p + 1 cached latents, as ``decode_flops`` says."""
    from torch.utils.flop_counter import FlopCounterMode

    from lm_accounting.analytic.inference import decode_flops, prefill_flops

    cfg = config_from_hf(TINY_CONFIGS["tiny-deepseek-v3.2"])
    model = cpu_model(TINY_CONFIGS["tiny-deepseek-v3.2"])
    B, P = 2, 13
    ids = torch.randint(0, 101, (B, P + 1), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        with FlopCounterMode(display=False) as prefill:
            cache = model(input_ids=ids[:, :P], use_cache=True).past_key_values
        with FlopCounterMode(display=False) as decode:
            model(input_ids=ids[:, P:], cache=cache, use_cache=True)
    assert prefill.get_total_flops() == prefill_flops(cfg, P, B, P + 1).total
    step = decode_flops(cfg, P, B, P + 1)
    assert decode.get_total_flops() == step.total
    assert step["layers.*.attn.indexer.qk"].total == 3 * 2 * B * 4 * (P + 1) * 16
    assert step["layers.*.attn.indexer.head_sum"].total == 3 * 2 * B * (P + 1) * 4


def test_a_hub_style_file_is_read():
    """DeepSeek-V3's published config.json fields beside the indexer's (fp8 quantization, YaRN, the MTP layer,
    routing and auxiliary-loss fields): ignored and listed, the same model (written from DeepSeek-V3's file and the
    class's fields, not a downloaded DeepSeek-V3.2 file)."""
    extra = {
        "architectures": ["DeepseekV32ForCausalLM"],
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8"},
        "rope_scaling": {"factor": 40, "original_max_position_embeddings": 4096, "type": "yarn"},
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "moe_layer_freq": 1,
        "num_nextn_predict_layers": 1,
        "routed_scaling_factor": 2.5,
        "torch_dtype": "bfloat16",
    }
    cfg = config_from_hf({**DEEPSEEK_V32, **extra})
    assert cfg == config_from_hf(DEEPSEEK_V32)
    assert set(cfg.ignored_fields) == set(extra) - {"moe_layer_freq"}


# -- GLM-5's shared top-k ------------------------------------------------------------------------------------------
def test_shared_layers_have_no_indexer(models):
    """F F F S S S F S: the indexer's components on the 4 F layers only (L_idx), in transformers' model as ours."""
    cfg = config_from_hf(CONFIGS["glm-5-shared"])
    assert cfg.indexer_pattern == "FFFSSSFS" and cfg.indexer_layers == 4
    assert models["glm-5-shared"].config.indexer_types == ["full"] * 3 + ["shared"] * 3 + ["full", "shared"]
    built = {n.split(".")[2] for n, _ in models["glm-5-shared"].named_parameters() if ".indexer." in n}
    assert built == {"0", "1", "2", "6"}
    bd = parameter_breakdown(cfg)
    assert bd["layers.*.attn.indexer.q_proj"].formula.startswith("L_idx·")
    assert bd["layers.*.attn.indexer.q_proj"].total == 4 * 2048 * 32 * 128
    assert indexer_flops(cfg, 1024) == indexer_flops(config_from_hf(CONFIGS["glm-5"]), 1024)  # 4 indexers in both


def test_shared_cache_equals_transformers_after_a_prefill():
    """A shared layer caches the latent and RoPE key but no indexer key: the bytes of every tensor of transformers'
    cache after a prefill."""
    from lm_accounting.analytic.memory import kv_cache_bytes

    values = TINY_CONFIGS["tiny-glm-5-shared"]
    cfg = config_from_hf(values)
    model = cpu_model(values)
    B, P = 2, 11
    ids = torch.randint(0, 101, (B, P), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).past_key_values
    held = [
        sum(t.numel() * t.element_size() for t in vars(layer).values() if torch.is_tensor(t)) for layer in cache.layers
    ]
    assert held == [B * P * (16 + 8 + (16 if c == "F" else 0)) * 4 for c in "FSFS"]
    assert sum(held) == kv_cache_bytes(cfg, P, B, "fp32")


def test_shared_layers_in_infer_are_refused_in_one_line(run_cli, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIGS["glm-5-shared"]))
    r = run_cli("infer", path, "--prompt", "128", "--generate", "16", "--program", "generate")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "layers without an indexer" in r.err, r.err
    assert run_cli("account", path).code == 0 and run_cli("memory", path, "--context", 1024).code == 0
