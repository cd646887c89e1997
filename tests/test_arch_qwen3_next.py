"""Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5): parameters, forward FLOPs and the inference cache, exact against
transformers 5.24.

transformers' models/qwen3_next/modeling_qwen3_next.py (and models/qwen3_5*/): every ``full_attention_interval``-th
layer (``layer_types``) has gated attention (``q_proj`` twice as wide; ``o_proj(attn · σ(gate))``), per-head q/k
norms and RoPE on a quarter of each head; the others a ``Qwen3NextGatedDeltaNet``: ``in_proj_qkvz`` and
``in_proj_ba`` (Qwen3.5: ``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``), a depthwise causal conv1d,
``dt_bias``, ``A_log``, the chunked gated delta rule, a gated RMSNorm and ``out_proj``.  The MLP is Qwen2-MoE's
(routed experts and a sigmoid-gated shared expert; Qwen3.5 dense: a SwiGLU).

Method: parameters by name on meta (``build_hf``) at the published sizes; forward FLOPs with FlopCounterMode module
by module, on meta at the published sizes at 1,024 and 4,096 tokens (the torch path of the rule runs on meta once the
packed-sequence check's ``.item()`` is patched, ``meta_masks``), and on small real CPU tensors at 64 and 100 tokens
(a chunk multiple and not) with two sequences; a decode step and the cache against the ``DynamicCache`` transformers
returns after a prefill, on CPU.

Qwen/Qwen3-Next-80B-A3B-Instruct's config.json: the fields from ``architectures`` to ``moe_intermediate_size`` (but
the token ids) as a search excerpt of the hub file shows them; the rest (vocabulary, heads, experts, top-k, shared
width, RoPE) could not be read offline and are written as the file is remembered, equal to ``Qwen3NextConfig``'s
defaults where it has one (vocab 151,936, 16 heads, 2 KV heads, 512 experts, top-10, 512 shared, factor 0.25); the
model card's layout ("48 layers, hidden 2048, 12 × (3 Gated DeltaNet + 1 gated attention)") and totals ("80B in
total and 3B activated", "79B non-embedding", checked below) agree with them.
Qwen3.5-35B-A3B and the Qwen3.5 dense text model are ``Qwen3_5MoeTextConfig``'s and ``Qwen3_5TextConfig``'s own
defaults (their docstrings name those checkpoints), not a downloaded file; the MoE one is written in a
``qwen3_5_moe`` wrapper with ``rope_parameters`` in the multimodal form the class accepts (``mrope_section`` and
``mrope_interleaved``, in ``ignore_keys_at_rope_validation``; illustrative values, ignored by the reader).
"""

import json
from collections import defaultdict

import pytest

from lm_accounting.analytic.flops import (
    causal_conv_flops,
    conv_update_flops,
    forward_flops,
    gated_delta_flops,
    training_flops,
)
from lm_accounting.analytic.inference import decode_flops, layer_slots
from lm_accounting.analytic.memory import kv_cache_bytes
from lm_accounting.analytic.params import active_parameter_count, parameter_breakdown
from lm_accounting.config import ConfigError, ModelConfig
from lm_accounting.hf_config import config_from_hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_components import (
    LLAMA_PREFIX,
    LLAMA_TOP,
    assert_parameters_equal,
    cpu_forward_flops,
    cpu_model,
    hybrid_cache_after_prefill,
    layer_keys,
)
from test_transformers_truth import build_hf, hf_forward_flops, meta_masks  # noqa: F401

