"""The view of an ``Inference``: FLOPs per phase, memory per rank, capacity and the roofline."""

from __future__ import annotations

import math

from ..analytic.engine_sizing import SGLANG_SOURCE, VllmSizing
from ..analytic.inference import engine_block
from ..analytic.inference_memory import exact_for
from ..analytic.inference_report import CONVENTIONS, Inference
from ..provenance import CUDA
from ..units import fmt_bytes
from .account import describe_config
from .tables import Column, Table, View
from .words import plural

PROGRAM_WORDS = {
    "engine": "a serving engine's (vLLM, SGLang): last-token logits, a paged cache, a causal fused kernel"
    " (prefill FLOPs count the attended pairs)",
    "generate": "transformers' generate(): last-token logits (logits_to_keep = 1), its cache of P + G − 1 positions",
    "forward": "the model's full forward: logits at every prompt position, a cache of P + G positions",
}


def engine_table(r: Inference) -> Table:
    """vLLM's start-up sizing (``engine_sizing.VllmSizing``): what its logs print, line by line."""
    e = r.engine
    rows_of = min(e.max_num_batched_tokens, e.max_num_seqs)
    weights = ("− weights (incl. the rotary cos_sin cache)", e.weights, e.weights)
    activation = [
        (f"− activation peak, estimated: the {e.max_num_batched_tokens:,}-token forward", e.activation_forward,
         e.activation_forward),
        (f"  or the sampler on {plural(rows_of, 'row')}", e.activation_sampler, e.activation_sampler),
    ]  # fmt: skip
    if e.kv_cache_memory_given:
        rows = [
            ("CUDA total (the GPU table)", e.total, e.total),
            *((label.removeprefix("− "), v, w) for label, v, w in (weights, *activation)),
            ("KV cache memory (--kv-cache-memory, as given: no utilisation arithmetic)", e.kv_cache_memory,
             e.kv_cache_memory),
        ]  # fmt: skip
    else:
        last = (
            ("= KV cache memory", e.kv_cache_memory, e.kv_cache_memory)
            if e.kv_cache_memory >= 0
            else ("= KV cache memory: none, short by", e.shortfall, e.shortfall)
        )
        rows = [
            ("CUDA total (the GPU table)", e.total, e.total),
            (f"× gpu_memory_utilization {float(e.utilization):g}", e.requested, e.requested),
            weights,
            *activation,
            ("− non-torch memory (an input: --non-torch-memory)", e.non_torch, e.non_torch),
            ("− CUDA graphs (an input: --cuda-graph-memory)", e.cuda_graphs, e.cuda_graphs),
            last,
        ]
    concurrency = math.floor(e.max_concurrency * 100) / 100  # vLLM prints 2 decimals; floored, 0.997 is not 1.00
    notes = [
        (
            f"GPU KV cache size: {e.kv_cache_tokens:,} tokens ({plural(e.kv_cache_blocks, 'block')} of {e.block_size} "
            f"tokens, {e.page_bytes:,} B a layer; {plural(e.groups, 'layer group')} of {e.group_size})"
        ),
        (
            f"Maximum concurrency for {e.max_model_len:,} tokens per request: {concurrency:.2f}x; requests of "
            f"{r.capacity:,} cached positions ({plural(e.request_blocks, 'block')} each): {e.requests_at_prompt:,} "
            f"at once, at most --max-num-seqs {e.max_num_seqs:,}"
        ),
        "vLLM sizes its pool by --gpu-memory-utilization; --allowance and --budget apply to the memory table above",
    ]
    if e.problem:
        notes.append(f"VLLM WOULD NOT START: {e.problem}")
    title = "vLLM start-up sizing (v0.11 rules; the activation peak and non-torch memory are measured by vLLM)"
    return Table(title, [Column("item"), Column("bytes", "int"), Column("size", "bytes")], rows, notes)


def sglang_table(r: Inference) -> Table:
    """SGLang's KV pool (``engine_sizing.SglangSizing``): its formula, line by line, and what its log prints."""
    e = r.engine
    rows = [
        ("CUDA total (the GPU table)", e.total, e.total),
        ("free before the weights load (less the CUDA context and NCCL, assumed)", e.pre_load_free, e.pre_load_free),
        ("− weights", e.weights, e.weights),
        (f"− slack: free × (1 − mem_fraction_static {float(e.mem_fraction_static):g})", e.slack, e.slack),
        ("= KV pool" if e.kv_cache_memory >= 0 else "= KV pool: none, short by", abs(e.kv_cache_memory),
         abs(e.kv_cache_memory)),
    ]  # fmt: skip
    notes = [
        (
            f"KV Cache is allocated. #tokens: {e.kv_cache_tokens:,} ({e.cell_bytes:,} B a token over this rank's "
            f"layers), K size: {e.k_bytes / 2**30:,.2f} GiB, V size: {e.v_bytes / 2**30:,.2f} GiB"
        ),
        (
            f"requests of {e.request_tokens:,} cached positions: {e.requests_at_prompt:,} at once; SGLang's pool is "
            "token-granular (page size 1)"
        ),
        f"the formula: {SGLANG_SOURCE}",
    ]
    if e.problem:
        notes.append(f"SGLANG WOULD NOT START: {e.problem}")
    title = "SGLang KV pool (the slack covers activations and CUDA graphs; nothing is profiled)"
    return Table(title, [Column("item"), Column("bytes", "int"), Column("size", "bytes")], rows, notes)


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:,.3f} ms"


