"""transformers' Llama family replayed by the op library (``analytic.ops.transformers.llama``) equals
transformers' own model measured by the storage tracker on meta, phase by phase, byte for byte.

The measured side is the library's class, ``AutoModelForCausalLM.from_config`` (``measure.hf``), trained one
step as the Trainer does; the predicted side never imports torch.  Tiny shapes (S = 8 and 12, d = 16) keep
each measurement near 0.1 CPU-s; the exact lines in B are checked by B = 2 and 3 from one replay, B = 1 by
its own.  Four layers: the two middle ones are replayed once for both (``tensors.repeated``)."""

import dataclasses

import pytest

from lm_accounting.analytic.ops import predict_step, unsupported
from lm_accounting.config import load_config
from lm_accounting.setup import TrainingSetup

pytest.importorskip("transformers")
from lm_accounting.measure.hf import measure_hf_step

FAMILY = {
    "llama": ("llama-3-8b", {}),
    "mistral": ("mistral-7b", {"sliding_window": 6}),  # a window shorter than S = 8, 12: the mask is made
    "qwen2": ("llama-3-8b", {"hf_model_type": "qwen2", "qkv_bias": True}),
    "qwen3": ("qwen3-8b", {}),  # per-head q/k RMSNorm
}


def tiny(family: str, layers: int = 4, **kw):
    preset, extra = FAMILY[family]
    fields = dict(vocab_size=96, d_model=16, num_heads=4, num_kv_heads=2, d_ff=24, num_layers=layers, context_length=64)
    fields.update(extra, **kw)
    fields.setdefault("head_dim", None)
    return dataclasses.replace(load_config(preset), **fields)


def check(cfg, seq, setup):
    lines = predict_step(cfg, seq, setup, impl="transformers", batch=2)  # exact for every B >= 2
    for batch in (2, 3):
        assert lines.at(batch) == measure_hf_step(cfg, seq, batch, setup, device="meta"), (batch, setup)
    one = predict_step(cfg, seq, setup, impl="transformers", batch=1)
    assert one.at(1) == measure_hf_step(cfg, seq, 1, setup, device="meta"), (1, setup)


