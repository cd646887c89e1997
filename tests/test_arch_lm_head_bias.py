"""The LM-head bias and the shared experts' biases, exact against transformers 5.24's Ernie 4.5-MoE.

``Ernie4_5_MoeForCausalLM`` with ``use_bias = true`` (transformers' models/ernie4_5_moe) puts a bias on q/k/v/o,
on the dense MLP and the shared experts (``Ernie4_5_MoeMLP``), and on the LM head (``lm_head = nn.Linear(d, V,
bias=config.use_bias)``; tied, it shares only the weight); the routed experts have none.  Ours: ``qkv_bias``,
``output_bias``, ``mlp_bias`` (dense FFNs and shared experts), ``lm_head_bias``.

Not modelled, and named here: each MoE layer's router holds ``moe_statics.e_score_correction_bias``, a frozen
(``requires_grad=False``) parameter of E, so transformers' ``parameters()`` has E more per MoE layer than ours
(no Ernie 4.5 config.json is read yet: ``hf_config`` does not list ernie4_5_moe).  The model below is the class's
defaults (ERNIE-4.5-21B-A3B's shapes: d 2,560, 20 heads of 128, 4 KV heads, 64 experts of 1,536, top-6, 2 shared,
layer 0 dense) with ``use_bias = true`` and 3 layers, our config written out by hand beside it.
"""

from collections import defaultdict

import pytest

from lm_accounting.analytic.flops import forward_flops
from lm_accounting.analytic.params import parameter_breakdown
from lm_accounting.config import ModelConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_transformers_truth import build_hf, hf_forward_flops, meta_masks  # noqa: F401

HF = {"model_type": "ernie4_5_moe", "num_hidden_layers": 3, "use_bias": True, "max_position_embeddings": 4096}
OURS = ModelConfig(
    vocab_size=103424, context_length=4096, num_layers=3, d_model=2560, num_heads=20, num_kv_heads=4, d_ff=12288,
    qkv_bias=True, output_bias=True, mlp_bias=True, lm_head_bias=True, tie_embeddings=True, num_experts=64,
    experts_per_token=6, expert_d_ff=1536, shared_experts=2, dense_layers_first=1, name="ernie-4.5-moe-biases",
)  # fmt: skip
FROZEN = "mlp.gate.moe_statics.e_score_correction_bias"

LAYER_MAP = {
    "self_attn.q_proj": ("attn.q_proj",),
    "self_attn.k_proj": ("attn.k_proj",),
    "self_attn.v_proj": ("attn.v_proj",),
    "self_attn.o_proj": ("attn.output_proj",),
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
TOP = {"model.embed_tokens": "token_embeddings", "model.norm": "ln_final", "lm_head": "lm_head"}
PREFIX = "model.layers."


def our_keys(name: str) -> tuple[str, ...]:
    module, _, kind = name.rpartition(".")
    if kind not in ("weight", "bias"):
        module, kind = name, "weight"
    bias = ".bias" if kind == "bias" else ""
    if module in TOP:
        return (TOP[module] + bias,)
    keys = LAYER_MAP[module[len(PREFIX) :].partition(".")[2]]
    return tuple(f"layers.*.{k}{bias if not k.startswith('ln') else ''}" for k in keys)


@pytest.fixture(scope="module")
def model():
    return build_hf(HF)


def test_parameters_equal_transformers_but_the_frozen_score_bias(model):
    bd = parameter_breakdown(OURS)
    frozen = [p for n, p in model.named_parameters() if n.endswith(FROZEN)]
    assert len(frozen) == OURS.moe_layers == 2 and all(not p.requires_grad and p.numel() == 64 for p in frozen)
    assert bd.total == sum(p.numel() for p in model.parameters()) - OURS.moe_layers * OURS.num_experts
    by_keys: dict[tuple[str, ...], int] = defaultdict(int)
    for hf_name, param in model.named_parameters():
        if not hf_name.endswith(FROZEN):
            by_keys[our_keys(hf_name)] += param.numel()
    assert {k for keys in by_keys for k in keys} == {it.key for it in bd if it.total}  # the tied head: 0
    for keys, count in by_keys.items():
        assert sum(bd[k].total for k in keys) == count, (keys, count)
    assert bd["lm_head.bias"].total == 103424 and bd["lm_head"].total == 0
    assert bd["layers.*.moe.shared.w2.bias"].per_layer == 2560 and "layers.*.moe.experts.w1.bias" not in bd.totals()


@pytest.mark.parametrize("seq", [1024, 2048])
def test_forward_flops_equal_transformers(seq, model, meta_masks):  # noqa: F811
    counted = hf_forward_flops(model, seq)
    fwd = forward_flops(OURS.with_context(seq), seq)
    assert counted["total"] == fwd.total, (counted["total"], fwd.total)
    by_keys: dict[tuple[str, ...], int] = defaultdict(int)
    attention_core = 0
    for module, flops in counted.items():
        if module in TOP:
            by_keys[our_keys(module)] += flops
        elif module.startswith(PREFIX) and module.count(".") > 2 and flops:
            inner = module[len(PREFIX) :].partition(".")[2]
            if inner == "self_attn":
                children = sum(v for k, v in counted.items() if k.startswith(module + ".") and k.count(".") == 4)
                attention_core += flops - children
            elif inner in LAYER_MAP and not any(k.startswith(module + ".") and v for k, v in counted.items()):
                by_keys[our_keys(module)] += flops
    assert {k for keys in by_keys for k in keys} == {it.key for it in fwd} - {"layers.*.attn.qk", "layers.*.attn.av"}
    for keys, flops in by_keys.items():
        assert sum(fwd[k].total for k in keys) == flops, (keys, flops)
    assert attention_core == fwd["layers.*.attn.qk"].total + fwd["layers.*.attn.av"].total


@pytest.mark.parametrize(("device", "seq"), [("meta", 64), ("cpu", 32)])
def test_live_model_crosscheck_is_exact(device, seq):
    """The live model with an LM-head bias (tied weight) and biased shared experts."""
    import dataclasses

    from lm_accounting.measure.crosscheck import crosscheck

    tiny = dataclasses.replace(
        OURS, vocab_size=97, context_length=64, d_model=32, num_heads=4, num_kv_heads=2, d_ff=48, num_experts=4,
        experts_per_token=2, expert_d_ff=16, name="tiny-biases",
    )  # fmt: skip
    assert crosscheck(tiny, seq, 2, device=device, backward=True).mismatches() == []
