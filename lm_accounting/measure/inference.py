"""Measure inference on the live model with a static KV cache: FLOPs, cache bytes and step memory.

``measure_inference(result, device)`` builds the live model of an ``Inference`` result, allocates
its ``StaticKVCache`` (the result's ``cache_slots`` and semantics), runs the prefill and decode steps
under ``torch.no_grad``, and returns predicted-vs-measured rows:

* the live model runs the result's attention (``naive``, or ``sdpa``: the fused kernel, whose QKᵀ + AV
  FLOPs compare as one ``layers.*.attn.sdpa`` component, ``crosscheck.fused_attention_view``);
* FlopCounterMode over the prefill and over decode steps at p = P and at the last p = P + G − 2
  (the cache's fill level is set to p directly: FLOPs and memory depend on the position, not on the
  cached values), total and per component;
* the cache tensors' bytes against ``kv_cache_bytes``;
* for the course architecture (the step replay's scope), the storage tracker's peak during the
  prefill and the last decode step against the predicted peaks (weights + cache + RoPE tables + ids +
  the step's temporaries) on meta and cpu; on cuda the bytes the tensors requested from the caching
  allocator, less the cuBLAS workspaces; those and the allocator's rounding are reported beside, in
  ``overheads`` (measured, labelled).
"""

from __future__ import annotations

import gc
import re
from typing import Any

from ..analytic import inference as inf
from ..config import AccountingError
from ..names import TORCH_DTYPES


def _flops_by_key(run, keys) -> tuple[int, dict[str, int]]:
    from torch.utils.flop_counter import FlopCounterMode

    from .flops import _collect

    with FlopCounterMode(display=False, depth=None) as counter:
        run()
    root = "TransformerLM."
    leaf: dict[str, int] = {}
    for name, ops in counter.get_flop_counts().items():
        if name.startswith(root):  # the absorbed MLA decode's two products are kv_b_proj's row (model.mla)
            path = re.sub(r"\.absorb_[qo]$", ".kv_b_proj", name.removeprefix(root))
            leaf[path] = leaf.get(path, 0) + int(sum(ops.values()))
    by_key, _ = _collect(leaf, keys)
    return int(counter.get_total_flops()), dict(by_key)


def _peak(run, model, cache, ids, device: str, overheads: dict[str, int]) -> int:
    """The step's peak: the storage tracker on meta/cpu; on cuda the bytes the tensors requested
    (``requested_bytes``) less the cuBLAS workspaces, which go to ``overheads`` with the allocator's
    own rounding (both measured, labelled; ``tracker.measure_training_step_cuda``)."""
    import torch

    from .tracker import ALLOCATOR_ROUNDING, CUBLAS_WORKSPACES, StorageTracker, cublas_workspace_bytes, cuda_counters

    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        run()
        _, peak, _, allocated = cuda_counters(None)
        ws = cublas_workspace_bytes(None)
        overheads[CUBLAS_WORKSPACES] = max(overheads.get(CUBLAS_WORKSPACES, 0), ws)
        overheads[ALLOCATOR_ROUNDING] = max(overheads.get(ALLOCATOR_ROUNDING, 0), allocated - peak)
        return peak - ws
    tracker = StorageTracker().track_module(model).track(*cache.tensors()).track(ids)
    with tracker, tracker.phase("step"):
        run()
    return tracker.phase_table(device)["step"].peak


def _absorbed(result) -> bool:
    """The engine program's MLA: measured on the live model's absorbed decode, with naive attention in the
    prefill (the live model has no fused latent kernel; the FLOPs are the same, the peaks are not compared:
    MLA's temporaries are an estimate)."""
    return result.config.mla and result.program == "engine"


