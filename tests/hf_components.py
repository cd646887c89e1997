"""Our counts beside transformers' own model, component by component: shared by the architecture tests
(tests/test_gpt_oss.py, tests/test_arch_*.py).  ``our_keys(name)`` maps one of transformers' parameter or module
names to the keys of our component registry it covers (a fused projection covers several)."""

from collections import defaultdict

from lm_accounting.analytic.params import parameter_breakdown

LLAMA_TOP = {"model.embed_tokens": "token_embeddings", "model.norm": "ln_final", "lm_head": "lm_head"}
LLAMA_PREFIX = "model.layers."


def layer_keys(layer_map: dict, top: dict = LLAMA_TOP, prefix: str = LLAMA_PREFIX):
    """``our_keys`` for a model laid out as Llama's (``model.layers.<i>.<module>``): ``top``'s names, else the layer
    module (or parameter) in ``layer_map``, with or without ``.weight``; a wrapper's text model
    (``model.language_model.``) reads as the text model."""

    def our_keys(name: str) -> tuple[str, ...]:
        name = name.replace("model.language_model.", "model.")
        if name.removesuffix(".weight") in top:
            return (top[name.removesuffix(".weight")],)
        inner = name[len(prefix) :].partition(".")[2]
        keys = layer_map[inner] if inner in layer_map else layer_map[inner.removesuffix(".weight")]
        return tuple(f"layers.*.{k}" for k in keys)

    return our_keys


def assert_parameters_by_component(bd, model, our_keys, with_empty: bool = True) -> None:
    """Every parameter of ``model`` under our keys, and each group of keys' total equal to transformers' count.
    ``with_empty`` False: our components of 0 parameters (a tied head) are left out of the key comparison."""
    by_keys: dict[tuple[str, ...], int] = defaultdict(int)
    for hf_name, param in model.named_parameters():
        by_keys[our_keys(hf_name)] += param.numel()
    assert {k for keys in by_keys for k in keys} == {it.key for it in bd if with_empty or it.total}
    for keys, count in by_keys.items():
        assert sum(bd[k].total for k in keys) == count, (keys, count)


def assert_parameters_equal(cfg, model, our_keys, with_empty: bool = True):
    """``parameter_breakdown(cfg)`` beside transformers' ``model``: the total, then every parameter under our keys and
    each group's total (``assert_parameters_by_component``).  Returns the breakdown."""
    bd = parameter_breakdown(cfg)
    assert bd.total == sum(p.numel() for p in model.parameters())
    assert_parameters_by_component(bd, model, our_keys, with_empty)
    return bd


def assert_forward_flops_by_component(fwd, counted, our_keys, top, layer_map, prefix, attention: str) -> None:
    """``FlopCounterMode``'s per-module counts (``counted``) against our forward FLOPs: the total, each mapped
    module, and the attention core (the attention module's own FLOPs less its children's: eager QKᵀ and AV) equal
    to our QKᵀ + AV."""
    assert counted["total"] == fwd.total, (counted["total"], fwd.total)
    by_keys: dict[tuple[str, ...], int] = defaultdict(int)
    attention_core = 0
    for module, flops in counted.items():
        if module in top:
            by_keys[our_keys(module)] += flops
        elif module.startswith(prefix) and module.count(".") > 2:
            inner = module[len(prefix) :].partition(".")[2]
            if inner == attention:
                depth = module.count(".") + 1  # the attention's direct children (OPT's prefix is one level deeper)
                children = sum(v for k, v in counted.items() if k.startswith(module + ".") and k.count(".") == depth)
                attention_core += flops - children
            elif inner in layer_map:
                by_keys[our_keys(module)] += flops
    assert {k for keys in by_keys for k in keys} == {it.key for it in fwd} - {"layers.*.attn.qk", "layers.*.attn.av"}
    for keys, flops in by_keys.items():
        assert sum(fwd[k].total for k in keys) == flops, (keys, flops)
    assert attention_core == fwd["layers.*.attn.qk"].total + fwd["layers.*.attn.av"].total


def cpu_model(values: dict):
    """transformers' model of a config.json's ``values`` on CPU, seeded, eager attention; routed experts as
    ``batched_mm`` (FlopCounterMode counts the experts that ran; the default ``grouped_mm`` counts 0).  For the
    layers whose code cannot run on meta (Gated DeltaNet, Mamba2, DeepSeek Sparse Attention's indexer)."""
    import torch
    import transformers

    values = dict(values)
    config = transformers.AutoConfig.for_model(values.pop("model_type"), **values)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", experts_implementation="batched_mm"
    )


def cpu_forward_flops(model, batch: int, seq: int) -> dict[str, int]:
    """FlopCounterMode's forward FLOPs of ``model`` on ``batch`` × ``seq`` seeded token ids, per module (the
    model's class name dropped) and ``total``."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(1))
    with FlopCounterMode(display=False, depth=None) as counter, torch.no_grad():
        model(input_ids=ids, use_cache=False)
    root = type(model).__name__ + "."
    flops = {k.removeprefix(root): int(sum(v.values())) for k, v in counter.get_flop_counts().items()}
    flops["total"] = int(counter.get_total_flops())
    return flops


def hybrid_cache_after_prefill(model, batch: int, prompt: int) -> tuple[int, set]:
    """transformers' cache after a prefill of ``batch`` × ``prompt`` seeded ids: (the bytes of every tensor it
    holds: attention layers' keys and values, linear layers' conv and recurrent states; the (shape, dtype) of the
    states)."""
    import torch

    ids = torch.randint(0, 97, (batch, prompt), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).past_key_values
    held, shapes = 0, set()
    for layer in cache.layers:
        for t in [getattr(layer, "keys", None), getattr(layer, "values", None)]:
            if isinstance(t, torch.Tensor):
                held += t.numel() * t.element_size()
        for states in (getattr(layer, "conv_states", {}), getattr(layer, "recurrent_states", {})):
            for t in states.values():
                if t is not None:
                    held += t.numel() * t.element_size()
                    shapes.add((tuple(t.shape), t.dtype))
    return held, shapes