@pytest.mark.parametrize("attention", ["naive", "sdpa"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_llama_equals_transformers_on_meta(attention, precision):
    check(tiny("llama"), 8, TrainingSetup(attention=attention, precision=precision))


@pytest.mark.parametrize("attention", ["naive", "sdpa"])
def test_llama_full_checkpointing_equals_transformers(attention):
    check(tiny("llama"), 8, TrainingSetup(attention=attention, checkpoint="full"))


@pytest.mark.parametrize("family", ["mistral", "qwen2", "qwen3"])
def test_family_equals_transformers_on_meta(family):
    check(tiny(family), 8, TrainingSetup(attention="sdpa", precision="bf16"))


@pytest.mark.parametrize("attention", ["naive", "sdpa"])
def test_amp_bf16_equals_transformers_under_accelerates_autocast(attention):
    """fp32 parameters, the forward and the loss under autocast with its weight cache, the bf16 logits
    copied to fp32 after it (``measure.hf``: accelerate's ``convert_outputs_to_fp32``)."""
    check(tiny("llama"), 8, TrainingSetup(attention=attention, precision="amp-bf16"))


SETUPS = [
    TrainingSetup(attention=a, precision=p, checkpoint=c, optimizer=o)
    for a in ("naive", "sdpa")
    for p in ("fp32", "bf16", "amp-bf16")
    for c in ("none", "full")
    for o in ("foreach", "for-loop")
]


@pytest.mark.grid
@pytest.mark.parametrize("setup", SETUPS, ids=lambda s: "-".join(s.to_dict().values()))
@pytest.mark.parametrize("family", list(FAMILY))
@pytest.mark.parametrize("seq", [8, 12])
def test_llama_family_grid(family, seq, setup):
    check(tiny(family), seq, setup)


def test_refusals_name_what_is_not_transliterated():
    cfg = tiny("llama")
    assert unsupported(cfg, TrainingSetup(checkpoint="selective"), "transformers")
    assert unsupported(cfg, TrainingSetup(), "course-typo")
    assert unsupported(cfg, TrainingSetup(), "transformers") == []
    with pytest.raises(ValueError, match="selective"):
        predict_step(cfg, 8, TrainingSetup(checkpoint="selective"), impl="transformers")
    with pytest.raises(ValueError, match="traced run on cuda is not modelled"):
        predict_step(cfg, 8, TrainingSetup(), impl="transformers", device="cuda")


def test_the_tracker_on_cpu_tensors_equals_too():
    """On cpu the tracker sees the same program (a dispatch mode: the traced run) plus AdamW's step
    counters, which the for-loop and foreach keep on the cpu (4 bytes a parameter tensor)."""
    cfg, setup = tiny("llama"), TrainingSetup(attention="sdpa", precision="amp-bf16", checkpoint="full")
    meta = predict_step(cfg, 8, setup, impl="transformers", batch=2).at(2)
    cpu = predict_step(cfg, 8, setup, impl="transformers", batch=2, device="cpu").at(2)
    tensors = 1 + cfg.num_layers * 9 + 1 + 1  # embedding; per layer q, k, v, o, gate, up, down, two norms; norm; head
    assert cpu.baseline - meta.baseline == 4 * tensors
    assert cpu == measure_hf_step(cfg, 8, 2, setup, device="cpu", method="tracker")


@pytest.mark.parametrize(
    "setup",
    [TrainingSetup(attention="sdpa"), TrainingSetup(attention="naive", precision="amp-bf16", checkpoint="full")],
    ids=["sdpa-fp32", "naive-amp-full"],
)
def test_plain_cpu_run_equals_the_cpu_allocator(setup):
    """No dispatch mode: gradients summed in place, Python numbers wrapped in 8-byte tensors (and cast), the
    CPU flash kernel's per-thread scratch, checkpoint's saved CPU RNG state (5,056 bytes a layer)."""
    torch = pytest.importorskip("torch")
    cfg = tiny("llama")
    plain = predict_step(
        cfg, 8, setup, impl="transformers", batch=2, mode="plain", device="cpu", cpu_threads=torch.get_num_threads()
    )
    assert plain.at(2) == measure_hf_step(cfg, 8, 2, setup, device="cpu", method="allocator")


PLAIN_SETUPS = [
    TrainingSetup(attention=a, precision=p, checkpoint=c)
    for a in ("naive", "sdpa")
    for p in ("fp32", "bf16", "amp-bf16")
    for c in ("none", "full")
]


@pytest.mark.grid
@pytest.mark.parametrize("setup", PLAIN_SETUPS, ids=lambda s: "-".join(s.to_dict().values()))
@pytest.mark.parametrize("family", list(FAMILY))
@pytest.mark.parametrize(("batch", "seq"), [(1, 8), (2, 12)])
def test_plain_cpu_grid(family, batch, seq, setup):
    torch = pytest.importorskip("torch")
    cfg = tiny(family)
    plain = predict_step(
        cfg,
        seq,
        setup,
        impl="transformers",
        batch=batch,
        mode="plain",
        device="cpu",
        cpu_threads=torch.get_num_threads(),
    )
    assert plain.at(batch) == measure_hf_step(cfg, seq, batch, setup, device="cpu", method="allocator")


@pytest.mark.parametrize("attention", ["naive", "sdpa"])
def test_wide_bf16_model_keeps_the_lookup_until_the_model_returns(attention):
    """``LlamaModel.forward`` keeps ``inputs_embeds`` (a 16-bit lookup the first norm copies to fp32, so no
    node saves it) until it returns: at d = 1024 that tensor is at the forward peak."""
    cfg = tiny("qwen3", layers=1, d_model=1024, vocab_size=512, head_dim=128)
    check(cfg, 64, TrainingSetup(attention=attention, precision="bf16"))


def test_checkpointed_eager_layer_keeps_the_probabilities_until_it_returns():
    """``hidden_states, _ = self.self_attn(...)``: ``_`` holds eager attention's probabilities (B·h·S² elements)
    until the decoder layer returns; nothing else does when the layer is checkpointed, and at S = 64 with
    llama-3-8b's widths they are at the forward peak."""
    cfg = dataclasses.replace(load_config("llama-3-8b"), num_layers=3, vocab_size=512)
    check(cfg, 64, TrainingSetup(attention="naive", checkpoint="full"))


WIDE = {
    "llama": ("llama-3-8b", {}),
    "mistral": ("mistral-7b", {"sliding_window": 128}),
    "qwen2": ("llama-3-8b", {"hf_model_type": "qwen2", "qkv_bias": True}),
    "qwen3": ("qwen3-0.6b", {}),
}
WIDE_SETUPS = [
    TrainingSetup(attention=a, precision=p, checkpoint=c)
    for a in ("naive", "sdpa")
    for p in ("fp32", "bf16", "amp-bf16")
    for c in ("none", "full")
]


@pytest.mark.grid
@pytest.mark.parametrize("setup", WIDE_SETUPS, ids=lambda s: "-".join(s.to_dict().values()))
@pytest.mark.parametrize("family", list(WIDE))
@pytest.mark.parametrize("seq", [64, 256])
def test_real_widths_grid(family, seq, setup):
    """The presets' own widths (three layers, a 512-token vocabulary, on meta): where tensors of realistic
    relative sizes decide which one sets a peak."""
    preset, extra = WIDE[family]
    check(dataclasses.replace(load_config(preset), num_layers=3, vocab_size=512, **extra), seq, setup)
