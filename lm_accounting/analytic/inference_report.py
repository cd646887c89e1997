"""``lm-account infer``: one ``Inference`` result: FLOPs, memory, capacity and roofline of serving.

No torch.  The formulas are in ``inference.py`` (FLOPs, weights, KV cache), ``inference_memory.py``
(the step's temporaries) and ``roofline.py`` (times); this file assembles them for one question.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from ..breakdown import Breakdown
from ..config import AccountingError, ModelConfig, check_positive_int
from ..gpus import GPU, MemoryBudget, memory_budget
from ..gpus import gpu as lookup_gpu
from ..provenance import CPU_TORCH, CUDA
from ..result import Result
from ..units import fmt_bytes
from . import inference as inf
from .engine_sizing import SglangOptions, SglangSizing, VllmOptions, VllmSizing, sglang_sizing, vllm_sizing
from .inference_memory import exact_for, step_temporaries
from .roofline import Phase, allreduce_seconds, knee_batch, routed_fraction
from .sizes import at_context

ACT_BYTES = {"fp32": 4, "bf16": 2}
ENGINE_BYTES = ("total", "requested", "weights", "rope_cache", "activation_forward", "activation_sampler",
                "non_torch", "cuda_graphs", "kv_cache_memory", "page_bytes", "activation_peak", "shortfall")  # fmt: skip
MIN_EFFICIENCY = 0.001
"""The smallest ``efficiency`` taken: 0.1 % of the peak and bandwidth (below, the times overflow a float)."""
CONVENTIONS = (
    (
        "Steps: prefill (P tokens) yields the first token; G − 1 decode steps at p = P … P+G−2 yield the rest.  "
        "Programs (--program): engine (default; vLLM, SGLang) and generate (transformers' generate(), "
        "logits_to_keep = 1) run the head on each sequence's last position and cache C = P + G − 1 positions "
        "(the engine's in whole blocks of 16); forward runs it on every position and caches C = P + G."
    ),
    (
        "FLOPs: matmuls, 2·m·n·p.  Prefill = the forward at S = P: generate and forward count the full P×P "
        "square (as counters do; the causal half and the window band are labelled extras), engine the pairs a "
        "causal kernel computes (P(P+1)/2, a window's band).  Decode at p: the new token attends over p + 1 "
        "keys (filled); engine runs MLA absorbed (2·h·(2r + d_rope) FLOPs per cached latent)."
    ),
    (
        "Cache semantics 'filled' attends over the filled positions; 'static' over all C slots, masked, as "
        "transformers' StaticCache with eager attention (cost grows with C, not p)."
    ),
    (
        "KV cache = 2·kv_heads·d_head·bytes·Σ_layers min(C, w)·B (MLA: the latent and RoPE key, "
        "(kv_lora_rank + qk_rope_head_dim)·bytes per token and layer, expanded by kv_b_proj at every step but "
        "under engine, replicated under --tp; a Gated DeltaNet hybrid adds per linear layer its conv state, "
        "conv_dim·K·bytes, and its fp32 recurrent state, H_v·d_k·d_v·4, per sequence); fp8 = 1 byte.  Norms, "
        "row-parallel biases and MLA's down "
        "projections are replicated under --tp."
    ),
    (
        "Weights (--weights): quantised checkpoints (fp8, int8, int4) keep the embedding table, the LM head, "
        "the norms, biases and routers in bf16 (--quantize-embeddings: not the table and head); int4 adds an "
        "fp16 scale and a packed int4 zero-point per --group-size weights (GPTQ/AWQ).  --compute: fp8 and int8 "
        "run as w8a8 at the GPU's FP8/INT8 peak by default, or weight-only at bf16; int4 is weight-only."
    ),
    (
        "Roofline (a bound): max(FLOPs/peak, bytes/bandwidth) per rank at 100 % of the datasheet's dense peak "
        "for the --compute dtype and HBM bandwidth; bytes = the weights read once (an untied embedding table: "
        "a row a token) + KV written/read; TP all-reduces added, not overlapped.  The throughput bound is B·G "
        "output tokens over prefill(B) + Σ decode(B) at the largest B that fits.  The realistic figure is the "
        "same at the GPU's calibrated GEMM and HBM rates (or --efficiency)."
    ),
    (
        "Attention (--attention): sdpa (default with filled semantics: what serving engines run) is a fused "
        "kernel that keeps only its output and an fp32 logsumexp, no P×P scores; naive (default, and the only "
        "choice, with --cache static) materialises the B·h·P×keys scores and probabilities.  The matmul FLOPs "
        "are the same; only the temporaries differ.  A sliding-window model under sdpa is modelled as a fused "
        "windowed kernel (no mask), which our live model does not have: not proven."
    ),
    (
        "Temporaries: exact for our live model (no-grad step, activations in the weights' dtype or bf16) on a "
        "CUDA GPU (sdpa: flash, or memory-efficient for fp32, as Sizes.lse), proven against the storage "
        f"tracker on meta and cpu (torch {CPU_TORCH}) and {CUDA.phrase('inference')}; "
        "computed for the whole model even under --tp (an upper bound per rank)."
    ),
    "GB = 10^9 bytes, GiB = 2^30 bytes.",
)


@dataclass(frozen=True)
class Inference(Result):
    """Inference accounting of one model for P prompt tokens, G generated, B concurrent sequences."""

    SCHEMA = "lm-accounting/infer/5"

    config: ModelConfig
    prompt: int
    generate: int
    batch: int
    semantics: str
    attention: str
    program: str  # inference.PROGRAMS: engine, generate or forward
    device: str  # whose kernels the temporaries are: cuda, or meta/cpu (the CPU flash kernel) for a measurement
    weights: str
    weight_format: inf.WeightFormat
    compute: str  # the matmuls' dtype: the roofline's peak
    kv_dtype: str
    gpu: GPU
    tp: int
    budget: int
    prefill: Breakdown
    prefill_extras: dict[str, int | None]
    decode: Breakdown  # one step at p = P
    decode_last: int  # FLOPs of the last step (p = P + G − 2)
    generation_flops: int  # all G − 1 decode steps
    memory: dict[str, int]
    memory_exact: bool
    max_batch: int  # all B prefilled together, then decoded
    max_batch_serving: int  # prefilled one at a time (continuous batching), decoded together
    roofline: dict[str, Any]
    measured: dict[str, Any] | None = field(default=None)
    budget_basis: MemoryBudget | None = None  # how ``budget`` was derived (gpus.memory_budget)
    engine: VllmSizing | SglangSizing | None = None  # --engine: its start-up KV-cache sizing (engine_sizing.py)

    @property
    def capacity(self) -> int:
        """Positions each sequence's cache holds (``inference.cache_positions``)."""
        return inf.cache_positions(self.program, self.prompt, self.generate)

    @property
    def cache_slots(self) -> int:
        """Positions allocated per sequence (``inference.cache_slots``: the engine's whole blocks)."""
        return inf.cache_slots(self.program, self.prompt, self.generate, inf.engine_block(self.config, self.gpu.name))

    @property
    def over_budget(self) -> str | None:
        """Why batch B does not fit the budget on one GPU, or None when it does."""
        fits = (self.max_batch, self.max_batch_serving)
        return budget_problem(self.batch, self.memory, self.budget, self.gpu, self.capacity, self.tp, *fits)

    def with_measurement(self, measured: dict[str, Any]) -> Inference:
        from dataclasses import replace

        return replace(self, measured=measured)

    def records(self) -> list[dict[str, Any]]:
        rows = [
            dict(section="summary", key=key, label=key, value=value, unit="")
            for key, value in (
                ("program", self.program), ("weights", self.weights), ("compute", self.compute),
                ("kv_dtype", self.kv_dtype), ("attention", self.attention), ("cache_positions", self.capacity),
                ("cache_slots", self.cache_slots), ("fits_budget", str(self.over_budget is None).lower()),
                ("over_budget", self.over_budget or ""),
            )
        ]  # fmt: skip
        for section, bd in (("prefill_flops", self.prefill), ("decode_flops_first_step", self.decode)):
            for it in bd:
                rows.append(dict(section=section, key=it.key, label=it.label, value=it.total, unit="FLOPs"))
        for key, value in self.prefill_extras.items():
            rows.append(dict(section="prefill_extras", key=key, label=key, value=value, unit="FLOPs"))
        rows.append(dict(section="decode", key="last_step", label="last step", value=self.decode_last, unit="FLOPs"))
        rows.append(
            dict(section="decode", key="all_steps", label="G − 1 steps", value=self.generation_flops, unit="FLOPs")
        )
        for key, value in self.memory.items():
            rows.append(dict(section="memory", key=key, label=key, value=value, unit="bytes"))
        rows.append(dict(section="capacity", key="budget", label="budget per GPU", value=self.budget, unit="bytes"))
        for key, value in (("max_batch", self.max_batch), ("max_batch_prefill_one_at_a_time", self.max_batch_serving)):
            rows.append(dict(section="capacity", key=key, label=key, value=value, unit="sequences"))
        for phase in ("prefill", "decode_first", "decode_last"):
            for key, value in self.roofline[phase].items():
                rows.append(dict(section=f"roofline.{phase}", key=key, label=key, value=value, unit=""))
        for key in ("decode_mean_seconds", "tokens_per_s", "tokens_per_s_per_sequence", "decode_bound"):
            rows.append(dict(section="roofline", key=key, label=key, value=self.roofline[key], unit=""))
        for key in ("knee_batch_first", "knee_batch_last", "knee_batch_weights_only", "throughput_bound_batch"):
            rows.append(dict(section="roofline", key=key, label=key, value=self.roofline[key], unit="sequences"))
        key = "throughput_bound_tokens_per_s"
        rows.append(dict(section="roofline", key=key, label=key, value=self.roofline[key], unit="tokens/s"))
        for key, value in (self.roofline["realistic"] or {}).items():
            rows.append(dict(section="roofline.realistic", key=key, label=key, value=value, unit=""))
        for key, value in (self.engine.to_dict() if self.engine else {}).items():
            value = str(value).lower() if isinstance(value, bool) else "" if value is None else value
            unit = "bytes" if key in ENGINE_BYTES else ""
            rows.append(dict(section="engine", key=key, label=key.replace("_", " "), value=value, unit=unit))
        for key, value in (self.measured or {}).items():
            if isinstance(value, (int, float, str)):
                rows.append(dict(section="measured", key=key, label=key, value=value, unit=""))
        return rows

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.SCHEMA,
            "config": self.config.resolved(),
            "prompt": self.prompt,
            "generate": self.generate,
            "batch": self.batch,
            "capacity": self.capacity,
            "cache_slots": self.cache_slots,
            "program": self.program,
            "cache_semantics": self.semantics,
            "attention": self.attention,
            "temporaries_for_device": self.device,
            "weights": self.weights,
            "weight_format": {
                "dtype": self.weights,
                "group_size": self.weight_format.group,
                "embeddings_quantized": self.weight_format.embeddings,
            },
            "compute": self.compute,
            "kv_dtype": self.kv_dtype,
            "gpu": {"name": self.gpu.name, "label": self.gpu.label, "source": self.gpu.source},
            "tp": self.tp,
            "budget": self.budget,
            "budget_basis": None if self.budget_basis is None else self.budget_basis.to_dict(),
            "prefill_flops": self.prefill.to_dict(),
            "prefill_extras": self.prefill_extras,
            "decode_flops": {
                "first_step": self.decode.to_dict(),
                "last_step": self.decode_last,
                "last_step_position": self.prompt + max(self.generate - 2, 0),  # p: the tokens it attends over - 1
                "all_steps": self.generation_flops,
            },
            "prefill_and_decode_flops": self.prefill.total + self.generation_flops,
            "memory": {**self.memory, "exact_for_live_model": self.memory_exact},
            "fits_budget": self.over_budget is None,
            "over_budget": self.over_budget,
            "max_batch": self.max_batch,
            "max_batch_prefill_one_at_a_time": self.max_batch_serving,
            "roofline": self.roofline,
            "engine": None if self.engine is None else self.engine.to_dict(),
            "measured": self.measured,
            "conventions": list(CONVENTIONS),
            "validated": CUDA.to_dict("inference"),
        }