def check_measurable(result, device: str) -> None:
    """What the live model cannot run: weights and cache in two dtypes, TP, a fused windowed or latent kernel,
    or a fused kernel predicted for another device's kernels."""
    if result.weights not in ("fp32", "bf16") or result.kv_dtype != result.weights:
        raise AccountingError(
            "--measure runs the live model in one dtype: use --weights bf16 --kv-dtype bf16 (or fp32 for both)"
        )
    if result.tp != 1:
        raise AccountingError("--measure runs one GPU's model: leave --tp at 1")
    cfg = result.config
    if result.attention == "sdpa" and (cfg.sliding_window is not None or (cfg.mla and not _absorbed(result))):
        what = "sliding window" if cfg.sliding_window is not None else "latent attention (MLA: narrower value heads)"
        raise AccountingError(
            f"--measure: the live model's fused attention has no {what}; measure transformers' form with --program "
            "generate --attention naive (its FLOPs and memory, not the engine's)"
        )
    if result.memory_exact and result.attention == "sdpa" and (device == "cuda") != (result.device == "cuda"):
        raise AccountingError(  # meta and cpu run torch's CPU flash kernel, cuda its flash/efficient kernels
            f"the prediction is for the fused kernel on {result.device}, the measurement on {device}: "
            f"predict with infer(..., device={device!r})"
        )


def check_inference_run(result, device: str) -> None:
    """Refuse, before torch builds anything, a measurement of ``result`` that cannot run on ``device``: what the
    live model cannot run (``check_measurable``), a tensor past torch's 2^63-byte limit (any device, meta
    included: ``devices.inference_tensors``), more live layers than the host holds (``devices.check_host_layers``),
    or a predicted peak over what the device allows (``devices.check_device_fits``: the same rule as a training
    step's, 80 % of the CPU's available memory)."""
    check_measurable(result, device)
    from .devices import (
        TRAINING_HOST_BYTES_PER_LAYER,
        check_device_fits,
        check_host_layers,
        check_tensors,
        inference_tensors,
    )

    cfg, what = result.config, f"--measure {device} of {result.config.name}"
    e = 4 if result.weights == "fp32" else 2
    check_tensors(what, inference_tensors(cfg, result.prompt, result.capacity, result.batch, e))
    check_host_layers(what, cfg.num_layers, TRAINING_HOST_BYTES_PER_LAYER, device)
    if device != "meta":
        what = f"inference of {cfg.name} at B = {result.batch}"
        check_device_fits(device, result.memory["peak"], what, "a smaller --batch, --prompt or --generate")


def check_measure_time(result, device: str, allow_long: bool = False) -> str:
    """Before any torch work: refuse a measurement that cannot run (``check_inference_run``) or is estimated
    to run past ``MAX_LIVE_SECONDS`` without ``allow_long``; else return one line with the estimated time and
    memory (the CLI prints it on stderr)."""
    from ..units import fmt_bytes
    from .devices import MAX_LIVE_SECONDS, estimate_inference_seconds, fmt_seconds

    cfg, need = result.config, result.memory["peak"]
    check_inference_run(result, device)
    seconds = estimate_inference_seconds(result, device)
    if seconds > MAX_LIVE_SECONDS and not allow_long:
        quick = fmt_seconds(estimate_inference_seconds(result, "meta"))
        raise AccountingError(
            f"--measure {device} of {cfg.name} would take about {fmt_seconds(seconds)} (estimated: building the "
            f"model and running the prefill twice and four decode steps); the limit without --allow-long is "
            f"{fmt_seconds(MAX_LIVE_SECONDS)}: pass --allow-long to run it, or use --measure meta (FLOPs and "
            f"peaks, no memory held, about {quick}), a smaller model or a shorter --prompt"
        )
    where = "nothing held (meta)" if device == "meta" else f"{fmt_bytes(need)} of {device} memory at the peak"
    return f"measuring {cfg.name} on {device}: about {fmt_seconds(seconds)} and {where} (estimated)"


