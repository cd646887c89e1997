"""transformers' own ``generate()``, measured: the measured side of ``infer --program generate``.

``measure_hf_generate(cfg, P, G, B)`` builds transformers' model for ``cfg.hf_model_type`` (``hf.build_hf_model``:
cpu, fp32, seeded; then ``eval()``) and runs greedy ``model.generate`` on random ids of shape (B, P) for exactly
G new tokens, counting each forward call and reading the cache.  What transformers 5.x does, and what the figures
rest on (files under site-packages/transformers):

* ``generation/utils.py`` ``GenerationMixin._sample``: one forward for the prefill (``_prefill``: the whole
  prompt), then one per further token: G calls.  The G-th token comes from the last call's logits and is never
  fed back.  Decode call i (1 ≤ i ≤ G-1) feeds one token at position p = P + i - 1.
* ``generate``: ``model_kwargs["logits_to_keep"] = 1`` when the forward takes it (``_supports_logits_to_keep``),
  so the head runs on one position a row, the prefill's too: logits (B, 1, V), which ``_sample`` copies
  (``outputs.logits[:, -1].to(copy=True, dtype=torch.float32)``).
* ``generate`` step 7: ``max_cache_length = generation_config.max_length - 1`` = P + G - 1 is the static cache's
  size (``_prepare_cache_for_generation`` -> ``_prepare_static_cache`` -> ``StaticCache(max_cache_len=...)``),
  one slot fewer than P + G.
* ``cache_utils.py``: ``DynamicLayer.update`` concatenates (``torch.cat``; a fresh tensor of P + i positions
  after call i).  ``DynamicSlidingWindowLayer.update`` hands the attention the cache plus the new keys, then keeps
  the last ``sliding_window - 1`` positions as a *view* of that concatenation: the storage held is w positions
  (after the prefill, all P), one more than the tensor (``storage_bytes`` vs ``bytes``).  ``StaticLayer``:
  zeros of (B, kv heads, max_cache_len, d) at its first update, every slot handed to the attention (masked);
  ``StaticSlidingWindowLayer``: min(sliding_window, max_cache_len) slots, and a prefill longer than that gets
  the prompt's own keys.
* ``integrations/sdpa_attention.py`` ``sdpa_attention_forward``: with no mask and a causal query longer than one
  token, keys and values are cut to the query's length, so a static cache's sdpa prefill attends P × P (eager:
  P × (P + G - 1)); a decode step attends every static slot either way.
* DeepSeek's MLA (``models/deepseek_v3/modeling_deepseek_v3.py``, ``DeepseekV3Attention.forward``) caches the
  normed latent as the keys, (B, 1, n, kv_lora_rank), and the rotated key as the values, (B, 1, n,
  qk_rope_head_dim); each call expands every cached position with ``kv_b_proj`` (FLOPs that grow with n).
* Experts (``integrations/moe.py``): transformers' default, ``grouped_mm``, calls ``torch._grouped_mm``, which
  FlopCounterMode (torch 2.13) has no formula for: 0 FLOPs.  ``experts="batched_mm"`` (the default here, as in
  tests/test_transformers_truth.py) gathers each routed (token, expert) pair's weights and counts 2·T·k·(3·d·f)
  per MoE layer whatever the routing; ``"eager"`` loops over the experts hit: the same total.

FLOPs: one ``FlopCounterMode`` around ``generate``; a forward pre-hook and hook on the model snapshot its
counts, so each call's FLOPs are the difference (``flops_outside_forward``: what ``generate`` counted between
calls).  The CPU flash kernel of sdpa gets its formula from ``attention_flops.install``.  Each call is split by
module (exclusive: a module's counts less its counted descendants') and grouped (``GROUPS``): ``head`` (the
output embedding), ``attention`` (the ops an ``*Attention`` module runs itself, not in its linears: QKᵀ and AV,
eager ``bmm`` or sdpa), ``experts`` (within an ``*Experts`` module: the routed experts; DeepSeek's shared expert
is an MLP), ``rotary`` (a ``*RotaryEmbedding``'s matmul; these models' take an outer product by ``*``: 0) and
``linear`` (the rest: projections, MLPs, routers).  FlopCounterMode counts matmuls and attention kernels only:
norms, softmax, RoPE and the routing weights count nothing.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..config import AccountingError, ModelConfig

CACHES = {"dynamic": None, "static": "static"}
"""``cache`` -> ``generate``'s ``cache_implementation`` (None: ``DynamicCache(config=...)``)."""
EXPERTS = ("batched_mm", "eager", "grouped_mm")
GROUPS = ("head", "attention", "experts", "rotary", "linear")


