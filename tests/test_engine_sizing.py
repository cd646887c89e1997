"""vLLM's start-up KV-cache sizing (``analytic.engine_sizing``), written out by hand, and the published runs.

The rules are vLLM v0.11's (engine_sizing's module docstring cites each file).  Llama-3-8B and the H100's
CUDA total are test_infer.py's; Llama-3.1-8B is Llama-3-8B with a 131,072-position rotary cache.
"""

import dataclasses
from fractions import Fraction

import pytest
from test_infer import FF, HD, KV, N_PARAMS, D, L, V
from test_transformers_truth import CONFIGS

from lm_accounting.analytic.engine_runs import RUNS, compare
from lm_accounting.analytic.engine_sizing import VllmOptions, vllm_sizing
from lm_accounting.analytic.inference_report import infer
from lm_accounting.config import AccountingError, load_config
from lm_accounting.gpus import gpu
from lm_accounting.hf_config import config_from_hf

GIB = 2**30
H100_TOTAL = 7911 * GIB // 100  # torch's "total capacity of 79.11 GiB" (gpus.CUDA_TOTALS)


def size(cfg, g="h100-80gb", prompt=1000, generate=100, **options):
    kw = dict(weights="bf16", kv_dtype="bf16", tp=1, prompt=prompt, generate=generate)
    return vllm_sizing(cfg, gpu(g), VllmOptions(**options), **kw)


def test_llama_3_8b_on_an_h100_by_hand():
    """`vllm serve meta-llama/Meta-Llama-3-8B` on an H100 80GB, --max-model-len 8192, the defaults:
    0.9 of the CUDA total; 8,192 batched tokens and 1,024 sequences (a GPU of >= 70 GiB, not an A100)."""
    s = size(load_config("llama-3-8b"), max_model_len=8192)
    # 1. requested = ⌊total × 0.9⌋
    assert s.total == H100_TOTAL == 84_943_715_696 and s.requested == H100_TOTAL * 9 // 10 == 76_449_344_126
    # 2. weights: the bf16 parameters + the rotary cos_sin cache, 8,192 positions × 128 × 2 B
    assert s.weights == 2 * N_PARAMS + 8192 * HD * 2 == 16_062_619_648  # 14.96 GiB, the figure vLLM logs
    # 3. activation, a T = 8,192-token forward: at the FFN the block's input, the mid stream and ln2's output
    #    (3·d) beside w1's output, its sigmoid and the SiLU (3·d_ff), bf16, with the int64 positions (8·T)
    T, R = 8192, 1024
    assert s.activation_forward == 8 * T + T * (3 * D + 3 * FF) * 2 == 906_035_200
    #    the sampler on R rows: bf16 logits and their fp32 copy, with the T + R hidden rows (bf16) alive
    assert s.activation_sampler == R * V * (2 + 4) + (T + R) * D * 2 == 863_502_336
    # 4. the cache: requested − weights − the larger activation − 0.1 GiB of non-torch memory
    available = 76_449_344_126 - 16_062_619_648 - 906_035_200 - GIB // 10
    assert s.kv_cache_memory == available == 59_373_315_096  # 55.30 GiB
    # 5. a page: 16 tokens × 8 KV heads × 128 × 2 (K and V) × 2 B; one block spans the 32 layers (2 MiB)
    assert s.page_bytes == 16 * KV * HD * 2 * 2 == 65_536 and s.group_size == L and s.groups == 1
    assert s.kv_cache_blocks == available // 65_536 // 32 == 28_311
    assert s.kv_cache_tokens == 28_311 * 16 == 452_976
    assert s.blocks_per_request == 8192 // 16 and s.max_concurrency == pytest.approx(28_311 / 512)
    # a request of P + G − 1 = 1,099 positions takes ⌈1,099 / 16⌉ = 69 blocks: 410 of them at once
    assert s.request_blocks == 69 and s.requests_at_prompt == 28_311 // 69 == 410
    assert s.starts and s.problem is None


def test_latent_attention_pages_one_latent_in_blocks_of_64():
    """MLA (DeepSeek-V3): one "head" of kv_lora_rank + qk_rope_head_dim = 576 values, no factor 2, replicated
    under tp; FlashMLA's 64-token blocks."""
    s = size(load_config("deepseek-v3"), "h200", max_model_len=4096)
    assert s.block_size == 64 and s.page_bytes == 64 * (512 + 64) * 2 == 73_728
    assert s.blocks_per_request == 4096 // 64