QWEN3_NEXT = {  # Qwen/Qwen3-Next-80B-A3B-Instruct/config.json (see the module docstring)
    "architectures": ["Qwen3NextForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151645,
    "full_attention_interval": 4,
    "head_dim": 256,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 5120,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_value_head_dim": 128,
    "max_position_embeddings": 262144,
    "mlp_only_layers": [],
    "model_type": "qwen3_next",
    "moe_intermediate_size": 512,
    "norm_topk_prob": True,
    "num_attention_heads": 16,
    "num_experts": 512,
    "num_experts_per_tok": 10,
    "num_hidden_layers": 48,
    "num_key_value_heads": 2,
    "output_router_logits": False,
    "partial_rotary_factor": 0.25,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 10000000,
    "router_aux_loss_coef": 0.001,
    "shared_expert_intermediate_size": 512,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 151936,
}
QWEN3_5_MOE = {  # the qwen3_5_moe config.json of the 35B-A3B checkpoints (Qwen3.5/3.6-35B-A3B), as copies of it in public
    # repositories give it: Qwen3_5MoeTextConfig's defaults but for its 262,144-token context and rope_theta 10⁷
    "model_type": "qwen3_5_moe",
    "tie_word_embeddings": False,
    "vision_config": {"model_type": "qwen3_5_moe_vision", "depth": 27},
    "image_token_id": 248056,
    "text_config": {
        "model_type": "qwen3_5_moe_text",
        "vocab_size": 248320,
        "hidden_size": 2048,
        "num_hidden_layers": 40,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "max_position_embeddings": 262144,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "num_experts": 256,
        "num_experts_per_tok": 8,
        "full_attention_interval": 4,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
            "mrope_interleaved": True,
            "mrope_section": [11, 11, 10],
        },
    },
}
QWEN3_5_TEXT = {  # Qwen3_5TextConfig's defaults, every field written out
    "model_type": "qwen3_5_text",
    "vocab_size": 248320,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 32,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "max_position_embeddings": 32768,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
}
QWEN3_5 = {"model_type": "qwen3_5", "tie_word_embeddings": False, "text_config": QWEN3_5_TEXT}  # the wrapper
CONFIGS = {
    "qwen3-next-80b-a3b": QWEN3_NEXT,
    "qwen3.5-35b-a3b": QWEN3_5_MOE,
    "qwen3.5-text": QWEN3_5_TEXT,
    "qwen3.5": QWEN3_5,
}

TINY = {  # small enough for real CPU tensors: layers 3 and 7 full attention, every other layer a MoE
    "model_type": "qwen3_next",
    "vocab_size": 97,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 12,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 24,
    "shared_expert_intermediate_size": 40,
    "decoder_sparse_step": 2,
    "max_position_embeddings": 512,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"],
}
TINY_CONFIGS = {
    "tiny-qwen3-next": TINY,
    "tiny-qwen3.5": {
        **{k: v for k, v in TINY.items() if "expert" not in k and k not in ("decoder_sparse_step", "layer_types")},
        "model_type": "qwen3_5_text",
        "full_attention_interval": 2,
    },
    "tiny-qwen3.5-moe": {
        **{k: v for k, v in TINY.items() if k not in ("decoder_sparse_step", "intermediate_size", "layer_types")},
        "model_type": "qwen3_5_moe_text",
    },
}

LAYER_MAP = {
    "self_attn.q_proj": ("attn.q_proj", "attn.q_gate"),  # the query and its output gate, one Linear
    "self_attn.k_proj": ("attn.k_proj",),
    "self_attn.v_proj": ("attn.v_proj",),
    "self_attn.o_proj": ("attn.output_proj",),
    "self_attn.q_norm": ("attn.q_norm",),
    "self_attn.k_norm": ("attn.k_norm",),
    "linear_attn.in_proj_qkvz": ("linear_attn.in_proj_qkv", "linear_attn.in_proj_z"),
    "linear_attn.in_proj_ba": ("linear_attn.in_proj_b", "linear_attn.in_proj_a"),
    "linear_attn.in_proj_qkv": ("linear_attn.in_proj_qkv",),
    "linear_attn.in_proj_z": ("linear_attn.in_proj_z",),
    "linear_attn.in_proj_b": ("linear_attn.in_proj_b",),
    "linear_attn.in_proj_a": ("linear_attn.in_proj_a",),
    "linear_attn.conv1d": ("linear_attn.conv1d",),
    "linear_attn.dt_bias": ("linear_attn.dt_bias",),
    "linear_attn.A_log": ("linear_attn.A_log",),
    "linear_attn.norm": ("linear_attn.norm",),
    "linear_attn.out_proj": ("linear_attn.out_proj",),
    "input_layernorm": ("ln1",),
    "post_attention_layernorm": ("ln2",),
    "mlp.gate_proj": ("ffn.w1",),
    "mlp.up_proj": ("ffn.w3",),
    "mlp.down_proj": ("ffn.w2",),
    "mlp.gate": ("moe.router",),
    "mlp.experts": ("moe.experts.w1", "moe.experts.w3", "moe.experts.w2"),
    "mlp.experts.gate_up_proj": ("moe.experts.w1", "moe.experts.w3"),
    "mlp.experts.down_proj": ("moe.experts.w2",),
    "mlp.shared_expert.gate_proj": ("moe.shared.w1",),
    "mlp.shared_expert.up_proj": ("moe.shared.w3",),
    "mlp.shared_expert.down_proj": ("moe.shared.w2",),
    "mlp.shared_expert_gate": ("moe.shared_gate",),
}
TOP, PREFIX = LLAMA_TOP, LLAMA_PREFIX
our_keys = layer_keys(LAYER_MAP)


