"""infer's programs: engine (vLLM/SGLang), generate (transformers) and forward, by hand.

Llama-3-8B and the H100 figures are test_infer.py's (its module docstring).  DeepSeek-V3 (public
config): 61 layers, d 7,168, 128 heads, q_lora_rank 1,536, kv_lora_rank r = 512, qk_nope 128,
qk_rope 64, v_head 128, vocab 129,280; 3 dense layers (d_ff 18,432), 58 MoE layers of 256 routed
experts (8 active) and 1 shared expert of width 2,048.
"""

import pytest
from test_infer import FF, HD, KV, N_MATMUL, N_PARAMS, D, H, L, V

from lm_accounting.analytic.inference import cache_positions, cache_slots, decode_flops, prefill_flops
from lm_accounting.analytic.inference_report import infer
from lm_accounting.config import AccountingError, load_config

P, G = 4096, 512


@pytest.fixture(scope="module")
def llama():
    return load_config("llama-3-8b")


def test_engine_capacity_is_not_bounded_by_logits_at_every_position(llama):
    """Llama-3-8B, P 4,096, G 512, bf16, one H100 (the default budget: CUDA's 79.11 GiB less 3 GB).

    forward keeps B·P·V logits (1.05 GB a sequence at P 4,096): the LM head's moment sets the prefill
    peak.  engine keeps B·V (logits_to_keep = 1) and an fp32 copy: the FFN's moment sets it, the block's
    input, the mid stream and ln2's output (3·d) beside w1's output, its sigmoid and the SiLU (3·d_ff),
    with the int64 positions (8·P, not per sequence).  The cache holds P + G − 1 = 4,607 positions in
    whole 16-token blocks: 288 blocks = 4,608 slots."""
    budget, e, rope = 81_943_715_696, 2, 2 * 8192 * (HD // 2) * 4
    W = 2 * N_PARAMS

    def engine_peak(b):
        temps = 8 * P + b * P * (3 * D + 3 * FF) * e
        return W + rope + b * P * 8 + b * 2 * L * KV * HD * 4608 * e + temps

    def forward_peak(b):  # the head's moment: x, ln_final's output and the logits
        return W + rope + b * P * 8 + b * 2 * L * KV * HD * (P + G) * e + 8 * P + b * P * (2 * D + V) * e

    engine = infer(llama, P, G, 1)
    forward = infer(llama, P, G, 1, program="forward")
    assert engine.program == "engine" and engine.capacity == 4607 and engine.cache_slots == 4608
    assert engine.memory["prefill_temporaries"] == 8 * P + P * (3 * D + 3 * FF) * e == 453_017_600
    assert engine.memory["kv_cache_per_sequence"] == 2 * L * KV * HD * 4608 * e == 603_979_776
    assert engine_peak(62) <= budget < engine_peak(63) and engine.max_batch == 62
    assert forward_peak(38) <= budget < forward_peak(39) and forward.max_batch == 38
    assert P * V * e == 1_050_673_152  # the logits forward keeps per sequence, at the prefill's peak


def test_generate_and_engine_run_the_head_on_the_last_position(llama):
    """The prefill's head: 2·B·P·d·V under forward, 2·B·d·V under generate and engine; the rest of the
    prefill is the forward's (generate: the full square, as counters count it; engine: the causal
    triangle, P(P + 1)/2 query-key pairs per layer and head, 2·hd FLOPs each for QKᵀ and for AV)."""
    B, P_ = 2, 1000
    square = 4 * L * B * P_ * P_ * H * HD
    triangle = 4 * L * B * (P_ * (P_ + 1) // 2) * H * HD
    full = prefill_flops(llama, P_, B, P_ + 1, program="forward")
    assert full.total == 2 * B * P_ * N_MATMUL + square
    gen = prefill_flops(llama, P_, B, P_ + 1, program="generate")
    assert gen.total == 2 * B * P_ * (N_MATMUL - D * V) + 2 * B * D * V + square
    eng = prefill_flops(llama, P_, B, P_ + 1, program="engine")
    assert eng.total == 2 * B * P_ * (N_MATMUL - D * V) + 2 * B * D * V + triangle
    # decode is the same program everywhere for a plain GQA model: one token over p + 1 keys
    for program in ("forward", "generate", "engine"):
        assert decode_flops(llama, 5000, B, 6000, program=program).total == 2 * B * N_MATMUL + 4 * L * B * 5001 * H * HD


def test_cache_positions():
    """transformers' generate: max_cache_length = max_length − 1 = P + G − 1 (the last token sampled is
    never fed back); the engine's blocks of 16 round it up; our forward program keeps P + G."""
    assert [cache_positions(p, 100, 28) for p in ("forward", "generate", "engine")] == [128, 127, 127]
    assert [cache_slots(p, 100, 28) for p in ("forward", "generate", "engine")] == [128, 127, 128]
    assert cache_slots("engine", 100, 29) == 128 and cache_slots("engine", 100, 30) == 144


DS = dict(L=61, d=7168, h=128, r=512, rope=64, nope=128, v=128, q=1536, V=129280, dense=3, ff=18432, moe_ff=2048)


def test_deepseek_v3_decode_is_absorbed_in_the_engine():
    """Absorbed MLA (DeepSeek-V2 §2.1.2): a decode token costs 2·N_active (every matmul weight it touches
    once, kv_b_proj's 2·r·h·(nope + v) being the absorption of W^UK and W^UV) plus, per cached key and
    layer, 2·h·(r + rope) for QKᵀ and 2·h·r for AV over the latent.  The training form (generate,
    transformers v5) re-expands every cached latent through kv_b_proj at each step instead."""
    ds = load_config("deepseek-v3")
    c = DS
    attn = c["d"] * c["q"] + c["q"] * c["h"] * (c["nope"] + c["rope"])  # q_a, q_b
    attn += c["d"] * (c["r"] + c["rope"]) + c["r"] * c["h"] * (c["nope"] + c["v"]) + c["h"] * c["v"] * c["d"]
    dense_ffn, expert = 3 * c["d"] * c["ff"], 3 * c["d"] * c["moe_ff"]
    moe_ffn = (8 + 1) * expert + c["d"] * 256  # 8 routed + 1 shared expert, the router
    n_active = c["L"] * attn + c["dense"] * dense_ffn + (c["L"] - c["dense"]) * moe_ffn + c["d"] * c["V"]
    p = 4096
    per_key = 2 * c["h"] * (c["r"] + c["rope"]) + 2 * c["h"] * c["r"]
    absorbed = 2 * n_active + c["L"] * (p + 1) * per_key
    got = decode_flops(ds, p, 1, p + 512, program="engine").total
    assert got == absorbed == 142_858_076_160
    expand = c["L"] * 2 * c["r"] * c["h"] * (c["nope"] + c["v"])  # kv_b_proj on one cached position
    qk_av = c["L"] * 2 * c["h"] * (c["nope"] + c["rope"] + c["v"])  # per key, expanded heads
    trained = 2 * n_active + p * expand + (p + 1) * qk_av  # + kv_b_proj's own token, counted in n_active
    assert decode_flops(ds, p, 1, p + 512, program="generate").total == trained
    assert trained / got > 50  # 8.48 TFLOP against 0.143: 98 % of the training form is re-expansion


def test_deepseek_v3_engine_verdicts_follow_the_absorbed_form():
    """fp8 weights (w8a8: the H200's FP8 peak, 1,978.9 TFLOP/s) and cache, tp 8, P 4,096; the ridge is
    1,978.9 T / 4.8 TB/s = 412 FLOP/byte.  Re-expanded (generate), a sequence's step is 8.48 TFLOP, 1.06 per
    rank: compute-bound from B = 35.  Absorbed (engine), it is 142.9 GFLOP (17.9 per rank) against the latent
    cache every rank reads whole (MLA's cache is replicated under TP): 61 layers × 4,097 keys × 576 bytes =
    143,952,192 B, 124 FLOP/byte, below the ridge: memory-bound at every batch, so there is no knee."""
    ds = load_config("deepseek-v3")
    kw = dict(weights="fp8", kv_dtype="fp8", tp=8, gpu="h200")
    generate = infer(ds, 4096, 512, 64, program="generate", **kw)
    engine = infer(ds, 4096, 512, 64, **kw)
    assert generate.compute == engine.compute == "fp8" and engine.roofline["peak_flops"] == 1_978_900_000_000_000
    assert generate.roofline["decode_first"]["bound"] == "compute-bound"
    assert generate.roofline["knee_batch_first"] == 35
    f1 = decode_flops(ds, 4096, 1, 4607, program="engine").total // 8
    k1 = 61 * 4097 * (512 + 64)
    assert k1 == 143_952_192 and f1 * 4_800_000_000_000 < 1_978_900_000_000_000 * k1
    assert engine.roofline["decode_first"]["bound"] == "memory-bound" and engine.roofline["knee_batch_first"] is None


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        (dict(program="engine", semantics="static"), "--program engine runs a paged cache"),
        (dict(program="engine", attention="naive"), "--program engine runs a paged cache"),
        (dict(program="serve"), "unknown program 'serve'"),
    ],
)
def test_a_program_contradicted_by_an_option_is_refused(llama, kw, needle):
    with pytest.raises(AccountingError, match=needle):
        infer(llama, 20, 5, **kw)


