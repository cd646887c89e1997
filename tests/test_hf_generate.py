"""transformers' own ``generate()`` measured (``lm_accounting.measure.hf_generate``), at tiny shapes on cpu.

* Llama, written out by hand: the prefill's FLOPs (2·tokens·parameters of each linear, QKᵀ and AV at
  2·B·h·P·P·d_head each, the head on B·1 rows: ``logits_to_keep=1``), each decode step's at position p (the
  attention over p + 1 keys), the cache's bytes (2·L·kv_heads·d_head·(P + G - 1)·B·4), for sdpa and eager; the
  static cache (P + G - 1 slots, every slot attended while decoding; the prefill P × (P + G - 1) under eager,
  P × P under sdpa, which cuts the keys to the query's length).
* Qwen3 at B = 1: Llama's figures (its q/k norms count no FLOPs).
* Mixtral: the experts' matmuls on the routed (token, expert) pairs, k·B·S a layer whatever the routing
  (``batched_mm``, and ``eager``), the router a linear; transformers' default ``grouped_mm`` counts 0.
* DeepSeek-V3: the latent cache (B, 1, n, kv_lora_rank) and the rotated key (B, 1, n, qk_rope_head_dim);
  ``kv_b_proj`` expanding every cached position; the whole prefill and a decode step by hand.
* Gemma 3 (a sliding layer of window w = 6 < P, then a full one): ``DynamicSlidingWindowLayer`` keeps w - 1
  positions, a view of a w-position storage, and hands the attention min(p + 1, w) keys; the static cache's
  sliding layer has min(w, P + G - 1) slots.
* Every type: G forward calls, logits (B, 1, V) each, nothing counted outside the forward calls.
"""

import dataclasses
import functools

import pytest

from lm_accounting.config import AccountingError, load_config
from lm_accounting.hf_config import config_from_hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_transformers_truth import CONFIGS  # the committed config.json values

P, G = 10, 4
C = P + G - 1  # positions cached at the end: the G-th token is never fed back (and the static cache's size)
L, D, H, KV, DH, V = 2, 64, 4, 2, 16, 256  # layers, d_model, heads, kv heads, head size, vocab
F = 96  # d_ff
SHAPES = dict(num_layers=L, vocab_size=V, d_model=D, num_heads=H, context_length=256)
LLAMA_LINEAR = D * H * DH + 2 * D * KV * DH + H * DH * D + 3 * D * F  # q, k, v, o, gate, up, down
E, K, FE = 4, 2, 32  # Mixtral: experts, experts a token, expert width
W = 6  # Gemma 3's window
# DeepSeek-V3: q_lora_rank, kv_lora_rank, qk_nope, qk_rope, v head sizes; 16 experts (8 groups of 2), width 16
QR, KR, NOPE, ROPE, VD, DE, FD = 48, 32, 16, 8, 16, 16, 16
LATENT_MOE = dict(
    d_ff=F,
    dense_layers_first=1,
    num_experts=DE,
    experts_per_token=K,
    expert_d_ff=FD,
    shared_experts=1,
    kv_lora_rank=KR,
    qk_nope_head_dim=NOPE,
    qk_rope_head_dim=ROPE,
    v_head_dim=VD,
)  # DeepSeek-V2 and V3's shared shape

CONFIGS_BY_TYPE = {
    "llama": lambda: dataclasses.replace(load_config("llama-3-8b"), **SHAPES, num_kv_heads=KV, d_ff=F),
    "qwen3": lambda: dataclasses.replace(load_config("qwen3-0.6b"), **SHAPES, num_kv_heads=KV, head_dim=DH, d_ff=F),
    "mixtral": lambda: dataclasses.replace(
        load_config("mixtral-8x7b"), **SHAPES, num_kv_heads=KV, d_ff=FE, num_experts=E, experts_per_token=K
    ),
    "deepseek_v3": lambda: dataclasses.replace(load_config("deepseek-v3"), **SHAPES, **LATENT_MOE, q_lora_rank=QR),
    "gemma3_text": lambda: dataclasses.replace(
        config_from_hf(CONFIGS["gemma-3-1b"][0], name="gemma-3-1b"),
        **SHAPES,
        num_kv_heads=KV,
        head_dim=DH,
        d_ff=F,
        sliding_window=W,
        full_attention_every=2,
    ),
}

