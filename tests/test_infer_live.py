"""lm-account infer against the live model with a static KV cache: FlopCounterMode per component on
prefill and decode steps, the cache tensors' bytes, and the storage tracker's peaks (meta and cpu);
the cached decode reproduces the full forward's logits (cpu)."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from lm_accounting.analytic.inference import decode_flops, kv_bytes
from lm_accounting.analytic.inference_report import infer
from lm_accounting.config import AccountingError, ModelConfig
from lm_accounting.measure.inference import measure_inference
from lm_accounting.measure.tracker import CUBLAS_WORKSPACES
from lm_accounting.model import build_model
from lm_accounting.model.kv_cache import StaticKVCache, decode, prefill

BASE = dict(vocab_size=96, context_length=64, num_layers=3, d_model=32, num_heads=4, d_ff=64)
CONFIGS = {
    "mha": {},
    "gqa": {"num_kv_heads": 2},
    "gqa-qk-norm": {"num_kv_heads": 2, "qk_norm": True, "head_dim": 16},
    "windowed": {"num_kv_heads": 2, "sliding_window": 6},
    "windowed-mixed": {"sliding_window": 5, "full_attention_every": 2},
    "gqa-qkv-bias": {"num_kv_heads": 2, "qkv_bias": True},  # Qwen2
}
MLA = {"kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 6}
OTHER = {  # FLOPs and cache bytes only (the step replay covers the course architecture)
    "mla": MLA,
    "mla-q-lora": {**MLA, "q_lora_rank": 12},
    "moe": {"num_kv_heads": 2, "num_experts": 4, "experts_per_token": 2, "expert_d_ff": 16},
    "gpt2-style": {
        "norm": "layernorm",
        "mlp": "gelu",
        "positions": "learned",
        "qkv_bias": True,
        "tie_embeddings": True,
    },
}


def tiny(name):
    return ModelConfig(**BASE, **CONFIGS[name], name=name)


@pytest.mark.parametrize("semantics", ["filled", "static"])
@pytest.mark.parametrize("name", CONFIGS)
def test_prediction_equals_the_live_model_on_meta(name, semantics):
    weights = "fp32" if name == "mha" else "bf16"
    r = infer(tiny(name), 11, 9, 3, weights=weights, kv_dtype=weights, semantics=semantics)
    rows = measure_inference(r, "meta")["rows"]
    wrong = [(k, p, m) for k, p, m in rows if p != m]
    assert not wrong
    labels = [k for k, _, _ in rows]
    assert "KV cache bytes (cache tensors)" in labels and "prefill peak bytes" in labels
    assert sum(k.startswith("decode FLOPs at p = ") for k in labels) == 3  # p = P, a middle one, the last
    assert any(k.startswith("  decode") and k.endswith("layers.*.attn.qk") for k in labels)  # per component too


@pytest.mark.parametrize("semantics", ["filled", "static"])
@pytest.mark.parametrize("name", OTHER)
def test_flops_and_cache_of_other_architectures_on_meta(name, semantics):
    cfg = ModelConfig(**BASE, **OTHER[name], name=name)
    rows = measure_inference(infer(cfg, 9, 7, 3, semantics=semantics), "meta")["rows"]
    assert all(p == m for _, p, m in rows), [row for row in rows if row[1] != row[2]]
    assert not any("peak" in k for k, _, _ in rows)  # not claimed outside the replay's scope


@pytest.mark.parametrize("name", ["mla", "mla-q-lora"])
def test_latent_cache_decode_reproduces_the_full_forward(name):
    cfg = ModelConfig(**BASE, **OTHER[name], name=name)
    torch.manual_seed(0)
    model = build_model(cfg, "cpu")
    ids = torch.randint(0, cfg.vocab_size, (2, 12))
    with torch.no_grad():
        full = model(ids)
        for semantics in ("filled", "static"):
            cache = StaticKVCache(cfg, 2, 12, "cpu", torch.float32, semantics)
            steps = [prefill(model, ids[:, :5], cache)] + [
                decode(model, ids[:, t : t + 1], cache) for t in range(5, 12)
            ]
            torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["gqa", "windowed-mixed"])
def test_prediction_equals_the_tracker_on_cpu(name):
    r = infer(tiny(name), 7, 6, 2, weights="fp32", kv_dtype="fp32")
    rows = measure_inference(r, "cpu")["rows"]
    assert all(p == m for _, p, m in rows), [row for row in rows if row[1] != row[2]]


def test_every_decode_position_counts_exactly():
    """Walk a whole generation on meta, step by step, windowed ring wrapping included."""
    cfg = tiny("windowed-mixed")
    B, P, G = 2, 4, 9
    for semantics in ("filled", "static"):
        model = build_model(cfg, "meta")
        cache = StaticKVCache(cfg, B, P + G, "meta", torch.float32, semantics)
        prefill(model, torch.zeros(B, P, dtype=torch.long, device="meta"), cache)
        for p in range(P, P + G - 1):
            with torch.no_grad(), FlopCounterMode(display=False) as counter:
                decode(model, torch.zeros(B, 1, dtype=torch.long, device="meta"), cache)
            assert counter.get_total_flops() == decode_flops(cfg, p, B, P + G, semantics).total


def test_cache_bytes_match_kv_cache_bytes_for_windows():
    cfg = tiny("windowed-mixed")  # layers 0 and 2 windowed (w = 5), layer 1 full
    cache = StaticKVCache(cfg, 3, 20, "meta", torch.bfloat16)
    # K and V · 4 heads × head_dim 8 · B = 3 · 2 bytes · (5 + 20 + 5) cached tokens over the three layers
    assert cache.nbytes == kv_bytes(cfg, 20, 3, "bf16") == 2 * (4 * 8) * 3 * 2 * (5 + 20 + 5)


@pytest.mark.parametrize("semantics", ["filled", "static"])
@pytest.mark.parametrize("name", ["gqa", "windowed", "windowed-mixed"])
def test_cached_decode_reproduces_the_full_forward(name, semantics):
    cfg = tiny(name)
    torch.manual_seed(0)
    model = build_model(cfg, "cpu")
    ids = torch.randint(0, cfg.vocab_size, (2, 14))
    with torch.no_grad():
        full = model(ids)
        cache = StaticKVCache(cfg, 2, 14, "cpu", torch.float32, semantics)
        steps = [prefill(model, ids[:, :8], cache)]
        steps += [decode(model, ids[:, t : t + 1], cache) for t in range(8, 14)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


def test_measure_refuses_what_the_live_model_cannot_run():
    r = infer(tiny("gqa"), 8, 4, 1, weights="int4")
    with pytest.raises(AccountingError, match="one dtype"):
        measure_inference(r, "meta")
    with pytest.raises(AccountingError, match="--tp"):
        measure_inference(infer(tiny("gqa"), 8, 4, 1, tp=2), "meta")


def test_cli_measure_meta(run_cli):
    r = run_cli("infer", "gpt2-small", "--prompt", "24", "--generate", "5", "--batch", "2", "--measure", "meta")
    assert r.code == 0, r.err
    assert "Predicted vs measured on meta" in r.out and " NO" not in r.out


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_flops_exact_and_memory_close():
    r = infer(tiny("gqa"), 16, 8, 4, weights="bf16")
    measured = measure_inference(r, "cuda")
    for key, predicted, got in measured["rows"]:
        if "FLOPs" in key or key.startswith(("  ", "KV")):
            assert predicted == got, key
        else:  # requested bytes less the cuBLAS workspaces: a few KB above (the fused kernel's extras)
            assert predicted <= got <= predicted + 64 * 1024, key
    assert measured["overheads"][CUBLAS_WORKSPACES] > 0  # the workspaces come back beside, labelled