def _tensor(t) -> dict[str, Any]:
    storage = t.untyped_storage().nbytes()
    return {
        "shape": list(t.shape),
        "dtype": str(t.dtype)[6:],
        "bytes": t.numel() * t.element_size(),
        "storage_bytes": storage,
    }


def _layer_record(layer) -> dict[str, Any]:
    """A cache layer: its class, lengths and every tensor it holds (keys, values, counters)."""
    keys = getattr(layer, "keys", None)
    return {
        "class": type(layer).__name__,
        "sliding": bool(getattr(layer, "is_sliding", False)),
        "seq_length": int(layer.get_seq_length()),  # tokens seen (a tensor on StaticLayer)
        "kept": 0 if keys is None else int(keys.shape[-2]),
        "max_length": int(layer.get_max_length()),  # -1: unbounded (DynamicLayer)
        "tensors": {k: _tensor(v) for k, v in vars(layer).items() if hasattr(v, "untyped_storage")},
    }


def _storage_bytes(layers) -> int:
    """Bytes of the distinct storages behind the layers' keys and values."""
    seen = {}
    for layer in layers:
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if t is not None:
                seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def _diff(after: dict, before: dict) -> dict[str, dict[Any, int]]:
    out = {}
    for name, ops in after.items():
        ops = {op: n - before.get(name, {}).get(op, 0) for op, n in ops.items()}
        if any(ops.values()):
            out[name] = {op: n for op, n in ops.items() if n}
    return out