EVERY_TYPE = {
    **CONFIGS_BY_TYPE,
    "gpt2": lambda: dataclasses.replace(
        load_config("openai-gpt2"), num_layers=L, vocab_size=V, d_model=D, num_heads=H, d_ff=F
    ),  # learned positions, biases, LayerNorm, GELU
    "mistral": lambda: hf("mistral-7b", num_kv_heads=KV, d_ff=F, sliding_window=W),  # every layer windowed
    "qwen2": lambda: hf("qwen2.5-0.5b", num_kv_heads=KV, d_ff=F),  # q/k/v biases
    "qwen3_moe": lambda: hf(
        "qwen3-30b-a3b", num_kv_heads=KV, head_dim=DH, d_ff=F, num_experts=E, experts_per_token=K, expert_d_ff=FE
    ),
    "gemma2": lambda: hf("gemma-2-2b", num_kv_heads=KV, head_dim=DH, d_ff=F, sliding_window=W),  # eager only
    "phi3": lambda: hf("phi-3-mini-4k", num_kv_heads=H, d_ff=F, sliding_window=W),
    "olmo2": lambda: hf("olmo-2-7b", num_kv_heads=H, d_ff=F),  # whole-projection qk-norm, post norms
    "deepseek_v2": lambda: hf("deepseek-v2-lite", **LATENT_MOE),
}
"""Every model_type the registry describes, at the same tiny sizes: the comparison with ``infer --program
generate`` runs on all of them (CONFIGS_BY_TYPE: the five checked by hand above)."""
EAGER_ONLY = {"gemma2"}  # transformers refuses sdpa for Gemma 2


def hf(name: str, **kw):
    """A committed config.json (test_transformers_truth) at the tiny shapes."""
    return dataclasses.replace(config_from_hf(CONFIGS[name][0], name=name), **SHAPES, **kw)


@functools.cache
def run(model_type: str, batch: int = 2, attention: str = "sdpa", cache: str = "dynamic", experts: str = "batched_mm"):
    from lm_accounting.measure.hf_generate import measure_hf_generate

    cfg = EVERY_TYPE[model_type]()
    assert cfg.hf_model_type == model_type
    return measure_hf_generate(cfg, P, G, batch, attention=attention, cache=cache, experts=experts)


def attention_flops(batch: int, queries: int, keys: int, qk: int = DH, v: int = DH) -> int:
    """One layer's QKᵀ (2·B·h·q·n·d_qk) and AV (2·B·h·q·n·d_v)."""
    return 2 * batch * H * queries * keys * qk + 2 * batch * H * queries * keys * v


def head_flops(batch: int) -> int:
    return 2 * batch * 1 * D * V  # logits_to_keep=1: one row a sequence, the prefill's too


def llama_prefill(batch: int, keys: int = P) -> int:
    return 2 * batch * P * L * LLAMA_LINEAR + L * attention_flops(batch, P, keys) + head_flops(batch)


def llama_decode(batch: int, p: int, keys: int | None = None) -> int:
    return (
        2 * batch * L * LLAMA_LINEAR
        + L * attention_flops(batch, 1, p + 1 if keys is None else keys)
        + head_flops(batch)
    )


def check_every_type(r, batch: int) -> None:
    assert r["forward_calls"] == G == len(r["steps"])
    assert r["sequences_shape"] == [batch, P + G]
    assert [s["kind"] for s in r["steps"]] == ["prefill"] + ["decode"] * (G - 1)
    assert [s["position"] for s in r["steps"]] == [0, *range(P, P + G - 1)]
    assert [s["input_shape"] for s in r["steps"]] == [[batch, P]] + [[batch, 1]] * (G - 1)
    assert all(s["logits_shape"] == [batch, 1, V] and s["logits_dtype"] == "float32" for s in r["steps"])
    assert all(s["groups"]["head"] == head_flops(batch) for s in r["steps"])
    assert all(sum(s["groups"].values()) == s["flops"] for s in r["steps"])
    assert r["flops_outside_forward"] == 0 and r["flops_total"] == sum(r["flops"])