def test_windowed_and_full_layers_share_one_pool_in_groups():
    """Gemma-3-1B: 26 layers, every 6th full (4 full, 22 windowed of 512).  vLLM groups by spec: group size =
    min(4, 22) = 4; the full layers make ⌈4/4⌉ = 1 group, the windowed ⌈22/4⌉ = 6; blocks = available // page //
    4; tokens = blocks // 7 × 16; a request of N tokens needs ⌈N/16⌉ blocks in the full group and
    ⌈min(w − 1 + T, N)/16⌉ + 1 in each windowed one (T = 8,192 batched tokens)."""
    cfg = config_from_hf(CONFIGS["gemma-3-1b"][0], name="gemma-3-1b")
    assert (cfg.num_layers, cfg.windowed_layers, cfg.sliding_window) == (26, 22, 512)
    s = size(cfg, max_model_len=32768)
    assert (s.group_size, s.groups) == (4, 7)
    page = 16 * cfg.kv_heads * cfg.d_head * 2 * 2
    assert s.page_bytes == page and s.kv_cache_blocks == s.kv_cache_memory // page // 4
    assert s.kv_cache_tokens == s.kv_cache_blocks // 7 * 16
    assert s.blocks_per_request == 32768 // 16 + 6 * (-(-min(511 + 8192, 32768) // 16) + 1) == 2048 + 6 * 545


def test_a_cache_too_small_for_one_request_is_an_answer_not_a_crash():
    """Llama-3.1-8B at its full 131,072 tokens on a 24 GB card: vLLM refuses to start ("To serve at least one
    request with the models's max seq len ..."); we say so, and the longest length that fits."""
    s = size(load_config("llama-3.1-8b"), "rtx-4090")
    assert not s.starts and "vLLM stops at start-up" in s.problem
    longest = int(s.problem.rsplit("about ", 1)[1].split()[0].replace(",", ""))
    assert -(-longest // 16) <= s.kv_cache_blocks < -(-(longest + 1) // 16)


@pytest.mark.parametrize("run", RUNS, ids=[r.name for r in RUNS])
def test_published_runs(run):
    """Every published start-up (engine_runs.RUNS) beside ours.  Weights: the log's two decimals.  The
    'arithmetic' rows (the log's KV memory given): the blocks within the log's rounding (±0.005 GiB of 2 MiB
    or 2.5 MiB blocks is ±2 blocks).  The 'predicted' rows carry our activation estimate: the error is
    published in reports/inference/engine_startup.md, and bounded here so that a change of it is seen."""
    row = compare(run)
    if run.published.get("weights_gib") is not None:
        assert round(row["weights_gib_ours"], 2) == run.published["weights_gib"]
    if run.kind == "arithmetic" and run.tp > 1:  # vLLM logs rank 0's memory but keeps the fewest blocks over ranks
        assert 0 <= row["tokens_error"] < 0.02
    elif run.kind == "arithmetic":
        block = row["kv_gib_ours"] * GIB / (row["tokens_ours"] / 16)  # bytes per block
        assert abs(row["tokens_ours"] - run.published["tokens"]) <= 2 * 16 * (0.005 * GIB / block + 1)
        assert round(row["concurrency_ours"], 2) == pytest.approx(run.published["concurrency"], abs=0.011)
    elif row["engine"] == "sglang":  # we leave out what the ranks hold beside the weights before the pool
        assert 0 < row["tokens_error"] < 0.10 and 0 < row["k_gib_error"] < 0.10
    else:
        assert 0 < row["kv_gib_error"] < 0.05  # we under-estimate what vLLM profiles, so our cache is larger


def test_the_31_8b_rotary_cache_is_in_the_weights():
    """ "Model loading took 14.9888 GiB" (Llama-3.1-8B): 8,030,261,248 parameters × 2 B + 131,072 × 128 × 2 B."""
    s = size(load_config("llama-3.1-8b"), "a100-40gb", max_model_len=131072)
    assert s.weights == 8_030_261_248 * 2 + 131_072 * 128 * 2 == 16_094_076_928
    assert f"{s.weights / GIB:.4f}" == "14.9888"


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        (dict(utilization=Fraction(0)), r"outside \(0, 1\]"),
        (dict(utilization=Fraction(11, 10)), r"outside \(0, 1\]"),
        (dict(max_model_len=9000), "exceeds llama-3-8b's context"),
        (dict(max_model_len=1000), "exceed --max-model-len 1,000"),
    ],
)
def test_refusals(options, needle):
    with pytest.raises(AccountingError, match=needle):
        size(load_config("llama-3-8b"), **options)