def hf_values(values: dict) -> dict:
    """A wrapper's text model as transformers' causal LM (``AutoModelForCausalLM`` builds the text model)."""
    return values.get("text_config", values)


@pytest.fixture(scope="module")
def models():
    return {name: build_hf(hf_values(values)) for name, values in CONFIGS.items()}


@pytest.mark.parametrize("name", CONFIGS)
def test_parameters_equal_transformers(name, models):
    cfg = config_from_hf(CONFIGS[name], name=name)
    model = models[name]
    assert_parameters_equal(cfg, model, our_keys)


def test_published_totals():
    """Qwen3-Next-80B-A3B's model card: "80B in total and 3B activated", "Number of Parameters (Non-Embedding):
    79B"; Qwen3.5-35B-A3B's name (its card is not quoted here): 35B, 3B activated (with the embeddings)."""
    cfg = config_from_hf(QWEN3_NEXT)
    total, embeddings = parameter_breakdown(cfg).total, 2 * 151936 * 2048
    assert f"{total / 1e9:.0f}B" == "80B" and f"{(total - embeddings) / 1e9:.0f}B" == "79B"
    assert f"{(active_parameter_count(cfg) - embeddings) / 1e9:.0f}B" == "3B"
    moe = config_from_hf(QWEN3_5_MOE)
    assert f"{parameter_breakdown(moe).total / 1e9:.0f}B" == "35B"
    assert f"{active_parameter_count(moe) / 1e9:.0f}B" == "3B"


def test_parameters_by_hand():
    """One Gated DeltaNet layer and one attention layer of Qwen3-Next-80B-A3B, from modeling_qwen3_next.py."""
    d, hk, hv, dk, dv, K = 2048, 16, 32, 128, 128, 4
    conv_dim = 2 * hk * dk + hv * dv
    linear = d * (2 * hk * dk + 2 * hv * dv) + d * 2 * hv + conv_dim * K + 2 * hv + dv + hv * dv * d
    h, kv, hd = 16, 2, 256
    attention = d * 2 * h * hd + 2 * d * kv * hd + h * hd * d + 2 * hd
    moe = 512 * d + 512 * 3 * d * 512 + 3 * d * 512 + d
    total = 2 * 151936 * d + 36 * linear + 12 * attention + 48 * (moe + 2 * d) + d
    assert parameter_breakdown(config_from_hf(QWEN3_NEXT)).total == total == 79_674_391_296


# -- forward FLOPs on real CPU tensors ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_models():
    return {name: cpu_model(values) for name, values in TINY_CONFIGS.items()}


def assert_equal_by_module(counted: dict[str, int], fwd) -> None:
    """The total, every mapped module, and each mixer's own FLOPs (its module less its children): attention's
    eager QKᵀ and AV, the Gated DeltaNet's conv and chunked rule."""
    assert counted["total"] == fwd.total, (counted["total"], fwd.total)
    by_keys: dict[tuple[str, ...], int] = defaultdict(int)
    own = {"self_attn": 0, "linear_attn": 0}
    for module, flops in counted.items():
        module = module.replace("model.language_model.", "model.")
        if module in TOP:
            by_keys[our_keys(module)] += flops
        elif module.startswith(PREFIX) and module.count(".") > 2:
            inner = module[len(PREFIX) :].partition(".")[2]
            if inner in own:
                children = sum(v for k, v in counted.items() if k.startswith(module + ".") and k.count(".") == 4)
                own[inner] += flops - children
            elif inner in LAYER_MAP:
                by_keys[our_keys(module)] += flops
    mixers = {"layers.*.attn.qk", "layers.*.attn.av", "layers.*.linear_attn.conv1d", "layers.*.linear_attn.core"}
    assert {k for keys in by_keys for k in keys} == {it.key for it in fwd} - mixers
    for keys, flops in by_keys.items():
        assert sum(fwd[k].total for k in keys) == flops, (keys, flops)
    assert own["self_attn"] == fwd["layers.*.attn.qk"].total + fwd["layers.*.attn.av"].total
    assert own["linear_attn"] == fwd["layers.*.linear_attn.conv1d"].total + fwd["layers.*.linear_attn.core"].total


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("seq", [1024, 4096])
def test_forward_flops_equal_transformers_on_meta(name, seq, models, meta_masks):  # noqa: F811
    """The published sizes on meta (the torch path of the delta rule and the conv runs there too, once
    transformers' packed-sequence check is patched: ``meta_masks``), at 1,024 and 4,096 tokens."""
    cfg = config_from_hf(CONFIGS[name], name=name).with_context(seq)
    assert_equal_by_module(hf_forward_flops(models[name], seq), forward_flops(cfg, seq))