def _memory_label(r: Inference) -> str:
    """What the memory figures are: exact for our live model (with whose fused kernels), the course twin's
    estimate, a fused windowed kernel the live model lacks, or the live model's with weights as stored."""
    cfg = r.config
    kernels = ""
    if r.attention == "sdpa":
        kernels = (
            " with torch's CPU flash kernel"
            if r.device != "cuda"
            else f" with CUDA's fused kernels ({CUDA.phrase('inference')})"
        )
    if r.memory_exact:
        return f"exact for our live model{kernels}"
    if not exact_for(cfg):
        return f"temporaries estimated from the course twin: the step replay does not cover {cfg.family}"
    if r.attention == "sdpa" and cfg.sliding_window is not None:
        return "temporaries of a fused windowed kernel (no mask); our live model has none: not proven"
    return f"temporaries of the live model in {'fp32' if r.weights == 'fp32' else 'bf16'}, weights and KV as stored"


def infer_view(r: Inference) -> View:
    cfg, ro, m = r.config, r.roofline, r.memory
    g = r.gpu
    cache = "P + G" if r.program == "forward" else "P + G − 1"
    slots = f", {r.cache_slots:,} slots in blocks of {engine_block(cfg, g.name)}" if r.cache_slots != r.capacity else ""
    header = [
        describe_config(cfg),
        f"program {r.program}: {PROGRAM_WORDS[r.program]}"
        + (", MLA absorbed" if cfg.mla and r.program == "engine" else ""),
        (
            f"prompt P = {r.prompt:,} · generate G = {r.generate:,} · batch B = {r.batch:,} · cache C = {cache} = "
            f"{r.capacity:,}{slots} ({r.semantics} semantics) · attention {r.attention} · weights {r.weights} · "
            f"KV {r.kv_dtype} · {g.label} × tp {r.tp}"
        ),
        r.budget_basis.rule if r.budget_basis is not None else f"budget {fmt_bytes(r.budget)} per GPU",
    ]
    if r.over_budget:
        why = f" (measured anyway: a {r.measured['device']} run does not use the GPU)" if r.measured else ""
        header.append(f"OVER BUDGET: {r.over_budget}{why}")
    flops = Table(
        "Matmul FLOPs (2·m·n·p), per component",
        [Column("component"), Column("prefill (S = P)", "int"), Column("decode step at p = P", "int")],
        [(it.label, it.total, r.decode[it.key].total) for it in r.prefill]
        + [("total", r.prefill.total, r.decode.total)],
    )
    ex = r.prefill_extras
    attended = sum(it.total for it in r.prefill if it.group == "attention matmuls")
    flops.notes = [
        (
            f"prefill attention: the pairs a causal kernel computes {attended:,} (the rows above); the full square "
            f"{ex['attention_full_square']:,} (as FlopCounterMode and fvcore count it)"
            if r.program == "engine"
            else f"prefill attention: full square {ex['attention_full_square']:,}; causal half "
            f"{ex['attention_causal_half']:,} (labelled extra)"
            + (
                ""
                if ex["attention_windowed_band"] is None
                else f"; sliding-window band {ex['attention_windowed_band']:,}"
            )
        ),
        (
            f"decode: last step (p = {r.prompt + max(r.generate - 2, 0):,}) {r.decode_last:,}; all {plural(r.generate - 1, 'step')} "
            f"{r.generation_flops:,} (closed form); prefill + decode {r.prefill.total + r.generation_flops:,}"
            if r.generate > 1
            else "decode: no step (G = 1: the prefill yields the only token; the decode column is what a step would be)"
        ),
    ]
    mem = Table(
        f"Memory per GPU ({_memory_label(r)})",
        [Column("item"), Column("bytes", "int"), Column("size", "bytes")],
        [
            (f"weights ({r.weights}{', 1/' + str(r.tp) if r.tp > 1 else ''})", m["weights"], m["weights"]),
            (
                f"KV cache per sequence (C = {r.capacity:,}"
                + (f" in {r.cache_slots:,} slots" if r.cache_slots != r.capacity else "")
                + f", {r.kv_dtype})",
                m["kv_cache_per_sequence"],
                m["kv_cache_per_sequence"],
            ),
            (f"KV cache, B = {r.batch:,}", m["kv_cache"], m["kv_cache"]),
            ("RoPE tables (fp32 buffers)", m["rope_tables"], m["rope_tables"]),
            ("prefill input ids (int64)", m["prefill_input_ids"], m["prefill_input_ids"]),
            ("prefill temporaries (incl. logits)", m["prefill_temporaries"], m["prefill_temporaries"]),
            ("decode input ids (int64)", m["decode_input_ids"], m["decode_input_ids"]),
            ("decode temporaries, last step (incl. logits)", m["decode_temporaries"], m["decode_temporaries"]),
            ("prefill peak", m["prefill_peak"], m["prefill_peak"]),
            ("decode peak", m["decode_peak"], m["decode_peak"]),
        ],
        [
            (
                f"largest batch in {fmt_bytes(r.budget)}: {r.max_batch:,} (all prefilled together); "
                f"{r.max_batch_serving:,} (prefilled one at a time, decoded together)"
            )
        ],
    )
    phases = [
        ("prefill (TTFT)", ro["prefill"]),
        ("decode, p = P", ro["decode_first"]),
        ("decode, last p", ro["decode_last"]),
    ]
    roof = Table(
        (
            f"Roofline on {g.name} (a bound): {r.compute} peak {ro['peak_flops'] / 1e12:,.1f} TFLOP/s, HBM "
            f"{g.bandwidth / 1e12:,.2f} TB/s, ridge {ro['ridge_intensity']:,.1f} FLOP/byte (per GPU)"
            + (
                "; MLA in transformers v5's non-absorbed form (kv_b_proj re-expands every cached position at "
                "each decode step; --program engine absorbs it into the queries, as serving engines do)"
                if cfg.mla and r.program != "engine"
                else "; MLA absorbed (decode attends over the cached latent)"
                if cfg.mla
                else ""
            )
        ),
        [
            Column("phase"),
            Column("FLOPs", "int"),
            Column("bytes", "int"),
            Column("FLOP/byte", "float"),
            Column("time"),
            Column("bound"),
        ],
        [(name, p["flops"], p["bytes"], p["intensity"], _ms(p["seconds"]), p["bound"]) for name, p in phases],
    )

    def knee(b):
        return "never (KV reads grow with B as fast as FLOPs)" if b is None else f"B = {b:,}"

    roof.notes = [
        (
            f"time to first token {_ms(ro['time_to_first_token_seconds'])}; decode {_ms(ro['decode_mean_seconds'])} per "
            f"token (mean of {plural(ro['decode_steps'], 'step')}, {ro['decode_bound']}): {ro['tokens_per_s']:,.0f} tokens/s "
            f"({ro['tokens_per_s_per_sequence']:,.1f} per sequence)"
        ),
        (
            f"decode turns compute-bound at: p = P {knee(ro['knee_batch_first'])}; last p {knee(ro['knee_batch_last'])}; "
            f"weights only (no KV reads) {knee(ro['knee_batch_weights_only'])}"
        ),
    ]
    fit = ro["throughput_bound_batch"]
    roof.notes.append(
        f"throughput bound: {ro['throughput_bound_tokens_per_s']:,.0f} output tokens/s at B = {fit:,} (the largest "
        "batch that fits, B prompts prefilled then decoded)"
        if fit
        else "throughput bound: none (not one sequence fits)"
    )
    real = ro["realistic"]
    if real:
        roof.notes.append(
            f"realistic ({real['basis']}): time to first token {_ms(real['time_to_first_token_seconds'])}; decode "
            f"{_ms(real['decode_mean_seconds'])} per token, {real['tokens_per_s']:,.0f} tokens/s at B = {r.batch:,}"
            + (f"; throughput {real['throughput_tokens_per_s']:,.0f} tokens/s at B = {fit:,}" if fit else "")
        )
    else:
        roof.notes.append(f"realistic: no calibration table for {g.name}; give --efficiency for one")
    if ro["moe_weights_read_bound"]:
        roof.notes.append(
            "mixture of experts: a decode step reads the experts its B·k routed tokens reach, at most "
            "min(E, B·k) per layer (a bound: the bytes are an upper bound, the tokens/s a lower bound)"
        )
    tables = [flops, mem, roof]
    if r.engine is not None:
        tables.append(engine_table(r) if isinstance(r.engine, VllmSizing) else sglang_table(r))
    if r.measured:
        tables.append(
            Table(
                f"Predicted vs measured on {r.measured['device']} (live model, {r.measured['dtype']}, "
                f"{r.measured.get('attention', 'naive')} attention)",
                [Column("quantity"), Column("predicted", "int"), Column("measured", "int"), Column("equal")],
                [(k, p, q, "yes" if p == q else "NO") for k, p, q in r.measured["rows"]],
                [f"also held on the device: {k}: {fmt_bytes(v)}" for k, v in r.measured.get("overheads", {}).items()],
            )
        )
    return View(header, tables, list(CONVENTIONS))