def test_infer_carries_the_sizing_and_refuses_another_program():
    llama = load_config("llama-3-8b")
    r = infer(llama, 1000, 100, engine=VllmOptions(max_model_len=8192))
    d = r.to_dict()["engine"]
    assert (d["kv_cache_tokens"], d["kv_cache_blocks"]) == (452_976, 28_311)
    assert d["max_concurrency"] == pytest.approx(28_311 / 512)
    with pytest.raises(AccountingError, match="it runs --program engine, not generate"):
        infer(llama, 1000, 100, program="generate", engine=VllmOptions())
    assert dataclasses.replace(VllmOptions(), max_num_seqs=8).max_num_seqs == 8


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--max-num-seqs", "8"], "add --engine vllm"),
        (["--engine", "vllm", "--gpu-memory-utilization", "0.9", "--allowance", "1GB"], "give one"),
        (["--engine", "vllm", "--gpu-memory-utilization", "0"], "(0, 1]"),
        (["--engine", "vllm", "--max-model-len", "9000"], "exceeds llama-3-8b's context"),
        (["--engine", "vllm", "--program", "forward"], "not forward"),
        (["--engine", "vllm", "--non-torch-memory", "1"], "needs a number and a unit"),
        (["--engine", "vllm", "--max-num-seqs", "9000"], "must be greater than or equal to max_num_seqs"),
        (["--mem-fraction-static", "0.8"], "add --engine sglang"),
        (["--engine", "sglang"], "needs --mem-fraction-static"),
        (["--engine", "sglang", "--mem-fraction-static", "0.8", "--max-model-len", "4096"], "not SGLang's"),
        (["--engine", "vllm", "--max-model-len", "109"], "exceed --max-model-len 109"),
        (["--engine", "vllm", "--cache", "static"], "imply transformers' generate"),
        (["--efficiency", "1e-15"], "[0.001, 1]"),
        (["--group-size", "64"], "applies to int4 weights"),
        (["--weights", "int4", "--group-size", "100"], "does not divide the input width 4,096"),
        (["--quantize-embeddings"], "applies to quantised weights"),
        (["--weights", "fp8", "--gpu", "a100"], "or --compute bf16"),
        (["--weights", "fp8", "--compute", "int8"], "valid for fp8: fp8, bf16"),
        (["--layers", "2", "--weights", "int4", "--measure", "meta"], "one dtype"),  # before the estimate line
    ],
)
def test_bad_engine_input_is_one_line_exit_2(run_cli, args, needle):
    r = run_cli("infer", "llama-3-8b", "-P", "100", "-G", "10", *args)
    assert r.code == 2 and r.out == "" and needle in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_the_roofline_bounds_every_published_tensorrt_llm_run():
    """TensorRT-LLM's 33 published H100 throughputs (Llama-3.1-8B, -70B tp 2, -405B tp 8, FP8) never exceed
    ``infer``'s throughput bound with an fp8 KV cache; with a bf16 one the published exceeds it on the long
    generations of the 8B (the runs held more sequences than a bf16 cache allows).  The issue's check: the 8B at
    2,048 in / 128 out, 3,495.05 tokens/s published in this version of the table (3,450 in the one the issue
    quotes), is under the bound of fp8 w8a8; weight-only fp8 (bf16 compute, bf16 KV) would bound it at about 3,070,
    below what TensorRT-LLM reached: the run computed in FP8, as the roofline at the FP8 peak says it can."""
    from lm_accounting.analytic.engine_runs import throughput_rows

    rows = throughput_rows()
    assert len(rows) == 33
    assert all(r["published_tokens_per_s"] <= r["bound_fp8_kv"] for r in rows)
    assert any(r["published_tokens_per_s"] > r["bound_bf16_kv"] for r in rows)
    (row,) = [r for r in rows if (r["model"], r["input"], r["output"]) == ("llama-3.1-8b", 2048, 128)]
    assert row["published_tokens_per_s"] == 3495.05 < row["bound_bf16_kv"] < row["bound_fp8_kv"]
    llama = load_config("llama-3.1-8b")
    w8a8 = infer(llama, 2048, 128, weights="fp8").roofline["throughput_bound_tokens_per_s"]
    weight_only = infer(llama, 2048, 128, weights="fp8", compute="bf16").roofline["throughput_bound_tokens_per_s"]
    issue, published = 3450, row["published_tokens_per_s"]  # the issue's quote, this version's figure
    assert weight_only < issue < published < w8a8