def memory_exact(cfg: ModelConfig, weights: str, kv_dtype: str, attention: str) -> bool:
    """Whether the memory figures are our live model's, exactly: the step replay's architecture, one dtype
    for weights, cache and activations, and not a sliding window under the fused kernel (which the live
    model does not have: ``sdpa`` there models a fused windowed kernel)."""
    windowed_fused = attention == "sdpa" and cfg.sliding_window is not None
    return exact_for(cfg) and weights in ACT_BYTES and kv_dtype == _act(weights) and not windowed_fused


def _act(weights: str | inf.WeightFormat) -> str:
    return "fp32" if inf.weight_format(weights).dtype == "fp32" else "bf16"


@functools.lru_cache(maxsize=32)
def _weights(cfg: ModelConfig, weights: str | inf.WeightFormat, tp: int) -> int:
    """``inference.weights_bytes``, kept: ``max_batch`` asks for it at every batch it tries."""
    return inf.weights_bytes(cfg, weights, tp)


def _memory(
    cfg,
    prompt,
    generate,
    batch,
    weights,
    kv_dtype,
    tp,
    semantics,
    prefill_batch=None,
    attention="sdpa",
    cuda=True,
    program="forward",
    block=inf.BLOCK_SIZE,
) -> dict[str, int]:
    """Bytes on one rank: weights, cache, RoPE tables, ids, and each phase's peak (prefill, last decode step).
    ``prefill_batch``: sequences prefilled together (default: all B at once; 1 = one at a time, as a
    continuous-batching server admits them).  ``attention``: the kernel (``inference.ATTENTIONS``);
    ``cuda``: the temporaries of a CUDA GPU's fused kernels, else the CPU flash kernel's (meta, cpu).
    ``program``: ``generate`` and ``engine`` keep last-token logits (and the sampler's fp32 copy) and a cache
    of P + G − 1 positions, the engine's in whole blocks (``inference.engine_blocks``)."""
    pb = batch if prefill_batch is None else prefill_batch
    e, C = ACT_BYTES[_act(weights)], inf.cache_positions(program, prompt, generate)
    held = inf.cache_slots(program, prompt, generate, block)  # the engine's whole blocks (inference.engine_block)
    slots = inf.layer_slots(cfg, C)
    pre_keys = [prompt] * cfg.num_layers if semantics == "filled" else [max(n, prompt) for n in slots]
    last = prompt + max(generate - 2, 0)
    dec_keys = inf.decode_keys(cfg, last, C, semantics)
    kw = dict(semantics=semantics, slots=slots, attention=attention, cuda=cuda, last_logits=program != "forward")
    rotary = cfg.rope_dim if cfg.partial_rotary else cfg.d_head  # the live model's cos/sin tables: S x rotary/2
    rope = 2 * cfg.context_length * (rotary // 2) * 4 if cfg.positions == "rope" else 0
    out = {
        "weights": _weights(cfg, weights, tp),
        "kv_cache_per_sequence": inf.kv_bytes(cfg, held, 1, kv_dtype, tp),
        "kv_cache": inf.kv_bytes(cfg, held, batch, kv_dtype, tp),
        "rope_tables": rope,
        "prefill_input_ids": pb * prompt * 8,
        "prefill_temporaries": step_temporaries(cfg, pb, prompt, pre_keys, e, prefill=True, **kw),
        "decode_input_ids": batch * 8,
        "decode_temporaries": step_temporaries(cfg, batch, 1, dec_keys, e, prefill=False, **kw),
    }
    base = out["weights"] + out["kv_cache"] + rope
    out["prefill_peak"] = base + out["prefill_input_ids"] + out["prefill_temporaries"]
    out["decode_peak"] = base + out["decode_input_ids"] + out["decode_temporaries"]
    out["peak"] = max(out["prefill_peak"], out["decode_peak"])
    return out


def max_batch(
    cfg,
    prompt,
    generate,
    weights,
    kv_dtype,
    tp,
    semantics,
    budget,
    prefill_batch=None,
    attention="sdpa",
    cuda=True,
    program="forward",
    block=inf.BLOCK_SIZE,
) -> int:
    """The largest B whose peak fits ``budget`` (0: not even one sequence); the peak grows with B.
    ``prefill_batch`` 1: sequences are prefilled one at a time (only the decode step runs at B)."""

    fixed = dict(prefill_batch=prefill_batch, attention=attention, cuda=cuda, program=program, block=block)

    def peak(b: int) -> int:
        return _memory(cfg, prompt, generate, b, weights, kv_dtype, tp, semantics, **fixed)["peak"]

    if peak(1) > budget:
        return 0
    lo, hi = 1, 2
    while peak(hi) <= budget:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if peak(mid) <= budget else (lo, mid)
    return lo


def budget_problem(batch, memory, budget, g: GPU, capacity, tp, best, serving) -> str | None:
    """None when the peak of ``memory`` (``_memory``) fits ``budget``; else what it needs and what fits
    (``best``, ``serving``: ``max_batch`` all prefilled together and one at a time)."""
    if memory["peak"] <= budget:
        return None
    tail = (
        f"the largest batch that fits is {best:,} ({serving:,} if the prompts are prefilled one at a time)"
        if best
        else f"not even one sequence fits (weights alone: {fmt_bytes(memory['weights'])})"
    )
    return (
        f"batch {batch:,} needs {fmt_bytes(memory['peak'])} per GPU, over the {fmt_bytes(budget)} budget "
        f"({g.name}, {capacity:,} cached positions a sequence, --tp {tp}); {tail}"
    )


def _decode_series(
    cfg, prompt, generate, batch, semantics, w_read, g: GPU, peak: int, tp: int, kv_dtype: str, program: str
):
    """The roofline over the G − 1 decode steps: (first step, last step, mean seconds, bounds seen, the
    first position whose bound differs from the first step's), in closed form: O(layers + log G), not O(G).

    A step at p reads K(p) = Σ_layers n cached tokens (n = min(p + 1, slots), or the slots under 'static'):
    FLOPs F = ⌈other / tp⌉ + (c / tp)·K (c, the attention FLOPs per key, holds the heads, which tp divides)
    and bytes W + b·K (b = 2·kv_dim·B·bytes per cached token / the KV split, exact: tp divides the KV heads).
    Its time is max(F/peak, bytes/bandwidth) + the all-reduces: compute-bound iff F·bandwidth >= peak·bytes,
    linear in K, and K never decreases with p, so the bound turns at most once (found by bisection); each
    side's Σ F or Σ bytes is linear in Σ_p K(p), a sum of Σ min(p + 1, n) (``inference.sum_min``).  The mean is
    that exact rational sum over steps (the same figure as adding the G − 1 steps one by one, without its
    rounding)."""
    C, steps = inf.cache_positions(program, prompt, generate), generate - 1
    grows = inf.attention_per_key(cfg, batch, program)
    per_key = sum(c for _, _, c, _ in grows)
    grown = {key for key, *_ in grows}
    other = sum(it.total for it in inf.decode_flops(cfg, prompt, batch, C, semantics, program) if it.key not in grown)
    kv_token = inf.kv_layer_token_bytes(cfg, batch, kv_dtype)  # 2·kv_dim·B·bytes per layer-token
    split = inf.kv_split(cfg, tp)
    if per_key % tp or kv_token % split:
        raise AccountingError(f"--tp {tp}: the attention FLOPs or KV bytes per key do not split evenly")
    f0, f, b = -(-other // tp), per_key // tp, kv_token // split  # F = f0 + f·K, bytes = w_read + b·K
    comm = allreduce_seconds(cfg, batch, g, tp)
    slots: dict[int, int] = {}
    for n in inf.layer_slots(cfg, C):
        slots[n] = slots.get(n, 0) + 1

    def keys(p: int) -> int:
        return sum(count * (n if semantics == "static" else min(p + 1, n)) for n, count in slots.items())

    def keys_sum(lo: int, hi: int) -> int:  # Σ_{p=lo}^{hi} K(p)
        if semantics == "static":
            return (hi - lo + 1) * keys(lo) if hi >= lo else 0
        return sum(count * inf.sum_min(lo + 1, hi + 1, n) for n, count in slots.items())

    def phase(p: int) -> Phase:
        return Phase(f0 + f * keys(p), w_read + b * keys(p), peak, g.bandwidth, comm)

    first_p, end = prompt, prompt + steps  # the steps are p = P … end − 1
    if steps <= 0:
        return phase(prompt), phase(prompt), 0.0, [], None
    first = phase(first_p).bound
    lo, hi = first_p + 1, end  # the first p whose bound differs (end: none), by bisection (monotone)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if phase(mid).bound != first else (mid + 1, hi)
    turn = lo if lo < end else None

    def cost(a: int, z: int, bound: str) -> int:  # Σ_{p=a}^{z} max(F·bandwidth, bytes·peak)
        count, total_keys = z - a + 1, keys_sum(a, z)
        if bound == "compute-bound":
            return g.bandwidth * (count * f0 + f * total_keys)
        return peak * (count * w_read + b * total_keys)

    second = "memory-bound" if first == "compute-bound" else "compute-bound"
    split_at = end if turn is None else turn
    total = cost(first_p, split_at - 1, first) + (cost(split_at, end - 1, second) if turn is not None else 0)
    mean = float(Fraction(total, peak * g.bandwidth * steps)) + comm
    bounds = [first] if turn is None else [first, second]
    return phase(prompt), phase(end - 1), mean, bounds, turn


def _table(cfg: ModelConfig, weights: inf.WeightFormat, tp: int) -> int:
    """This rank's bytes of an untied embedding table, which a step reads a row a token (0 when tied: the
    head reads the whole table anyway)."""
    return 0 if cfg.tie_embeddings else inf.weights_bytes(cfg, weights, tp, "embedding")


def _phases(cfg, prompt, generate, weights, w_gpu, kv_dtype, tp, semantics, program, g: GPU, peak: int, batch: int):
    """The roofline at ``batch``: (the prefill's ``Phase``, ``_decode_series``).  Bytes read: the weights, but
    an untied embedding table only its rows (the worst rank: every token's row in its shard), and under MoE
    only the experts the step's tokens reach (``routed_fraction``); the prefill writes its KV."""
    C = inf.cache_positions(program, prompt, generate)
    prefill = inf.prefill_flops(cfg, prompt, batch, C, semantics, program)
    pre_hw = prefill.total
    if semantics == "filled" and program != "engine":  # a causal kernel computes the pairs (engine: counted so)
        pairs = inf.prefill_flops(cfg, prompt, batch, C, semantics, "engine")
        pre_hw += sum(it.total for it in pairs if it.group == inf.ATTENTION)
        pre_hw -= sum(it.total for it in prefill if it.group == inf.ATTENTION)
    routed, touched = routed_fraction(cfg, batch)
    expert = weights.tensor_bytes(routed - touched, "layers.*.moe.experts.w1", "ffn")
    table = _table(cfg, weights, tp)

    row = weights.tensor_bytes(cfg.d_model, "token_embeddings", "embedding")  # one token's row, as stored

    def rows(tokens: int) -> int:
        return min(table, tokens * row)

    w_read = w_gpu - table + rows(batch) - -(-expert // tp)
    kv = inf.kv_bytes(cfg, prompt, batch, kv_dtype, tp)
    comm = allreduce_seconds(cfg, batch * prompt, g, tp)
    pre = Phase(-(-pre_hw // tp), w_gpu - table + rows(batch * prompt) + kv, peak, g.bandwidth, comm)
    args = (cfg, prompt, generate, batch, semantics, w_read, g, peak, tp, kv_dtype, program)
    return pre, _decode_series(*args)


def realistic(at: tuple, batch: int, fit: int, generate: int, efficiency: float | None) -> dict[str, Any] | None:
    """The roofline again at a fraction of the peak and of the bandwidth: ``efficiency`` for both when given,
    else the GPU's calibration (``step_time.best_rates``: the fastest bf16 GEMM measured over the bf16 peak, the
    memory-bound bandwidth measured over the datasheet's; for fp8 and int8 compute the bf16 fraction, assumed);
    None when neither exists.  Still no launch, scheduling or communication overlap costs: an engine's figure
    lies below it (reports/inference/trtllm_throughput.md: measured against it)."""
    from dataclasses import replace

    from .step_time import best_rates

    cfg, P, G, weights, w_gpu, kv_dtype, tp, semantics, program, g, peak = at
    if efficiency is not None:
        fc = fb = efficiency
        basis = f"--efficiency {efficiency:g} of the peak and of the bandwidth"
    else:
        rates = best_rates(g.name)
        if rates is None:
            return None
        flops, bandwidth, where = rates
        fc, fb = flops / g.peak_flops("bf16"), bandwidth / g.bandwidth
        basis = (f"calibrated on {where}: the fastest bf16 GEMM, {flops / 1e12:,.0f} TFLOP/s ({fc:.1%} of the peak), "
                 f"HBM at {bandwidth / 1e12:,.3f} TB/s ({fb:.1%})")  # fmt: skip
        if peak != g.peak_flops("bf16"):
            basis += f"; the same {fc:.1%} of the {peak / 1e12:,.1f} TFLOP/s peak assumed (measured for bf16 only)"
    slow = replace(g, bandwidth=max(1, round(g.bandwidth * fb)))
    scaled = (cfg, P, G, weights, w_gpu, kv_dtype, tp, semantics, program, slow, max(1, round(peak * fc)))
    pre, (_, _, mean, _, _) = _phases(*scaled, batch)
    out = {"basis": basis, "compute_fraction": fc, "bandwidth_fraction": fb,
           "time_to_first_token_seconds": pre.seconds, "decode_mean_seconds": mean if G > 1 else 0.0,
           "tokens_per_s": batch / mean if G > 1 else 0.0}  # fmt: skip
    bound = _throughput_bound(scaled, fit, G)
    out["throughput_tokens_per_s"] = bound["throughput_bound_tokens_per_s"]
    return out


def _throughput_bound(at: tuple, fit: int, generate: int) -> dict[str, Any]:
    """The most output tokens/s the roofline allows on this GPU: B sequences prefilled, then G − 1 decode steps,
    B·G tokens over prefill(B) + Σ decode(B) seconds, at the largest B that fits with prompts prefilled one at
    a time (``max_batch_serving``).  Both times are affine in B with a fixed part (the weights read), so this
    is the best over every B that fits: a bound for an engine's throughput benchmark (e.g. TensorRT-LLM's
    "throughput" tables: output tokens/s at the best concurrency)."""
    if fit < 1:
        return {"throughput_bound_batch": 0, "throughput_bound_tokens_per_s": 0.0}
    pre, (_, _, mean, _, _) = _phases(*at, fit)
    seconds = pre.seconds + (generate - 1) * mean
    return {"throughput_bound_batch": fit, "throughput_bound_tokens_per_s": fit * generate / seconds}


def check_weights(
    cfg: ModelConfig, weights: str, compute: str | None, g: GPU, group_size: int | None, quantize_embeddings: bool
) -> str:
    """The matmuls' dtype for ``weights`` (``inference.COMPUTE``; None: its first), refused where the storage
    cannot run it or the GPU has no peak for it; and the checkpoint's format flags, refused where they do
    nothing or where a group does not divide a quantised matrix's input width (GPTQ/AWQ group along it)."""
    choices = inf.COMPUTE.get(weights, ())
    compute = choices[0] if compute is None and choices else compute
    if compute not in choices:
        raise AccountingError(
            f"--compute {compute} does not run {weights} weights (valid for {weights}: {', '.join(choices)}; fp8 and "
            "int8 run as w8a8 or weight-only in bf16, int4 weight-only in bf16)"
        )
    if compute not in g.peak:
        alt = " or --compute bf16 (weight-only)" if weights in ("fp8", "int8") and "bf16" in g.peak else ""
        why = " (int4 is weight-only: it computes in bf16)" if weights == "int4" else ""
        raise AccountingError(
            f"{g.name} has no {compute} peak in its datasheet{why} (it lists {', '.join(g.peak)}): "
            f"choose another --gpu{alt}"
        )
    if quantize_embeddings and weights not in inf.QUANTIZED:
        raise AccountingError(f"--quantize-embeddings applies to quantised weights (fp8, int8, int4), not {weights}")
    if group_size is not None:
        check_positive_int("group_size", group_size)
        if weights != "int4":
            raise AccountingError(f"--group-size applies to int4 weights (GPTQ/AWQ groups), not {weights}")
        widths = {cfg.d_model, cfg.o_dim, cfg.d_ff, cfg.expert_width, cfg.shared_width or cfg.d_model,
                  cfg.q_lora_rank or cfg.d_model, cfg.kv_lora_rank or cfg.d_model}  # fmt: skip
        bad = sorted(w for w in widths if w % group_size)
        if bad:
            raise AccountingError(
                f"--group-size {group_size:,} does not divide the input width {bad[0]:,} of a quantised matrix of "
                f"{cfg.name} (GPTQ/AWQ group a matrix's input dimension)"
            )
    return compute


def check_infer(
    cfg, prompt, generate, batch, weights, kv_dtype, tp, semantics, attention, device, program=None
) -> tuple[str, str]:
    """Every refusal of ``infer`` for ``cfg`` (at its context), before any work; returns the attention and
    the program (None: ``inference.default_attention(semantics)``, ``inference.default_program``)."""
    for name, value in (("prompt", prompt), ("generate", generate), ("batch", batch), ("tp", tp)):
        check_positive_int(name, value)
    inf.check_supported(cfg)
    inf.check_semantics(semantics)
    attention = inf.default_attention(semantics) if attention is None else attention
    program = inf.default_program(semantics, attention) if program is None else program
    inf.check_program(program)
    inf.check_attention(attention, semantics)
    if cfg.indexer_pattern is not None:
        raise AccountingError(
            f"{cfg.name}: layers without an indexer (indexer_pattern, GLM-5's shared top-k) are not modelled by infer "
            "(its per-key FLOPs and cache bytes are one figure for every layer); account and memory give their counts"
        )
    if program == "engine" and cfg.indexer:
        raise AccountingError(
            f"--program engine: {cfg.name}'s DeepSeek Sparse Attention runs in the engines' own kernels (top-k "
            "attention, the indexer's fp8 key pool), which lm-accounting does not model; --program generate or "
            "forward gives transformers' computation and cache"
        )
    if program == "engine" and (semantics != "filled" or attention != "sdpa"):
        raise AccountingError(
            "--program engine runs a paged cache with a fused kernel (what vLLM and SGLang run): --cache static "
            "and --attention naive describe transformers' code; use them with --program generate or forward"
        )
    inf.check_lengths(cfg, prompt, generate)
    inf.check_tp(cfg, tp)
    if weights not in inf.WEIGHT_BYTES:
        raise AccountingError(f"unknown weight dtype '{weights}' (valid: {', '.join(inf.WEIGHT_BYTES)})")
    if kv_dtype not in inf.KV_DTYPES:
        raise AccountingError(f"unknown KV-cache dtype '{kv_dtype}' (valid: {', '.join(inf.KV_DTYPES)})")
    if device not in ("meta", "cpu", "cuda"):
        raise AccountingError(f"unknown device '{device}' (valid: meta, cpu, cuda)")
    if device == "cuda" and attention == "sdpa" and weights == "fp32" and not cfg.mla and cfg.kv_heads < cfg.num_heads:
        raise AccountingError(
            "fused attention in fp32 with grouped KV heads has no CUDA kernel in torch (flash needs bf16/fp16, the "
            "memory-efficient kernel takes no GQA; SDPA would fall back to the math path, S×S): use --weights bf16 "
            "(or fp8/int8/int4: bf16 activations), or --attention naive, or --measure meta|cpu (the CPU kernel)"
        )
    return attention, program


def infer(
    cfg: ModelConfig,
    prompt: int,
    generate: int,
    batch: int = 1,
    *,
    weights: str = "bf16",
    kv_dtype: str = "bf16",
    gpu: str = "h100-80gb",
    tp: int = 1,
    budget: int | MemoryBudget | None = None,
    allowance: int | None = None,
    semantics: str = "filled",
    context: int | None = None,
    attention: str | None = None,
    device: str = "cuda",
    program: str | None = None,
    engine: VllmOptions | SglangOptions | None = None,
    compute: str | None = None,
    group_size: int | None = None,
    quantize_embeddings: bool = False,
    efficiency: float | None = None,
) -> Inference:
    """Everything analytic about serving ``cfg`` (see the module docstring and ``CONVENTIONS``).
    ``attention`` None: ``inference.default_attention(semantics)`` (sdpa, naive under 'static').
    ``device``: whose kernels the temporaries are (cuda, the default: what a GPU allocates; meta or cpu:
    torch's CPU flash kernel, for a measurement there).  ``program``: ``inference.PROGRAMS`` (None:
    ``inference.default_program``: engine, what a serving engine runs, unless the static cache or naive
    attention asked for names transformers' code: generate).
    ``engine``: vLLM's or SGLang's options, to size the KV cache as the engine does at start-up (``engine_sizing``).
    ``compute``: the matmuls' dtype (None: ``inference.COMPUTE``'s first for ``weights``: fp8 and int8 as w8a8);
    ``group_size`` (None: 128) and ``quantize_embeddings``: the checkpoint's format (``inference.WeightFormat``).
    ``efficiency``: the fraction of the peak and the bandwidth a realistic figure assumes (None: the GPU's
    calibration, where it has one; ``realistic``)
    A batch whose peak exceeds ``budget`` is still analysed: ``Inference.over_budget`` says by how much
    and what fits (an answer, not bad input).  ``budget`` per GPU: as given, else the GPU's CUDA total less
    ``allowance`` (``gpus.memory_budget``, default ``gpus.DEFAULT_ALLOWANCE``)."""
    cfg = at_context(cfg, context)
    given_program = program is not None
    attention, program = check_infer(
        cfg, prompt, generate, batch, weights, kv_dtype, tp, semantics, attention, device, program
    )
    if engine is not None and program != "engine":
        why = "" if given_program else " (--cache static and --attention naive imply transformers' generate)"
        name = "sglang" if isinstance(engine, SglangOptions) else "vllm"
        raise AccountingError(
            f"--engine {name} sizes a serving engine's cache: it runs --program engine, not {program}{why}"
        )
    cuda = device == "cuda"
    g = lookup_gpu(gpu)
    compute = check_weights(cfg, weights, compute, g, group_size, quantize_embeddings)
    if efficiency is not None and not MIN_EFFICIENCY <= efficiency <= 1:
        raise AccountingError(f"--efficiency {efficiency:g} is outside [{MIN_EFFICIENCY:g}, 1]")
    stored = weights
    weights = inf.WeightFormat(stored, 128 if group_size is None else group_size, quantize_embeddings)
    sizing = None
    if engine is not None:
        kw = dict(weights=weights, kv_dtype=kv_dtype, tp=tp, prompt=prompt, generate=generate)
        sizing = (sglang_sizing if isinstance(engine, SglangOptions) else vllm_sizing)(cfg, g, engine, **kw)
    basis = budget if isinstance(budget, MemoryBudget) else memory_budget(g.name, allowance, budget)
    budget = basis.usable
    C = inf.cache_positions(program, prompt, generate)
    args = (cfg, prompt, generate)
    block = inf.engine_block(cfg, g.name)
    memory = _memory(*args, batch, weights, kv_dtype, tp, semantics, None, attention, cuda, program, block)
    best = max_batch(*args, weights, kv_dtype, tp, semantics, budget, None, attention, cuda, program, block)
    serving = max_batch(*args, weights, kv_dtype, tp, semantics, budget, 1, attention, cuda, program, block)
    peak = g.peak_flops(compute)
    prefill = inf.prefill_flops(cfg, prompt, batch, C, semantics, program)
    extras = inf.prefill_extras(cfg, prompt, batch)
    w_gpu = memory["weights"]
    routed, _ = routed_fraction(cfg, batch)
    table = _table(cfg, weights, tp)
    at = (cfg, prompt, generate, weights, w_gpu, kv_dtype, tp, semantics, program, g, peak)
    pre, (first, last, mean, bounds, turn) = _phases(*at, batch)
    if len(bounds) <= 1:
        decode_bound = bounds[0] if bounds else "no decode step"
    else:
        decode_bound = f"{bounds[0]} until p = {turn - 1:,}, then {bounds[1]}"
    knees, last_p = {}, prompt + max(generate - 2, 0)
    for name, p in (("first", prompt), ("last", last_p)):
        f = inf.decode_flops(cfg, p, 1, C, semantics, program).total  # one sequence's FLOPs at p
        k = inf.kv_layer_token_bytes(cfg, 1, kv_dtype) * sum(inf.decode_keys(cfg, p, C, semantics))
        knees[name] = knee_batch(f, k * tp // inf.kv_split(cfg, tp), tp * (w_gpu - table), peak, g.bandwidth)
    f_first = inf.decode_flops(cfg, prompt, 1, C, semantics, program).total
    knees["weights_only"] = knee_batch(f_first, 0, tp * (w_gpu - table), peak, g.bandwidth)  # as if no KV were read
    decode_steps = generate - 1
    roofline = {
        "peak_flops": peak,
        "bandwidth": g.bandwidth,
        "ridge_intensity": peak / g.bandwidth,
        "prefill": pre.to_dict(),
        "time_to_first_token_seconds": pre.seconds,
        "decode_first": first.to_dict(),
        "decode_last": last.to_dict(),
        "decode_steps": decode_steps,
        "decode_mean_seconds": mean if decode_steps else 0.0,
        "tokens_per_s": batch / mean if decode_steps else 0.0,
        "tokens_per_s_per_sequence": 1 / mean if decode_steps else 0.0,
        "decode_bound": decode_bound,
        "knee_batch_first": knees["first"],
        "knee_batch_last": knees["last"],
        "knee_batch_weights_only": knees["weights_only"],
        "moe_weights_read_bound": bool(routed),
        **_throughput_bound(at, serving, generate),
    }
    roofline["realistic"] = realistic(at, batch, serving, generate, efficiency)
    return Inference(
        config=cfg,
        prompt=prompt,
        generate=generate,
        batch=batch,
        semantics=semantics,
        attention=attention,
        program=program,
        device=device,
        weights=stored,
        weight_format=weights,
        compute=compute,
        kv_dtype=kv_dtype,
        gpu=g,
        tp=tp,
        budget=budget,
        prefill=prefill,
        prefill_extras=extras,
        decode=inf.decode_flops(cfg, prompt, batch, C, semantics, program),
        decode_last=inf.decode_flops(cfg, last_p, batch, C, semantics, program).total,
        generation_flops=inf.generation_flops(cfg, prompt, generate, batch, semantics, program),
        memory=memory,
        memory_exact=memory_exact(cfg, stored, kv_dtype, attention),
        max_batch=best,
        max_batch_serving=serving,
        roofline=roofline,
        budget_basis=basis,
        engine=sizing,
    )