def measure_inference(result, device: str = "meta") -> dict[str, Any]:
    """Predicted-vs-measured rows for ``result`` (an ``Inference``) on ``device`` (module docstring)."""
    import torch

    from ..model import build_model
    from ..model.kv_cache import StaticKVCache, decode, prefill
    from ..setup import TrainingSetup
    from .attention_flops import install
    from .crosscheck import fused_attention_view

    cfg = result.config
    peaks = result.memory_exact  # peaks compared: the step replay's scope (else FLOPs and cache only)
    B, P, C, sem = result.batch, result.prompt, result.capacity, result.semantics
    last_only = result.program != "forward"  # logits_to_keep = 1 and the sampler's fp32 copy
    # the engine's prefill counts the pairs a causal kernel computes; a counter counts the square, as generate's
    counted = "generate" if result.program == "engine" else result.program
    check_inference_run(result, device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    dtype = getattr(torch, TORCH_DTYPES[result.weights])
    rows: list[tuple[str, int, int]] = []
    overheads: dict[str, int] = {}
    absorbed = _absorbed(result)
    sdpa = result.attention == "sdpa" and not absorbed
    install()  # FlopCounterMode's formula for the CPU flash kernel (it counts it 0 on torch 2.13)

    def as_live(bd):  # the fused kernel is one module, layers.*.attn.sdpa: QKᵀ + AV compare as one
        return fused_attention_view(bd) if sdpa else bd

    with torch.no_grad():
        attention = "naive" if absorbed else result.attention
        setup = TrainingSetup(attention=attention, precision=result.weights)  # pure fp32 or bf16
        model = build_model(cfg, device, dtype, setup=setup)
        cache = StaticKVCache(cfg, B, result.cache_slots, device, dtype, sem, absorbed=absorbed)
        rows.append(("KV cache bytes (cache tensors)", result.memory["kv_cache"], cache.nbytes))
        square = inf.prefill_flops(cfg, P, B, C, sem, counted)
        predicted_prefill = as_live(square)
        keys = [it.key for it in predicted_prefill]
        ids = torch.zeros(B, P, dtype=torch.long, device=device)

        def run_prefill():
            logits = prefill(model, ids, cache, last_only)
            if last_only:  # generate: outputs.logits[:, -1].to(copy=True, dtype=torch.float32)
                return logits[:, -1].to(copy=True, dtype=torch.float32)
            return logits

        total, by_key = _flops_by_key(run_prefill, keys)
        square_note = ", the full square as counters count it" if counted != result.program else ""
        what = f"prefill FLOPs (FlopCounterMode{square_note})"
        rows.append((what, square.total, total))
        rows += [(f"  prefill {it.key}", it.total, by_key.get(it.key, 0)) for it in predicted_prefill]
        cache.length = 0
        if peaks:
            measured = _peak(run_prefill, model, cache, ids, device, overheads)
            rows.append(("prefill peak bytes", result.memory["prefill_peak"], measured))
        last = P + max(result.generate - 2, 0)
        one = torch.zeros(B, 1, dtype=torch.long, device=device)
        for p in sorted({P, (P + last) // 2, last}):
            predicted = as_live(inf.decode_flops(cfg, p, B, C, sem, result.program))
            cache.length = p
            total, by_key = _flops_by_key(lambda: decode(model, one, cache), keys)
            rows.append((f"decode FLOPs at p = {p:,}", predicted.total, total))
            rows += [(f"  decode p = {p:,} {it.key}", it.total, by_key.get(it.key, 0)) for it in predicted]
        cache.length = last
        if peaks:

            def run_decode():
                logits = decode(model, one, cache)
                return logits[:, -1].to(copy=True, dtype=torch.float32) if last_only else logits

            measured = _peak(run_decode, model, cache, one, device, overheads)
            rows.append((f"decode peak bytes at p = {last:,}", result.memory["decode_peak"], measured))
    used = "naive, MLA decoded absorbed" if absorbed else result.attention
    out = {"device": device, "dtype": result.weights, "attention": used, "rows": rows}
    if overheads:
        out["overheads"] = overheads
    return out