def _exclusive(counts: dict[str, dict[Any, int]], root: str) -> dict[str, dict[str, int]]:
    """FlopCounterMode's inclusive {module: {op: FLOPs}} -> each module's own (its nearest counted descendants'
    subtracted), keyed by path without the root's class name ("" = the root itself)."""
    names = [n for n in counts if n == root or n.startswith(root + ".")]
    own = {n: defaultdict(int, {str(op): c for op, c in counts[n].items()}) for n in names}
    for name in names:
        parts = name.split(".")
        parent = next((p for p in (".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)) if p in own), None)
        for op, c in counts[name].items() if parent else ():
            own[parent][str(op)] -= c
    return {n[len(root) + 1 :]: {op: c for op, c in ops.items() if c} for n, ops in own.items() if any(ops.values())}


def _group(path: str, kinds: dict[str, str], head: str) -> str:
    """The group (``GROUPS``) of a module's own FLOPs, from its path and the classes of it and its ancestors."""
    parts = path.split(".")
    lineage = [kinds.get(".".join(parts[:i]), "") for i in range(1, len(parts) + 1)]
    if path == head:
        return "head"
    if any(kind.endswith("Experts") for kind in lineage):
        return "experts"
    if lineage[-1].endswith("Attention"):
        return "attention"
    return "rotary" if "RotaryEmbedding" in lineage[-1] else "linear"


def build_hf_generator(cfg: ModelConfig, attention: str = "sdpa", experts: str = "batched_mm", seed: int = 0):
    """transformers' model for ``cfg``: cpu, fp32, eval mode, its KV cache on (``hf.build_hf_model`` builds with
    ``use_cache=False``, the Trainer's), ``experts`` as its experts implementation (a mixture of experts)."""
    from ..setup import TrainingSetup
    from .hf import ATTN_IMPLEMENTATIONS, build_hf_model

    if attention not in ATTN_IMPLEMENTATIONS:
        raise AccountingError(f"unknown attention {attention!r} (valid: {', '.join(ATTN_IMPLEMENTATIONS)})")
    if experts not in EXPERTS:
        raise AccountingError(f"unknown experts implementation {experts!r} (valid: {', '.join(EXPERTS)})")
    model = build_hf_model(cfg, TrainingSetup(attention=attention, precision="fp32"), "cpu", seed)
    model.eval()
    model.config.use_cache = True
    if cfg.num_experts:
        model.set_experts_implementation(experts)
    return model


def measure_hf_generate(
    cfg: ModelConfig,
    prompt: int,
    generate: int,
    batch: int = 1,
    attention: str = "sdpa",
    cache: str = "dynamic",
    seed: int = 0,
    experts: str = "batched_mm",
) -> dict[str, Any]:
    """Greedy ``generate`` of exactly ``generate`` tokens after a random prompt of ``prompt`` ids, ``batch`` rows,
    by transformers' model for ``cfg`` (cpu, fp32; ``attention`` "naive" -> eager, "sdpa"; ``cache`` "dynamic" or
    "static"), measured (module docstring).  Plain ints, strings, lists and dicts:

    * ``forward_calls`` (G), ``flops`` (one total per call, prefill first), ``flops_total`` (the whole
      ``generate``), ``flops_outside_forward`` (the total less the calls');
    * ``steps``, one per call: ``kind`` ("prefill", "decode"), ``position`` (tokens cached before it: 0, then
      p = P + i - 1), ``input_shape``, ``flops``, ``groups`` ({group: FLOPs} over ``GROUPS``), ``by_module``
      ({path: {op: FLOPs}}, exclusive), ``by_op``, ``logits_shape`` ([B, 1, V]), ``logits_dtype``,
      ``keys_returned`` (per layer: positions its cache update handed the attention), ``cache_kept`` (per layer:
      positions the cache holds after the call), ``cache_storage_bytes`` (its key/value storages then), and for a
      mixture of experts ``expert_tokens`` ({experts module: routed (token, expert) pairs per expert}: k·B·S in
      all per layer);
    * the returned cache: ``cache_class``, ``cache_layers`` (per layer: ``class``, ``sliding``, ``seq_length``,
      ``kept``, ``max_length``, ``tensors`` {attribute: shape, dtype, bytes, storage_bytes}), ``cache_bytes``
      (keys and values, numel × size), ``cache_storage_bytes`` (their distinct storages), ``cache_other_bytes``
      (the layers' other tensors: length counters, window sizes);
    * ``sequences_shape`` ([B, P + G]) and the settings: ``model_class``, ``attn_implementation``,
      ``experts_implementation`` (None: no experts), ``cache``, ``prompt``, ``generate``, ``batch``, ``seed``.

    Without transformers: ``AccountingError`` naming the extra (``hf.require_transformers``)."""
    from .hf import patched_for, require_transformers

    require_transformers()
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from .attention_flops import install

    if cache not in CACHES:
        raise AccountingError(f"unknown cache {cache!r} (valid: {', '.join(CACHES)})")
    if min(prompt, generate, batch) < 1:
        raise AccountingError("prompt, generate and batch must each be at least 1")
    install()  # before FlopCounterMode is constructed (it copies the registry)
    steps: list[dict[str, Any]] = []
    state: dict[str, Any] = {}
    with patched_for("cpu"), torch.no_grad():
        model = build_hf_generator(cfg, attention, experts, seed)
        root, out_embedding = type(model).__name__, model.get_output_embeddings()
        names = {id(m): n for n, m in model.named_modules()}
        kinds = {n: type(m).__name__ for n, m in model.named_modules()}
        torch.manual_seed(seed)
        ids = torch.randint(0, cfg.vocab_size, (batch, prompt))
        counter = FlopCounterMode(display=False, depth=None)

        def record_keys(layer, i):  # the keys a layer's update hands the attention (once per layer object)
            update = layer.update

            def update_recorded(*args, **kwargs):
                k, v = update(*args, **kwargs)
                state["keys"][i] = int(k.shape[-2])
                return k, v

            layer.update, layer._measured = update_recorded, True

        def pre(module, args, kwargs):
            c = kwargs.get("cache")
            for i, layer in enumerate(getattr(c, "layers", [])):
                if not getattr(layer, "_measured", False):
                    record_keys(layer, i)
            state.update(keys={}, routed={}, before=counter.get_flop_counts())
            state["position"] = 0 if c is None else int(c.get_seq_length())

        def post(module, args, kwargs, output):
            calls = _diff(counter.get_flop_counts(), state["before"])
            own = _exclusive(calls, root)
            groups = dict.fromkeys(GROUPS, 0)
            for path, ops in own.items():
                groups[_group(path, kinds, names[id(out_embedding)])] += sum(ops.values())
            layers = list(getattr(output.cache, "layers", []))
            step = {
                "kind": "decode" if steps else "prefill",
                "position": state["position"],
                "input_shape": list(kwargs["input_ids"].shape),
                "flops": int(sum(calls.get("Global", {}).values())),
                "groups": groups,
                "by_module": own,
                "by_op": {str(op): n for op, n in calls.get("Global", {}).items()},
                "logits_shape": list(output.logits.shape),
                "logits_dtype": str(output.logits.dtype)[6:],
                "keys_returned": [state["keys"].get(i, 0) for i in range(len(layers))],
                "cache_kept": [_layer_record(layer)["kept"] for layer in layers],
                "cache_storage_bytes": _storage_bytes(layers),
            }
            if state["routed"]:
                step["expert_tokens"] = dict(sorted(state["routed"].items()))
            steps.append(step)

        def route(module, args):  # experts(hidden_states, top_k_index, top_k_weights)
            routed = torch.bincount(args[1].flatten(), minlength=module.num_experts)
            state["routed"][names[id(module)]] = routed.tolist()

        hooks = [
            model.register_forward_pre_hook(pre, with_kwargs=True),
            model.register_forward_hook(post, with_kwargs=True),
        ]
        hooks += [m.register_forward_pre_hook(route) for m in model.modules() if type(m).__name__.endswith("Experts")]
        try:
            with counter:
                out = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),  # every id a token, whatever pad_token_id is
                    max_new_tokens=generate,
                    min_new_tokens=generate,
                    do_sample=False,
                    eos_token_id=None,  # no stopping before max_new_tokens
                    pad_token_id=0,
                    use_cache=True,
                    cache_implementation=CACHES[cache],
                    return_dict_in_generate=True,
                )
        finally:
            for hook in hooks:
                hook.remove()
    total = int(counter.get_total_flops())
    layers = [_layer_record(layer) for layer in out.cache.layers]
    kv = [t for layer in out.cache.layers for t in (layer.keys, layer.values)]
    flops = [s["flops"] for s in steps]
    return {
        "model_class": root,
        "attn_implementation": model.config._attn_implementation,
        "experts_implementation": model.config._experts_implementation if cfg.num_experts else None,
        "cache": cache,
        "prompt": prompt,
        "generate": generate,
        "batch": batch,
        "seed": seed,
        "sequences_shape": list(out.sequences.shape),
        "forward_calls": len(steps),
        "flops": flops,
        "flops_total": total,
        "flops_outside_forward": total - sum(flops),
        "steps": steps,
        "cache_class": type(out.cache).__name__,
        "cache_layers": layers,
        "cache_bytes": sum(t.numel() * t.element_size() for t in kv),
        "cache_storage_bytes": _storage_bytes(out.cache.layers),
        "cache_other_bytes": sum(
            t["bytes"] for r in layers for name, t in r["tensors"].items() if name not in ("keys", "values")
        ),
    }