# -- Llama by hand ---------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("attention", ["sdpa", "naive"])
def test_llama_prefill_and_decode_flops_by_hand(attention):
    r = run("llama", 2, attention)
    check_every_type(r, 2)
    assert r["attn_implementation"] == {"sdpa": "sdpa", "naive": "eager"}[attention]
    assert r["flops"] == [llama_prefill(2)] + [llama_decode(2, p) for p in range(P, P + G - 1)]
    prefill = r["steps"][0]["groups"]
    assert prefill == {
        "head": 2 * 2 * D * V,
        "attention": L * (2 * 2 * 2 * H * P * P * DH),
        "experts": 0,
        "rotary": 0,  # transformers 5.x takes RoPE's angles as a broadcast product: no matmul
        "linear": 2 * 2 * P * L * LLAMA_LINEAR,
    }
    assert r["steps"][0]["by_module"]["model.layers.0.self_attn.q_proj"] == {"aten.mm": 2 * 2 * P * D * H * DH}
    op = "aten._scaled_dot_product_flash_attention_for_cpu" if attention == "sdpa" else "aten.bmm"
    assert r["steps"][0]["by_module"]["model.layers.1.self_attn"] == {op: 2 * 2 * 2 * H * P * P * DH}
    assert [s["keys_returned"] for s in r["steps"]] == [[n, n] for n in range(P, P + G)]


@pytest.mark.slow
def test_llama_dynamic_cache_bytes_by_hand():
    r = run("llama")
    assert r["cache_class"] == "DynamicCache"
    assert r["cache_bytes"] == r["cache_storage_bytes"] == 2 * L * KV * DH * C * 2 * 4 == 13_312
    assert r["cache_other_bytes"] == 0
    for layer in r["cache_layers"]:
        assert layer["class"] == "DynamicLayer" and layer["seq_length"] == layer["kept"] == C
        assert {k: t["shape"] for k, t in layer["tensors"].items()} == {
            "keys": [2, KV, C, DH],
            "values": [2, KV, C, DH],
        }
    assert [s["cache_kept"] for s in r["steps"]] == [[n, n] for n in range(P, P + G)]
    assert [s["cache_storage_bytes"] for s in r["steps"]] == [2 * L * KV * DH * n * 2 * 4 for n in range(P, P + G)]


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["sdpa", "naive"])
def test_llama_static_cache_has_p_plus_g_minus_1_slots_all_attended(attention):
    r = run("llama", 2, attention, "static")
    check_every_type(r, 2)
    assert r["cache_class"] == "StaticCache"
    assert r["cache_bytes"] == 2 * L * KV * DH * C * 2 * 4  # max_length - 1 = P + G - 1 slots, not P + G
    assert r["cache_other_bytes"] == L * 8  # each StaticLayer's int64 cumulative_length
    assert {(x["class"], x["kept"], x["max_length"]) for x in r["cache_layers"]} == {("StaticLayer", C, C)}
    assert all(s["keys_returned"] == [C, C] for s in r["steps"])
    prefill_keys = P if attention == "sdpa" else C  # sdpa_attention_forward cuts the keys to the query's length
    assert r["flops"] == [llama_prefill(2, prefill_keys)] + [llama_decode(2, p, C) for p in range(P, P + G - 1)]


@pytest.mark.slow
def test_qwen3_is_llama_by_hand_at_batch_1():
    r = run("qwen3", 1)
    check_every_type(r, 1)
    assert r["flops"] == [llama_prefill(1)] + [llama_decode(1, p) for p in range(P, P + G - 1)]
    assert r["cache_bytes"] == 2 * L * KV * DH * C * 1 * 4


# -- mixture of experts ----------------------------------------------------------------------------------------
def mixtral_flops(batch: int, tokens: int, keys: int, queries: int) -> dict[str, int]:
    projections = D * H * DH + 2 * D * KV * DH + H * DH * D
    return {
        "head": head_flops(batch),
        "attention": L * attention_flops(batch, queries, keys),
        "experts": L * 2 * (tokens * K) * 3 * D * FE,  # the routed (token, expert) pairs only
        "rotary": 0,
        "linear": L * 2 * tokens * (projections + D * E),  # q k v o and the router
    }