@pytest.mark.parametrize("name", TINY_CONFIGS)
@pytest.mark.parametrize(("batch", "seq"), [(1, 64), (2, 100)])
def test_forward_flops_equal_transformers_on_cpu(name, batch, seq, tiny_models):
    """Real tensors, two sequences, at a chunk multiple (64) and at 100 tokens (padded to 128 in the rule)."""
    cfg = config_from_hf(TINY_CONFIGS[name], name=name)
    assert_equal_by_module(cpu_forward_flops(tiny_models[name], batch, seq), forward_flops(cfg, seq, batch))


@pytest.mark.parametrize("seq", [128, 100])
def test_the_chunked_rule_and_the_conv_by_hand(seq):
    """transformers' own functions on random tensors: ``torch_chunk_gated_delta_rule`` at 128 tokens (two chunks)
    and 100 (padded to 128), and ``causal_conv1d_fn``, counted by FlopCounterMode against the closed forms written
    out: 2·B·H_v·N·C·(2·C·d_k + 3·d_k·d_v + C·d_v) and 2·B·conv_dim·(S + K − 1)·K; the recurrent (decode) form
    runs no matmul."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers.models.qwen3_next import modeling_qwen3_next as m

    B, hk, hv, dk, dv, K = 2, 2, 4, 8, 12, 4
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(B, seq, hk, dk, generator=g) for _ in range(2))
    v = torch.randn(B, seq, hv, dv, generator=g)
    beta, decay = torch.rand(B, seq, hv, generator=g), -torch.rand(B, seq, hv, generator=g)
    with FlopCounterMode(display=False) as counter:
        m.torch_chunk_gated_delta_rule(q, k, v, g=decay, beta=beta, use_qk_l2norm_in_kernel=True)
    chunks = 2  # ⌈128/64⌉ = ⌈100/64⌉
    assert counter.get_total_flops() == 2 * B * hv * chunks * 64 * (2 * 64 * dk + 3 * dk * dv + 64 * dv)
    cfg = ModelConfig(
        vocab_size=8, context_length=seq, num_layers=2, d_model=16, num_heads=2, d_ff=16,
        full_attention_interval=2, linear_key_heads=hk, linear_value_heads=hv, linear_key_head_dim=dk,
        linear_value_head_dim=dv, linear_conv_kernel=K,
    )  # fmt: skip
    assert gated_delta_flops(cfg, B, seq) == counter.get_total_flops()
    conv_dim = 2 * hk * dk + hv * dv
    x, w = torch.randn(B, conv_dim, seq, generator=g), torch.randn(conv_dim, K, generator=g)
    with FlopCounterMode(display=False) as counter:
        m.causal_conv1d_fn(x, w, None, activation="silu")
    assert counter.get_total_flops() == 2 * B * conv_dim * (seq + K - 1) * K == causal_conv_flops(cfg, B, seq)
    state = torch.zeros(B, conv_dim, K)
    with FlopCounterMode(display=False) as counter:
        m.causal_conv1d_update(x[..., :1], state, w, None, "silu")
        m.torch_recurrent_gated_delta_rule(
            q[:, :1], k[:, :1], v[:, :1], g=decay[:, :1], beta=beta[:, :1], initial_state=torch.zeros(B, hv, dk, dv)
        )
    assert counter.get_total_flops() == conv_update_flops(cfg, B) == 2 * B * conv_dim * 2 * K


def test_decode_runs_the_recurrent_form():
    """A decode step of the tiny model with a cache, counted: the linear layers' conv update and no matmul in the
    rule (our decode row), the attention layers against the p + 1 cached keys."""
    from torch.utils.flop_counter import FlopCounterMode

    cfg = config_from_hf(TINY, name="tiny")
    model = cpu_model(TINY)
    B, P = 2, 70
    ids = torch.randint(0, 97, (B, P + 1), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        cache = model(input_ids=ids[:, :P], use_cache=True).past_key_values
        with FlopCounterMode(display=False) as counter:
            model(input_ids=ids[:, P:], past_key_values=cache, use_cache=True)
    step = decode_flops(cfg, P, B, P + 1)
    assert counter.get_total_flops() == step.total
    assert step["layers.*.linear_attn.core"].total == 0


@pytest.mark.parametrize("prompt", [2, 70])
def test_a_cached_prefill_equals_prefill_flops(prompt):
    """transformers' prefill into a cache, counted: ``prefill_flops``, with the conv's input padded to K = 4 by
    the cache when the prompt is shorter (2 tokens)."""
    from torch.utils.flop_counter import FlopCounterMode

    from lm_accounting.analytic.inference import prefill_flops

    cfg = config_from_hf(TINY, name="tiny")
    model = cpu_model(TINY)
    ids = torch.randint(0, 97, (2, prompt), generator=torch.Generator().manual_seed(4))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(input_ids=ids, use_cache=True)
    assert counter.get_total_flops() == prefill_flops(cfg, prompt, 2, prompt + 1).total


def test_training_flops_palm_still_equals_the_step():
    cfg = config_from_hf(TINY, name="tiny")
    t = training_flops(cfg, 100, 2)
    assert t.palm == t.step


# -- the cache after a prefill -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("dtype", "name"), [(torch.float32, "fp32"), (torch.bfloat16, "bf16")])
@pytest.mark.parametrize("config", ["tiny-qwen3-next", "tiny-qwen3.5"])
def test_cache_equals_transformers_after_a_prefill(dtype, name, config):
    """K and V on the attention layers, the conv state (B, conv_dim, K) in the model's dtype and the recurrent
    state (B, H_v, d_k, d_v) in fp32 on the linear layers: the bytes of every tensor of transformers' cache."""
    values = TINY_CONFIGS[config]
    cfg = config_from_hf(values, name=config)
    model = cpu_model(values).to(dtype)
    B, P = 2, 70
    held, shapes = hybrid_cache_after_prefill(model, B, P)
    assert shapes == {((B, 80, 4), dtype), ((B, 4, 8, 12), torch.float32)}
    assert held == kv_cache_bytes(cfg, P, B, name)
    assert layer_slots(cfg, P) == [P if cfg.layer_attention(i) else 0 for i in range(cfg.num_layers)]