def test_what_stops_vllm_at_start_up():
    """Worker.init_device's check (free memory at start-up below total × utilisation: the CUDA context and NCCL
    hold about 0.53 GiB, so 1.0 never starts), a given cache that does not fit beside the weights, and
    check_enough_kv_cache_memory's sum over layers (no group padding)."""
    llama = load_config("llama-3-8b")
    assert not size(llama, utilization=Fraction(1)).starts
    assert size(llama, utilization=Fraction(99, 100)).starts
    too_big = size(llama, kv_cache_memory=200 * 10**9)
    assert not too_big.starts and "out of memory" in too_big.problem
    # Gemma-3-1B (4 full, 22 windowed of 512), 720 tokens, T 8,192: full layers need ⌈720/16⌉ = 45 pages, windowed
    # ⌈min(511 + 8,192, 720)/16⌉ + 1 = 46: 4·45 + 22·46 = 1,192 pages <= 1,280 given, so vLLM starts, although
    # the padded groups (2 + 6 of 4 layers) would need 321 blocks of the 320 the pool has
    gemma = config_from_hf(CONFIGS["gemma-3-1b"][0], name="gemma-3-1b")
    page = 16 * gemma.kv_heads * gemma.d_head * 2 * 2
    s = size(gemma, prompt=100, generate=10, max_model_len=720, kv_cache_memory=1280 * page)
    assert s.starts and s.kv_cache_blocks == 320 and s.blocks_per_request == 321


def test_mla_blocks_follow_the_gpu():
    """FlashMLA (Hopper) forces 64-token blocks, CUTLASS MLA (Blackwell) 128; an A100 keeps 16."""
    ds = load_config("deepseek-v3")
    assert [size(ds, g, max_model_len=4096).block_size for g in ("h100-80gb", "h200", "a100-80gb")] == [64, 64, 16]


def test_sglang_pool_by_hand():
    """SGLang's pool: KV = free before the weights load × mem_fraction_static − weights (0.5.23's
    rest_memory = free_after_load − free_before_load × (1 − mfs)); a token's cell is kv_heads·(d_head + d_v)·L·bytes
    (Llama-3-8B bf16: 8·256·32·2 = 131,072 B); free before load = the CUDA total less 0.53 GiB (assumed)."""
    from lm_accounting.analytic.engine_sizing import STARTUP_USED, SglangOptions, sglang_sizing

    llama = load_config("llama-3-8b")
    kw = dict(weights="bf16", kv_dtype="bf16", tp=1, prompt=2048, generate=512)
    s = sglang_sizing(llama, gpu("h100-80gb"), SglangOptions(Fraction(85, 100)), **kw)
    free = H100_TOTAL - STARTUP_USED
    assert STARTUP_USED == 53 * GIB // 100 and s.pre_load_free == free
    kv = free - 2 * N_PARAMS - int(free * Fraction(15, 100))
    assert s.kv_cache_memory == kv and s.cell_bytes == 8 * 256 * 32 * 2 == 131_072
    assert s.kv_cache_tokens == kv // 131_072 and s.k_bytes == s.v_bytes == s.kv_cache_tokens * 65_536
    assert s.requests_at_prompt == s.kv_cache_tokens // 2559 and s.starts
    tight = sglang_sizing(
        llama, gpu("h100-80gb"), SglangOptions(Fraction(15, 100)), **kw
    )  # 12.7 GB < 16.1 GB of weights
    assert not tight.starts and "Not enough memory" in tight.problem
