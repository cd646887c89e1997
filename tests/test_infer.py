"""lm-account infer, analytic: hand computations written out from the shapes and the datasheets.

Llama-3-8B (public config): vocab 128,256, 32 layers, d 4,096, 32 heads, 8 KV heads, head_dim 128,
d_ff 14,336, untied.  H100 SXM 80GB (NVIDIA H100 datasheet; Hopper whitepaper): dense BF16 989.4
TFLOP/s, HBM3 3.35 TB/s, 80 GB.
"""

import csv
import io
import json
import re
import subprocess
import sys

import pytest

from lm_accounting.analytic.inference import (
    WeightFormat,
    decode_flops,
    generation_flops,
    kv_bytes,
    prefill_flops,
    sum_min,
    weights_bytes,
)
from lm_accounting.analytic.inference_report import infer
from lm_accounting.config import AccountingError, ModelConfig, load_config

L, D, H, KV, HD, FF, V = 32, 4096, 32, 8, 128, 14336, 128256
# weights one token multiplies by: per layer Q (d·h·hd), K and V (d·kv·hd each), O (h·hd·d), W1 W2 W3 (d·d_ff)
N_MATMUL = L * (D * H * HD + 2 * D * KV * HD + H * HD * D + 3 * D * FF) + D * V
N_PARAMS = N_MATMUL + V * D + (2 * L + 1) * D  # + the embedding table + 65 RMSNorm gains
PEAK, BW = 989_400_000_000_000, 3_350_000_000_000  # H100 SXM: BF16 989.4 TFLOP/s dense, 3.35 TB/s


@pytest.fixture(scope="module")
def llama():
    return load_config("llama-3-8b")