def test_infer_gives_the_hybrid_cache(run_cli, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    args = ("--prompt", "70", "--generate", "2", "--batch", "2", "--program", "generate", "--format", "json")
    r = run_cli("infer", path, *args)
    assert r.code == 0, r.err
    memory = json.loads(r.out)["memory"]
    cfg = config_from_hf(TINY, name="tiny")
    # the cache of C = P + G − 1 = 71 positions: 2 attention layers' K and V, 6 linear layers' states (bf16 conv)
    kv = 2 * (2 * 2 * 16) * 71 * 2 * 2
    states = 6 * 2 * (80 * 4 * 2 + 4 * 8 * 12 * 4)
    assert memory["kv_cache"] == kv + states == kv_cache_bytes(cfg, 71, 2, "bf16") == 62_464


# -- refusals: one line, exit 2 ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"layer_types": ["linear_attention", "full_attention"]}, "lists 2 layers, num_hidden_layers is 8"),
        ({"layer_types": ["full_attention"] + ["linear_attention"] * 7}, "every n-th layer is full attention"),
        ({"shared_expert_intermediate_size": 0}, "shared_expert_intermediate_size"),
        ({"shared_expert_intermediate_size": None}, "shared_expert_intermediate_size"),
        ({"mlp_only_layers": [0]}, "mlp_only_layers"),
        ({"attention_bias": True}, "attention_bias"),
        ({"linear_num_value_heads": 3}, "not divisible by linear_key_heads"),
    ],
)
def test_a_bad_hybrid_is_one_line(change, message, run_cli, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TINY, **change}))
    r = run_cli("account", path)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and message in r.err, r.err