@pytest.mark.slow
@pytest.mark.parametrize("experts", ["batched_mm", "eager"])
def test_mixtral_counts_the_routed_experts_only(experts):
    r = run("mixtral", experts=experts)
    check_every_type(r, 2)
    assert r["experts_implementation"] == experts
    assert r["steps"][0]["groups"] == mixtral_flops(2, 2 * P, P, P)
    for s in r["steps"][1:]:
        assert s["groups"] == mixtral_flops(2, 2, s["position"] + 1, 1)
    for s in r["steps"]:
        routed = s["expert_tokens"]
        assert sorted(routed) == ["model.layers.0.mlp.experts", "model.layers.1.mlp.experts"]
        assert all(len(n) == E and sum(n) == K * 2 * s["input_shape"][1] for n in routed.values())
    assert r["cache_bytes"] == 2 * L * KV * DH * C * 2 * 4


@pytest.mark.slow
def test_transformers_default_grouped_mm_experts_count_zero_flops():
    r = run("mixtral", experts="grouped_mm")
    assert all(s["groups"]["experts"] == 0 for s in r["steps"])  # torch._grouped_mm: no FlopCounterMode formula
    assert [a - b for a, b in zip(run("mixtral")["flops"], r["flops"], strict=True)] == [
        L * 2 * (n * K) * 3 * D * FE for n in (2 * P, 2, 2, 2)
    ]


@pytest.mark.slow
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_deepseek_caches_the_latent_and_the_rotated_key(cache):
    r = run("deepseek_v3", cache=cache)
    check_every_type(r, 2)
    for layer in r["cache_layers"]:
        assert layer["tensors"]["keys"]["shape"] == [2, 1, C, KR]  # kv_a_layernorm's output, one "head"
        assert layer["tensors"]["values"]["shape"] == [2, 1, C, ROPE]  # the rotated key, shared by the heads
    assert r["cache_bytes"] == L * 2 * C * (KR + ROPE) * 4
    # only layer 1 is a mixture of experts (first_k_dense_replace = 1)
    assert all(list(s["expert_tokens"]) == ["model.layers.1.mlp.experts"] for s in r["steps"])
    assert [sum(s["expert_tokens"]["model.layers.1.mlp.experts"]) for s in r["steps"]] == [K * 2 * P] + [K * 2] * 3


def deepseek_flops(tokens: int, expanded: int, queries: int, keys: int) -> dict[str, int]:
    """tokens = B·S fed, expanded = B·n positions ``kv_b_proj`` expands, queries × keys a row."""
    projections = D * QR + QR * H * (NOPE + ROPE) + D * (KR + ROPE) + H * VD * D  # q_a, q_b, kv_a, o
    return {
        "head": head_flops(2),
        "attention": L * attention_flops(2, queries, keys, NOPE + ROPE, VD),
        "experts": 2 * tokens * K * 3 * D * FD,  # layer 1's routed experts
        "rotary": 0,
        "linear": 2 * tokens * (L * projections + 3 * D * F + D * DE + 3 * D * FD)  # + dense MLP, router, shared
        + L * 2 * expanded * KR * H * (NOPE + VD),  # kv_b_proj over every cached position
    }


@pytest.mark.slow
def test_deepseek_flops_by_hand_kv_b_proj_expands_every_cached_position():
    r = run("deepseek_v3")
    assert r["steps"][0]["groups"] == deepseek_flops(2 * P, 2 * P, P, P)
    for s in r["steps"][1:]:
        n = s["position"] + 1
        assert s["groups"] == deepseek_flops(2, 2 * n, 1, n)
        assert s["by_module"]["model.layers.0.self_attn.kv_b_proj"] == {"aten.mm": 2 * 2 * n * KR * H * (NOPE + VD)}