def test_the_static_cache_and_naive_attention_name_transformers_generate(llama):
    assert infer(llama, 20, 5).program == "engine"
    assert infer(llama, 20, 5, semantics="static").program == "generate"
    assert infer(llama, 20, 5, attention="naive").program == "generate"


def test_the_absorbed_mla_decode_is_the_engines_flops_and_the_expanded_forms_logits():
    """Our live model's latent attention in the absorbed form (``model.mla``, a cache built with absorbed=True):
    a decode step after the same prefill gives the expanded form's logits, and FlopCounterMode counts exactly
    the engine program's decode: QKᵀ 2·B·h·(r + d_rope) and AV 2·B·h·r per cached latent, and the two per-token
    absorptions (absorb_q, absorb_o) adding up to kv_b_proj's row, 2·B·r·h·(d_nope + d_v) a layer."""
    import dataclasses

    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    from lm_accounting.model import build_model
    from lm_accounting.model.kv_cache import StaticKVCache, decode, prefill
    from lm_accounting.setup import TrainingSetup

    cfg = dataclasses.replace(
        load_config("deepseek-v3"), num_layers=2, d_model=64, num_heads=4, vocab_size=128, context_length=64,
        d_ff=96, dense_layers_first=1, num_experts=4, experts_per_token=2, expert_d_ff=16, shared_experts=1,
        q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    )  # fmt: skip
    B, P, C, h, r, dr, dn, dv = 2, 10, 20, 4, 32, 8, 16, 16
    torch.manual_seed(0)
    model = build_model(cfg, "cpu", setup=TrainingSetup(attention="naive"))
    ids, one = torch.randint(0, 128, (B, P)), torch.randint(0, 128, (B, 1))
    logits, counts = {}, {}
    for absorbed in (False, True):
        cache = StaticKVCache(cfg, B, C, "cpu", absorbed=absorbed)
        prefill(model, ids, cache)
        with FlopCounterMode(display=False, depth=None) as counter:
            logits[absorbed] = decode(model, one, cache)
        counts[absorbed] = {k: int(sum(v.values())) for k, v in counter.get_flop_counts().items()}
    torch.testing.assert_close(logits[True], logits[False], rtol=1e-5, atol=1e-5)
    predicted = {it.key: it.total for it in decode_flops(cfg, P, B, C, program="engine")}
    got = counts[True]
    assert got["Global"] == sum(predicted.values())
    n = P + 1  # keys attended at p = P

    def layers(name):
        return sum(got[f"TransformerLM.layers.{i}.attn.{name}"] for i in range(2))

    assert layers("qk") == predicted["layers.*.attn.qk"] == 2 * 2 * B * h * (r + dr) * n
    assert layers("av") == predicted["layers.*.attn.av"] == 2 * 2 * B * h * r * n
    assert (
        layers("absorb_q") + layers("absorb_o") == predicted["layers.*.attn.kv_b_proj"] == 2 * 2 * B * r * h * (dn + dv)
    )
    assert "TransformerLM.layers.0.attn.kv_b_proj" not in got  # no cached latent re-expanded
    assert counts[False]["Global"] > got["Global"]