def test_linear_fields_without_a_hybrid_are_refused():
    with pytest.raises(ConfigError, match="applies only to a Gated DeltaNet hybrid"):
        ModelConfig(vocab_size=8, context_length=8, num_layers=2, d_model=16, num_heads=2, d_ff=16, linear_key_heads=2)
    with pytest.raises(ConfigError, match="needs linear_value_heads"):
        ModelConfig(
            vocab_size=8, context_length=8, num_layers=2, d_model=16, num_heads=2, d_ff=16,
            full_attention_interval=2, linear_key_heads=2,
        )  # fmt: skip


# -- the presets ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("preset", "values"), [("qwen3-next-80b-a3b", QWEN3_NEXT), ("qwen3.5-35b-a3b", QWEN3_5_MOE)])
def test_preset_is_its_config_json(preset, values):
    from lm_accounting.config import load_config

    cfg = load_config(preset)
    from_json = config_from_hf(values, name=preset)
    assert {**from_json.resolved(), "ignored_fields": [], "name": preset} == cfg.resolved()
    assert cfg.norm_topk_prob and cfg.hf_model_type == hf_values(values)["model_type"]


@pytest.mark.parametrize("preset", ["qwen3-next-80b-a3b", "qwen3.5-35b-a3b"])
def test_preset_has_no_live_model_one_line(preset, run_cli):
    r = run_cli("crosscheck", preset, "-S", "64")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "no Gated DeltaNet layers" in r.err


def test_static_cache_attends_on_the_attention_layers_only():
    """Under --cache static the prefill's queries score every slot of the capacity, on the 2 attention layers of
    the tiny model only: QKᵀ = 2 layers · 2·B·h·P·C·d_head."""
    from lm_accounting.analytic.inference import prefill_flops

    cfg = config_from_hf(TINY, name="tiny")
    B, P, C = 2, 70, 100
    qk = prefill_flops(cfg, P, B, C, semantics="static")["layers.*.attn.qk"].total
    assert qk == 2 * 2 * B * 4 * P * C * 16


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_an_engine_pool_is_refused_in_one_line(engine, run_cli, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    extra = ("--mem-fraction-static", "0.8") if engine == "sglang" else ()
    r = run_cli("infer", path, "-P", "64", "-G", "4", "--engine", engine, *extra)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "separate pool" in r.err, r.err


def test_component_shapes_hold_their_parameters(models):
    """The registry's stored shapes (what tensor parallelism shards) hold the parameters each formula counts, and
    the unfused ones are transformers' own (Qwen3.5's in_proj_qkv, in_proj_z, in_proj_b, in_proj_a; conv1d ...)."""
    import math

    from lm_accounting.analytic.sizes import Sizes
    from lm_accounting.components import component, components

    cfg = config_from_hf(QWEN3_5, name="qwen3.5")
    z = Sizes(cfg)
    for c in components(cfg, "params"):
        if c.shape is not None:
            assert c.tensors(cfg) * math.prod(c.shape(cfg)) == c.params.fn(z), c.key
    theirs = {n.partition("linear_attn.")[2]: tuple(p.shape) for n, p in models["qwen3.5"].named_parameters()}
    theirs = {k.removesuffix(".weight"): v for k, v in theirs.items() if k}
    for name in (
        "in_proj_qkv",
        "in_proj_z",
        "in_proj_b",
        "in_proj_a",
        "conv1d",
        "dt_bias",
        "A_log",
        "norm",
        "out_proj",
    ):
        assert component(f"layers.*.linear_attn.{name}").shape(cfg) == theirs[name], name


@pytest.mark.parametrize("name", TINY_CONFIGS)
def test_transformers_parameter_tensors(name, tiny_models):
    """The numel of every parameter tensor of transformers' model, in ``parameters()`` order (the AdamW step
    counters and for-loop temporaries of ``memory --impl transformers``), and their count."""
    from lm_accounting.analytic.hf_tensors import hf_parameter_tensor_count, hf_parameter_tensor_sizes

    cfg = config_from_hf(TINY_CONFIGS[name], name=name)
    real = [p.numel() for p in tiny_models[name].parameters()]
    assert hf_parameter_tensor_sizes(cfg) == real
    assert hf_parameter_tensor_count(cfg) == len(real)


def test_a_gate_on_biased_or_latent_attention_is_refused():
    with pytest.raises(ConfigError, match="no latent attention, no Q/K/V biases"):
        ModelConfig(
            vocab_size=8, context_length=8, num_layers=2, d_model=16, num_heads=2, d_ff=16, qkv_bias=True,
            attention_output_gate=True,
        )  # fmt: skip