# -- Gemma 3: a sliding-window layer ----------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("attention", ["sdpa", "naive"])
def test_gemma3_dynamic_sliding_layer_keeps_w_minus_1_positions(attention):
    r = run("gemma3_text", attention=attention)
    check_every_type(r, 2)
    sliding, full = r["cache_layers"]
    assert (sliding["class"], sliding["sliding"], sliding["max_length"]) == ("DynamicSlidingWindowLayer", True, W)
    assert (sliding["seq_length"], sliding["kept"]) == (C, W - 1)  # tokens seen; positions kept
    one = 2 * KV * DH * 4  # bytes of one position of keys (or values), B = 2
    assert sliding["tensors"]["keys"]["bytes"] == (W - 1) * one
    assert sliding["tensors"]["keys"]["storage_bytes"] == W * one  # a view of the w-position concatenation
    assert (full["class"], full["kept"]) == ("DynamicLayer", C)
    assert r["cache_bytes"] == 2 * ((W - 1) + C) * one
    assert r["cache_storage_bytes"] == 2 * (W + C) * one
    assert r["cache_other_bytes"] == 8  # the sliding layer's int64 _sliding_window_tensor
    # after the prefill the sliding layer's view keeps all P positions alive
    assert r["steps"][0]["cache_kept"] == [W - 1, P] and r["steps"][0]["cache_storage_bytes"] == 2 * 2 * P * one
    assert [s["keys_returned"] for s in r["steps"]] == [[P, P]] + [[min(p + 1, W), p + 1] for p in range(P, C)]
    assert r["steps"][0]["groups"]["attention"] == L * attention_flops(2, P, P)  # the full square, mask or not
    for s in r["steps"][1:]:
        p = s["position"]
        assert s["groups"]["attention"] == attention_flops(2, 1, min(p + 1, W)) + attention_flops(2, 1, p + 1)
        assert s["groups"]["linear"] == 2 * 2 * L * LLAMA_LINEAR  # Gemma's MLP is gated too: Llama's linears


@pytest.mark.slow
def test_gemma3_static_sliding_layer_has_window_slots():
    r = run("gemma3_text", attention="naive", cache="static")
    sliding, full = r["cache_layers"]
    assert (sliding["class"], sliding["kept"], full["class"], full["kept"]) == (
        "StaticSlidingWindowLayer",
        min(W, C),
        "StaticLayer",
        C,
    )
    # the prefill, longer than the window, attends over its own P keys on the sliding layer; decode over the slots
    assert [s["keys_returned"] for s in r["steps"]] == [[P, C]] + [[W, C]] * (G - 1)
    assert r["steps"][0]["groups"]["attention"] == attention_flops(2, P, P) + attention_flops(2, P, C)


# -- refusals ----------------------------------------------------------------------------------------------------
def test_an_unknown_cache_or_experts_implementation_is_one_line():
    from lm_accounting.measure.hf_generate import measure_hf_generate

    with pytest.raises(AccountingError, match="unknown cache 'paged'"):
        measure_hf_generate(CONFIGS_BY_TYPE["llama"](), P, G, cache="paged")
    with pytest.raises(AccountingError, match="unknown experts implementation"):
        measure_hf_generate(CONFIGS_BY_TYPE["mixtral"](), P, G, experts="sonic")


def test_without_transformers_the_error_names_the_extra(monkeypatch):
    import sys

    from lm_accounting.measure.hf_generate import measure_hf_generate

    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    with pytest.raises(AccountingError, match=r'not installed: pip install "lm-accounting\[hf\]"$'):
        measure_hf_generate(CONFIGS_BY_TYPE["llama"](), P, G)


# -- the analytic generate program against the measurement -------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(("attention", "cache"), [("sdpa", "dynamic"), ("naive", "static")])
@pytest.mark.parametrize("model_type", list(EVERY_TYPE))
def test_infer_program_generate_equals_transformers_generate(model_type, attention, cache):
    """``infer --program generate`` (``inference.prefill_flops`` / ``decode_flops`` with program
    "generate", at C = P + G - 1) equals transformers' ``generate()`` call by call: the prefill and every
    decode step's FLOPs, and the cache's bytes (a windowed layer's storage: w positions, the w - 1 it keeps
    plus the one it concatenates).  Dynamic cache: filled semantics; static: every slot attended.  Every one of
    the 13 model_types (EVERY_TYPE): MLA (deepseek_v2/v3), windows (mistral, phi3, gemma2/3), MoE, GPT-2."""
    from lm_accounting.analytic.inference import cache_positions, decode_flops, kv_bytes, prefill_flops

    cfg, batch = EVERY_TYPE[model_type](), 2
    semantics = "filled" if cache == "dynamic" else "static"
    attention = "naive" if model_type in EAGER_ONLY else attention
    r = run(model_type, batch, attention, cache)
    capacity = cache_positions("generate", P, G)
    assert capacity == C
    predicted = [prefill_flops(cfg, P, batch, C, semantics, "generate").total]
    predicted += [decode_flops(cfg, p, batch, C, semantics, "generate").total for p in range(P, P + G - 1)]
    assert r["flops"] == predicted
    assert r["cache_storage_bytes"] == kv_bytes(cfg, C, batch, "fp32")