def test_hand_counts_of_the_shapes(llama):
    assert N_PARAMS == 8_030_261_248  # the public Llama-3-8B parameter count
    assert weights_bytes(llama, "bf16") == 2 * N_PARAMS
    # quantised checkpoints keep the embedding table, the head and the norms in bf16; int4 adds, per 128
    # weights of a matrix, an fp16 scale and a packed int4 zero-point: n/2 + 2n/128 + n/256 = 133n/256 bytes
    # (every matrix here is a multiple of 256 elements)
    blocks, table, norms = N_PARAMS - 2 * V * D - 65 * D, 2 * V * D, 65 * D
    assert weights_bytes(llama, "int4") == blocks * 133 // 256 + 2 * (table + norms) == 5_727_854_592
    assert weights_bytes(llama, "fp8") == weights_bytes(llama, "int8") == blocks + 2 * (table + norms)
    every = WeightFormat("int4", embeddings=True)  # the table and head quantised too
    assert weights_bytes(llama, every) == (blocks + table) * 133 // 256 + 2 * norms
    assert weights_bytes(llama, WeightFormat("int4", group=64)) == blocks * 138 // 256 + 2 * (table + norms)
    # TP 2: the 65 norm gains (d each) stay whole on both ranks; everything else halves
    assert weights_bytes(llama, "bf16", tp=2) == 2 * ((N_PARAMS - 65 * D) // 2 + 65 * D)
    # KV cache: K and V, kv·hd each, per layer, per token, 2 bytes
    assert kv_bytes(llama, 2560, 1, "bf16") == 2 * L * KV * HD * 2560 * 2 == 335_544_320
    assert kv_bytes(llama, 2560, 32, "fp8") == 2 * L * KV * HD * 2560 * 32 * 1
    assert kv_bytes(llama, 2560, 32, "bf16", tp=4) == 2 * L * KV * HD * 2560 * 32 * 2 // 4


@pytest.mark.parametrize("p", [0, 1, 2047, 2048, 4000])
def test_decode_flops_closed_form(llama, p):
    """DESIGN §10: decode at position p = 2·b·P_matmul + 4·L·b·(p+1)·H·hd."""
    b = 3
    got = decode_flops(llama, p, b, capacity=8192)
    assert got.total == 2 * b * N_MATMUL + 4 * L * b * (p + 1) * H * HD
    assert got["layers.*.attn.qk"].total == 2 * L * b * H * (p + 1) * HD


def test_prefill_is_the_forward_and_static_attends_over_the_capacity(llama):
    b, P, C = 2, 1000, 1500
    assert prefill_flops(llama, P, b, C).total == 2 * b * P * N_MATMUL + 4 * L * b * P * P * H * HD
    static = prefill_flops(llama, P, b, C, "static")
    assert static.total == 2 * b * P * N_MATMUL + 4 * L * b * P * C * H * HD
    # static decode costs the same at every position: all C slots
    assert decode_flops(llama, 1000, b, C, "static").total == decode_flops(llama, 1400, b, C, "static").total
    assert decode_flops(llama, 1000, b, C, "static").total == 2 * b * N_MATMUL + 4 * L * b * C * H * HD


def test_generation_total_is_the_sum_over_steps(llama):
    P, G, b = 2048, 512, 32
    # G − 1 decode steps at p = P .. P+G−2 attend over p + 1 = P+1 .. P+G−1 keys
    keys = sum(range(P + 1, P + G))
    assert generation_flops(llama, P, G, b) == (G - 1) * 2 * b * N_MATMUL + 4 * L * b * keys * H * HD
    assert generation_flops(llama, P, G, b, "static") == (G - 1) * (2 * b * N_MATMUL + 4 * L * b * (P + G) * H * HD)


def test_sliding_window_decode_reads_only_the_window():
    mistral = load_config("mistral-7b")  # every layer windowed, w = 4096
    w, b = 4096, 1
    n_matmul = 32 * (4096 * 4096 * 2 + 2 * 4096 * 1024 + 3 * 4096 * 14336) + 4096 * 32000
    for p in (100, 4095, 5000, 9000):
        keys = min(p + 1, w)
        assert decode_flops(mistral, p, b, 16384).total == 2 * b * n_matmul + 4 * 32 * b * keys * 32 * 128
    # KV cache: a windowed layer keeps min(C, w) tokens
    assert kv_bytes(mistral, 10_000, 1, "bf16") == 2 * 32 * 8 * 128 * 4096 * 2
    assert generation_flops(mistral, 4000, 200, 1) == 199 * 2 * n_matmul + 4 * 32 * 32 * 128 * (
        sum(min(k, w) for k in range(4001, 4200))
    )


def test_sum_min():
    for lo, hi, cap in [(1, 10, 4), (5, 9, 3), (2, 3, 10), (7, 6, 2), (1, 1, None), (3, 8, None)]:
        assert sum_min(lo, hi, cap) == sum(k if cap is None else min(k, cap) for k in range(lo, hi + 1))


def test_roofline_reproduces_the_hand_computation(llama):
    """llama-3-8b, P = 2048, G = 512, B = 32, bf16 weights and KV, one H100 SXM 80GB."""
    P, G, B = 2048, 512, 32
    r = infer(llama, P, G, B, gpu="h100-80gb", program="forward")
    # bf16 weights read, but the untied embedding table: a row (d·2 bytes) per token, not its V rows
    W = 2 * N_PARAMS - 2 * V * D  # 15,009,849,344 bytes
    kv_token = 2 * L * KV * HD * 2  # 131,072 bytes of K and V per token per sequence
    # 1. prefill: 2·B·P·N_matmul + the P(P+1)/2 query-key pairs a causal kernel computes, 4·hd FLOPs each per
    #    layer, head and sequence; bytes: weights + B·P rows + KV written
    pre_flops = 2 * B * P * N_MATMUL + 4 * L * B * H * HD * (P * (P + 1) // 2)
    pre_bytes = W + 2 * D * B * P + kv_token * P * B
    assert r.roofline["prefill"]["flops"] == pre_flops == 1_018_852_141_957_120
    assert r.roofline["prefill"]["bytes"] == pre_bytes
    ttft = max(pre_flops / PEAK, pre_bytes / BW)  # 1.0298 s compute vs 0.0074 s memory
    assert r.roofline["time_to_first_token_seconds"] == pytest.approx(ttft, rel=1e-12)
    assert r.roofline["prefill"]["bound"] == "compute-bound"
    # 2. decode at p = P: 2·B·N_matmul + 4·L·B·(P+1)·h·hd FLOPs; weights, B rows, KV of P+1 tokens read
    f = 2 * B * N_MATMUL + 4 * L * B * (P + 1) * H * HD
    by = W + 2 * D * B + kv_token * (P + 1) * B
    assert (r.roofline["decode_first"]["flops"], r.roofline["decode_first"]["bytes"]) == (f, by)
    assert f / by < PEAK / BW  # intensity 20.9 < ridge 295.3
    assert r.roofline["decode_first"]["bound"] == "memory-bound"
    assert r.roofline["decode_first"]["seconds"] == pytest.approx(by / BW, rel=1e-12)  # 7.36 ms
    # 3. every step memory-bound: mean latency = Σ_p (W + kv·(p+1)·B) / BW / (G−1)
    steps = G - 1
    mean = (steps * (W + 2 * D * B) + kv_token * B * sum(range(P + 1, P + G))) / BW / steps
    assert r.roofline["decode_mean_seconds"] == pytest.approx(mean, rel=1e-9)
    assert r.roofline["tokens_per_s"] == pytest.approx(B / mean, rel=1e-9)  # ~4,167 tokens/s
    assert r.roofline["decode_bound"] == "memory-bound"
    # 4. knee: B·f1·BW >= PEAK·(W + B·k1) has no solution when f1·BW <= PEAK·k1 (f1, k1 per sequence)
    f1, k1 = 2 * N_MATMUL + 4 * L * (P + 1) * H * HD, kv_token * (P + 1)
    assert f1 * BW < PEAK * k1 and r.roofline["knee_batch_first"] is None
    # without KV reads the knee is B = ⌈PEAK·W / (f1·BW)⌉ = 276 (≈ the ridge: 2 FLOPs per 2-byte weight; the
    # rows a token reads of the embedding table left out of the fixed bytes)
    assert r.roofline["knee_batch_weights_only"] == -(-PEAK * W // (f1 * BW)) == 276


def test_knee_at_a_short_context(llama):
    """At P = 16 the per-sequence intensity clears the ridge: B* = ⌈PEAK·W / (f1·BW − PEAK·k1)⌉."""
    P, W, kv_token = 16, 2 * N_PARAMS - 2 * V * D, 2 * L * KV * HD * 2  # the untied table: a row a token
    r = infer(llama, P, 2, 1)
    f1, k1 = 2 * N_MATMUL + 4 * L * (P + 1) * H * HD, kv_token * (P + 1)
    assert r.roofline["knee_batch_first"] == -(-PEAK * W // (f1 * BW - PEAK * k1))


def test_max_batch_is_the_largest_that_fits(llama):
    r = infer(llama, 2048, 512, 1, budget=80_000_000_000, program="forward")
    for prefill_batch, best in ((None, r.max_batch), (1, r.max_batch_serving)):
        from lm_accounting.analytic.inference_report import _memory

        def peak(b, pb=prefill_batch):
            return _memory(llama, 2048, 512, b, "bf16", "bf16", 1, "filled", pb)["peak"]

        assert peak(best) <= 80_000_000_000 < peak(best + 1)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--prompt", "8000", "--generate", "512"], "exceeds llama-3-8b's context of 8,192"),
        (["--prompt", "20", "--generate", "5", "--tp", "3"], "--tp 3 does not divide the 8 KV heads"),
        (["--prompt", "20", "--generate", "5", "--gpu", "h100-80"], "did you mean 'h100-80gb'"),
        (["--prompt", "20", "--generate", "5", "--cache", "static", "--attention", "sdpa"], "use --attention naive"),
        (["--prompt", "20", "--generate", "5", "--weights", "fp32"], "no CUDA kernel"),  # sdpa, fp32, GQA
        (["--prompt", "20", "--generate", "5", "--weights", "int3"], "int3"),
    ],
)
def test_bad_input_is_one_line_exit_2(run_cli, args, needle):
    r = run_cli("infer", "llama-3-8b", *args)
    assert r.code == 2 and r.out == ""
    assert r.err.count("\n") == 1 and needle in r.err


def test_the_headline_command_imports_no_heavy_library():
    code = (
        "import sys, io, contextlib\n"
        "from lm_accounting.cli import main\n"
        "args = ['infer', 'llama-3-8b', '--prompt', '2048', '--generate', '512', '--batch', '32', '--gpu', 'h100-80gb']\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try: main(args)\n"
        "    except SystemExit as e: assert e.code == 0, e.code\n"
        "print(','.join(m for m in ('torch', 'matplotlib', 'pandas', 'numpy', 'fvcore') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == ""


def test_latent_attention_decode_expands_every_cached_position():
    """MLA (transformers v5's cache: the normed latent and the RoPE key): a decode step at p runs kv_b_proj
    over the p + 1 cached latents and attends with h heads of d_nope + d_rope (QKᵀ) and d_v (AV)."""
    h, d, r_kv, dn, dr, dv, L, V, ff = 4, 32, 16, 8, 4, 6, 2, 96, 64
    cfg = ModelConfig(
        vocab_size=V, context_length=64, num_layers=L, d_model=d, num_heads=h, d_ff=ff,
        kv_lora_rank=r_kv, qk_nope_head_dim=dn, qk_rope_head_dim=dr, v_head_dim=dv,
    )  # fmt: skip
    b, p = 3, 20
    per_token = L * (d * h * (dn + dr) + d * (r_kv + dr) + h * dv * d + 3 * d * ff) + d * V  # q, kv_a, o, FFN; head
    expand = L * r_kv * h * (dn + dv)  # kv_b_proj weights, applied to every cached position
    attention = L * h * ((dn + dr) + dv)  # QKᵀ and AV per query-key pair
    n = p + 1
    assert decode_flops(cfg, p, b, 40).total == 2 * b * (per_token + expand * n + attention * n)
    assert kv_bytes(cfg, 40, b, "bf16") == L * (r_kv + dr) * 40 * b * 2
    assert kv_bytes(cfg, 40, b, "bf16", tp=4) == kv_bytes(cfg, 40, b, "bf16")  # the latent is replicated


def test_deepseek_v3_answers(run_cli):
    r = run_cli("infer", "deepseek-v3", "--prompt", "2048", "--generate", "512", "--batch", "8",
                "--weights", "fp8", "--gpu", "h200", "--tp", "8")  # fmt: skip
    assert r.code == 0, r.err
    assert "estimate" in r.out  # MoE + MLA step temporaries: the course twin's


def test_tiny_config_records_and_frame():
    cfg = ModelConfig(vocab_size=64, context_length=64, num_layers=2, d_model=32, num_heads=4, d_ff=64)
    r = infer(cfg, 8, 4, 2)
    assert r.to_dict()["schema"] == "lm-accounting/infer/5"
    rows = r.records()
    assert {"section", "key", "label", "value", "unit"} == set(rows[0])
    with pytest.raises(AccountingError):
        infer(cfg, 8, 4, 2, semantics="dynamic")


@pytest.mark.slow
def test_over_budget_is_an_answer_and_meta_measures_it(run_cli):
    """A query that does not fit the budget is an answer (exit 0, the whole analysis, "OVER BUDGET" and
    what fits), not bad input; a meta run allocates nothing, so it is measured too.  gpt2-small has
    190,460,160 parameters: bf16 weights alone are 2 · 190,460,160 = 380,920,320 bytes, over a 100 MB
    budget.  Only a cuda run is refused (it would run out of the GPU's memory)."""
    weights = 2 * 190_460_160
    args = ("infer", "gpt2-small", "--prompt", "24", "--generate", "5", "--budget", "100MB", "--program", "forward")
    plain = run_cli(*args)
    assert plain.code == 0 and "OVER BUDGET: batch 1 needs" in plain.out and "not even one sequence fits" in plain.out
    d = json.loads(run_cli(*args, "--format", "json").out)
    assert d["fits_budget"] is False and d["max_batch"] == 0 and d["memory"]["weights"] == weights
    refused = run_cli(*args, "--measure", "cuda")  # refused before any GPU is looked for
    assert refused.code == 2 and refused.out == "" and "over the 100.000 MB" in refused.err
    r = run_cli(*args, "--measure", "meta")
    assert r.code == 0, r.err
    assert "OVER BUDGET: batch 1 needs" in r.out and "not even one sequence fits" in r.out
    assert "measured anyway: a meta run does not use the GPU" in r.out
    assert "Predicted vs measured on meta" in r.out and not re.search(r"\bNO\b", r.out)  # every row equal
    rows = list(csv.DictReader(io.StringIO(run_cli(*args, "--measure", "meta", "--format", "csv").out)))
    value = {(x["section"], x["key"]): x["value"] for x in rows}
    assert int(value["memory", "weights"]) == weights
    assert int(value["capacity", "budget"]) == 100_000_000 < int(value["memory", "peak"])
    assert int(value["capacity", "max_batch"]) == 0


def test_over_budget_at_the_boundary():
    """The boundary: a budget of exactly the peak fits; one byte less is over, and ``over_budget``
    says so (with the batch that does fit)."""
    cfg = ModelConfig(vocab_size=64, context_length=64, num_layers=2, d_model=32, num_heads=4, d_ff=64)
    peak = infer(cfg, 8, 4, 2).memory["peak"]
    assert infer(cfg, 8, 4, 2, budget=peak).over_budget is None
    over = infer(cfg, 8, 4, 2, budget=peak - 1)
    assert over.over_budget.startswith("batch 2 needs") and over.max_batch == 1


def test_a_batch_over_the_budget_is_analysed_per_attention(run_cli, llama):
    """Llama-3-8B, P 2,048, G 512, B 512 on an 80 GB H100 does not fit: the analysis is printed (exit 0,
    was exit 2) with the largest batch that fits, checked by its definition peak(b) <= budget <
    peak(b + 1), prefilled together and one at a time.  With naive attention (the B·h·P² scores of the
    prefill) it is 43, with the fused kernel (sdpa, the default) 71."""
    from lm_accounting.analytic.inference_report import _memory

    budget = 80_000_000_000
    args = ("infer", "llama-3-8b", "--prompt", "2048", "--generate", "512", "--batch", "512", "--budget", "80GB")
    args += ("--program", "forward")
    r = run_cli(*args)
    assert r.code == 0 and r.err == "" and "attention sdpa" in r.out
    assert "OVER BUDGET: batch 512 needs" in r.out and "Roofline on h100-80gb" in r.out
    for attention, best in (("sdpa", 71), ("naive", 43)):
        got = json.loads(run_cli(*args, "--attention", attention, "--format", "json").out)
        assert got["attention"] == attention and got["max_batch"] == best and got["fits_budget"] is False

        def peak_at(b, pb=None, attention=attention):
            return _memory(llama, 2048, 512, b, "bf16", "bf16", 1, "filled", pb, attention)["peak"]

        assert peak_at(best) <= budget < peak_at(best + 1)
        serving = got["max_batch_prefill_one_at_a_time"]
        assert peak_at(serving, 1) <= budget < peak_at(serving + 1, 1)
        assert f"the largest batch that fits is {best}" in got["over_budget"]


def test_attention_default_and_choices(llama):
    """sdpa by default (filled semantics: what a serving engine runs); naive under 'static' (transformers'
    StaticCache with eager attention), where sdpa is refused.  The FLOPs do not depend on it; the prefill
    temporaries do: naive holds the B·h·P² scores (bf16) of a layer, sdpa never does."""
    sdpa, naive = (
        infer(llama, 8000, 100, program="forward"),
        infer(llama, 8000, 100, attention="naive", program="forward"),
    )
    assert (sdpa.attention, naive.attention) == ("sdpa", "naive")
    assert infer(llama, 20, 5, semantics="static").attention == "naive"
    with pytest.raises(AccountingError, match="--attention naive"):
        infer(llama, 20, 5, semantics="static", attention="sdpa")
    with pytest.raises(AccountingError, match="unknown attention"):
        infer(llama, 20, 5, attention="flash")
    assert sdpa.prefill.total == naive.prefill.total and sdpa.generation_flops == naive.generation_flops
    scores = 32 * 8000 * 8000 * 2  # one layer's (B, h, P, P) bf16 scores: 4.096 GB
    assert naive.memory["prefill_temporaries"] - sdpa.memory["prefill_temporaries"] >= 2 * scores
    assert sdpa.memory["prefill_temporaries"] < scores
    assert sdpa.to_dict()["attention"] == "sdpa" and any(
        "Attention (--attention)" in c for c in sdpa.to_dict()["conventions"]
    )


def test_sdpa_prefill_memory_by_hand(llama):
    """--attention sdpa (the default), Llama-3-8B, P 2,048, G 512, bf16 weights and KV on an 80 GB H100.
    The fused kernel holds no P×P scores: inside a layer's attention at most x, ln1's output, q, k, v, the
    kernel's output, its merge copy and the fp32 logsumexp (B·h·P·4 + flash's 24-byte RNG state) are live;
    in the FFN x, ln2's output and three d_ff tensors.  Both are below the LM head's moment, so the prefill
    temporaries are 8·P position ids (int64, not per sequence) + B·P·(2·d + V)·2: the residual stream,
    ln_final's output and the logits.  peak(B) = weights + RoPE tables (cos and sin, fp32, 8,192 × 64 each)
    + input ids (B·P·8) + KV cache (B·2·L·kv·hd·C·2) + the prefill temporaries, and the largest B with
    peak(B) <= 80 GB is 71 (naive attention: 43, test_a_batch_over_the_budget_is_analysed_per_attention)."""
    P, G, e = 2048, 512, 2
    C, W, rope = P + G, 2 * N_PARAMS, 2 * 8192 * (HD // 2) * 4
    assert W == 16_060_522_496

    def temps(b):
        return 8 * P + b * P * (2 * D + V) * e

    def peak(b):
        return W + rope + b * P * 8 + b * 2 * L * KV * HD * C * e + temps(b)

    attention = 8 * P + P * e * (2 * D + 3 * H * HD + 2 * KV * HD) + H * P * 4 + 24  # per sequence, B = 1
    ffn = 8 * P + P * e * (2 * D + 3 * FF)
    assert max(attention, ffn) < temps(1) == 558_907_392
    for device in ("cuda", "meta"):  # CUDA's flash and the CPU kernel differ only inside the attention
        one = infer(llama, P, G, 1, device=device, program="forward")
        assert one.attention == "sdpa" and one.memory["prefill_temporaries"] == temps(1)
    r = infer(llama, P, G, 71, budget=80_000_000_000, program="forward")
    assert r.memory["prefill_temporaries"] == temps(71) and r.memory["prefill_peak"] == r.memory["peak"] == peak(71)
    assert peak(71) <= 80_000_000_000 < peak(72) and r.max_batch == 71
    # the default budget: the H100's CUDA total, 79.11 GiB = 84,943,715,696 bytes, less the 3 GB allowance
    default = infer(llama, P, G, 1, program="forward")
    assert default.budget == 81_943_715_696 and peak(73) <= 81_943_715_696 < peak(74) and default.max_batch == 73


def test_fp32_gqa_fused_attention_is_refused_only_for_cuda(llama):
    """No CUDA kernel fuses fp32 with grouped KV heads; torch's CPU flash kernel does (a meta/cpu run)."""
    with pytest.raises(AccountingError, match="no CUDA kernel"):
        infer(llama, 20, 5, weights="fp32", kv_dtype="fp32")
    assert infer(llama, 20, 5, weights="fp32", kv_dtype="fp32", device="meta").attention == "sdpa"
    assert infer(llama, 20, 5, weights="fp32", kv_dtype="fp32", attention="naive").attention == "naive"


def _suggested_runs(message):
    """The command lines a length refusal suggests: each "--prompt P --generate G" example, and the
    --context / --set flags it names, in order."""
    runs = [m.split() for m in re.findall(r"--prompt \d+ --generate \d+", message)]
    flags = re.findall(r"--context \d+|--set \w+=\d+", message)
    return runs, [f.split() for f in flags]


@pytest.mark.parametrize(
    "model,args",
    [
        ("openai-gpt2", ["--prompt", "1000", "--generate", "100"]),  # learned positions, 1,024 rows
        ("openai-gpt2", ["--prompt", "5000", "--generate", "3000"]),  # both longer than the table
        ("openai-gpt2", ["--prompt", "500", "--generate", "100", "--context", "512"]),  # context below the table
        ("llama-3-8b", ["--prompt", "10000", "--generate", "100"]),  # RoPE: any context
    ],
)
def test_a_length_refusal_leads_somewhere_valid(run_cli, model, args):
    """Issue 12: openai-gpt2 refused P + G > 1,024 with "use --context", which a learned position table
    refuses in turn.  Every way out the message names must run: its --prompt/--generate examples (at the
    model's own context) and its --context/--set flags (on the original prompt and generation)."""
    refused = run_cli("infer", model, *args)
    assert refused.code == 2 and refused.out == ""
    message = refused.err
    examples, flags = _suggested_runs(message)
    assert examples or flags, message
    base = [a for a in args if a not in ("--context", "512")] if "--context" in args else args
    for example in examples:
        assert run_cli("infer", model, *example).code == 0, example
    if flags:
        r = run_cli("infer", model, *base, *(x for f in flags for x in f))
        assert r.code == 0, (flags, r.err)
    if model == "openai-gpt2" and "--context" not in args:
        assert "no --context can go past" in message and "1,024 learned positions" in message
        assert run_cli("infer", model, *args, "--context", str(int(args[1]) + int(args[3]))).code == 2
