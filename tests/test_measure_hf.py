"""transformers' own model, built from our config (``hf_config.to_hf_dict``) and measured by our tracker
(``lm_accounting.measure.hf``).

* The reverse map: every preset with an ``hf_model_type`` and every config.json of
  tests/test_transformers_truth.py, written back with ``to_hf_dict`` and built by transformers on meta, has
  exactly the parameter count of our analytic breakdown (deep models at a few layers: the count is
  embedding + head + layers, and each kind of layer, dense and sparse, is kept).
* The measured step of transformers' own model (``measure_hf_step``): its model states by hand, meta equal to
  cpu up to AdamW's step counters (and event by event in forward and backward), the trace adding up to the
  phases, the autocast emulation's weight cache against ``torch.autocast("cpu")``, a mixture of experts on
  cpu, and the one-line refusals.
"""

import dataclasses

import pytest

from lm_accounting.analytic.params import parameter_breakdown
from lm_accounting.config import AccountingError, ConfigError, load_config, preset_names
from lm_accounting.hf_config import config_from_hf, to_hf_dict
from lm_accounting.setup import TrainingSetup

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_transformers_truth import CONFIGS  # the committed config.json values

TYPED = [n for n in preset_names() if load_config(n).hf_model_type is not None]


def few_layers(cfg):
    """``cfg`` at the fewest layers that keep each kind of layer (a dense one, a sparse one, a full-attention
    one among windowed ones or Gated DeltaNet ones): the parameter count of the rest is the same layers again."""
    keep = max(
        2, cfg.dense_layers_first + cfg.moe_every, cfg.full_attention_every or 0, cfg.full_attention_interval or 0
    )
    return dataclasses.replace(cfg, num_layers=min(cfg.num_layers, keep))


def hf_parameters(cfg) -> int:
    values = to_hf_dict(cfg)
    config = transformers.AutoConfig.for_model(values.pop("model_type"), **values)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def test_presets_of_published_models_name_their_transformers_class():
    """The presets that are a transformers model name its model_type (as config.json does); the course
    presets name none, and the type changes no figure (it takes no part in equality)."""
    types = {n: load_config(n).hf_model_type for n in preset_names()}
    assert types["llama-3-8b"] == types["llama-3.1-405b"] == "llama"
    assert types["qwen3-30b-a3b"] == "qwen3_moe" and types["qwen3-0.6b"] == "qwen3"
    assert types["openai-gpt2-xl"] == "gpt2" and types["deepseek-v3"] == "deepseek_v3"
    assert types["mistral-7b"] == "mistral" and types["mixtral-8x7b"] == "mixtral"
    assert {types[n] for n in ("gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl")} == {None}
    llama = load_config("llama-3-8b")
    assert dataclasses.replace(llama, hf_model_type=None) == llama
    for name, (values, _) in CONFIGS.items():
        assert config_from_hf(values, name=name).hf_model_type == values.get("model_type"), name
        if name in TYPED:
            assert load_config(name).hf_model_type == values["model_type"], name


@pytest.mark.parametrize("name", TYPED)
def test_every_typed_preset_builds_in_transformers_with_our_parameter_count(name):
    cfg = few_layers(load_config(name))
    assert hf_parameters(cfg) == parameter_breakdown(cfg).total


@pytest.mark.parametrize("name", [n for n in CONFIGS if n not in TYPED])
def test_every_committed_config_json_builds_back_with_our_parameter_count(name):
    cfg = few_layers(config_from_hf(CONFIGS[name][0], name=name))
    assert hf_parameters(cfg) == parameter_breakdown(cfg).total


def test_a_config_transformers_cannot_express_is_refused():
    with pytest.raises(ConfigError, match="no hf_model_type"):
        to_hf_dict(load_config("gpt2-small"))
    biased = dataclasses.replace(load_config("llama-3-8b"), qkv_bias=True)  # Llama biases q, k, v and o together
    with pytest.raises(ConfigError, match="output_bias = False cannot be written as a llama config.json"):
        to_hf_dict(biased)
    with pytest.raises(ConfigError, match="hf_model_type must be"):
        dataclasses.replace(load_config("llama-3-8b"), hf_model_type="Llama 3")


# -- transformers' model measured (lm_accounting.measure.hf) ----------------------------------------------
TINY_LLAMA = dict(num_layers=2, vocab_size=512, d_model=64, num_heads=4, num_kv_heads=2, d_ff=96, context_length=256)
B, S = 2, 32
TENSORS = 2 * 9 + 3  # parameter tensors of TINY_LLAMA: q k v o gate up down + 2 norms a layer; embedding, norm, head
N = 512 * 64 + 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 96 + 2 * 64) + 64 + 512 * 64  # parameters, by hand
ROPE_BUFFERS = 2 * (16 // 2) * 4  # LlamaRotaryEmbedding's inv_freq and original_inv_freq, fp32, head_dim / 2 each


def tiny_llama():
    return dataclasses.replace(load_config("llama-3-8b"), **TINY_LLAMA)


def figures(memory):
    return [memory.baseline, *(getattr(memory, p) for p in ("forward", "backward", "optimizer_step"))]


def test_the_builder_is_transformers_own_class_with_our_parameter_count():
    from lm_accounting.analytic.params import parameter_breakdown as params
    from lm_accounting.measure.hf import build_hf_model

    setup = TrainingSetup(attention="sdpa", precision="bf16", checkpoint="full")
    model = build_hf_model(tiny_llama(), setup)
    assert type(model).__name__ == "LlamaForCausalLM" and model.training
    assert model.config._attn_implementation == "sdpa" and model.config.use_cache is False
    assert all(layer.gradient_checkpointing for layer in model.model.layers)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert sum(p.numel() for p in model.parameters()) == N == params(tiny_llama()).total


def test_the_step_holds_the_model_states_by_hand():
    """fp32, AdamW: the step starts with parameters and both moments (12·N bytes), the token ids and labels
    (int64) and the RoPE buffers; backward ends with the gradients added (4·N); the step ends where it began."""
    from lm_accounting.measure.hf import measure_hf_step

    memory = measure_hf_step(tiny_llama(), S, B)
    assert memory.baseline == 12 * N + 2 * B * S * 8 + ROPE_BUFFERS
    assert memory.backward.end == memory.baseline + 4 * N
    assert memory.optimizer_step.end == memory.baseline


@pytest.mark.parametrize(
    "setup",
    [
        TrainingSetup(),
        TrainingSetup(attention="sdpa", precision="amp-bf16", checkpoint="full"),
        TrainingSetup(precision="bf16", checkpoint="full", optimizer="for-loop"),
    ],
    ids=lambda s: s.label,
)
def test_meta_equals_cpu_up_to_adamw_step_counters(setup):
    """The tracker on meta and on cpu: every figure differs by AdamW's step counters only (for-loop and
    foreach keep one fp32 scalar per parameter tensor on the cpu: counted on a cpu run, not on meta)."""
    from lm_accounting.measure.hf import measure_hf_step

    meta, cpu = (figures(measure_hf_step(tiny_llama(), S, B, setup, device)) for device in ("meta", "cpu"))
    counters = 4 * TENSORS
    assert cpu[0] == meta[0] + counters
    for m, c in zip(meta[1:], cpu[1:], strict=True):
        assert (c.peak, c.end) == (m.peak + counters, m.end + counters)


def events(cfg, setup, device):
    from lm_accounting.measure.hf import trace_hf_step

    memory, trace = trace_hf_step(cfg, S, B, setup, device)
    return memory, [(e.phase, e.delta) for e in trace if e.device == device and e.phase in ("forward", "backward")]


def test_meta_allocates_and_frees_what_cpu_does_event_by_event():
    """Sliding-window Mistral with sdpa (a materialised bool mask, the CPU flash kernel) under amp-bf16 and
    full checkpointing: the meta run's forward and backward are the cpu run's, allocation for allocation."""
    mistral = dataclasses.replace(load_config("mistral-7b"), **TINY_LLAMA, sliding_window=16)
    assert mistral.sliding_window == 16 and mistral.hf_model_type == "mistral"
    setup = TrainingSetup(attention="sdpa", precision="amp-bf16", checkpoint="full")
    (_, meta), (_, cpu) = events(mistral, setup, "meta"), events(mistral, setup, "cpu")
    assert len(meta) > 500 and meta == cpu


def test_the_trace_adds_up_to_the_measured_phases():
    memory, trace = events(tiny_llama(), TrainingSetup(attention="sdpa"), "meta")
    live = memory.baseline
    for phase in ("forward", "backward"):
        peak = live
        for _, delta in (e for e in trace if e[0] == phase):
            live += delta
            peak = max(peak, live)
        assert (peak, live) == (getattr(memory, phase).peak, getattr(memory, phase).end)


def test_the_autocast_emulation_caches_weights_as_torch_autocast_does():
    """``HFAutocast`` against ``torch.autocast("cpu")`` (whose bf16 list has ``linear`` too): a weight used
    twice is cast once and its copy held until the region exits, as ``cached_cast`` does."""
    import torch.nn.functional as F

    from lm_accounting.measure.hf import HFAutocast
    from lm_accounting.measure.tracker import StorageTracker

    weight, x = torch.randn(64, 64, requires_grad=True), torch.randn(8, 64)

    def run(region):
        tracker = StorageTracker().track(weight, x)
        with tracker, torch.no_grad():
            with region:
                y = F.linear(F.linear(x, weight), weight)
                inside = tracker.live_bytes("cpu")
            after = tracker.live_bytes("cpu")
        assert y.dtype == torch.bfloat16
        return inside, after

    base = 64 * 64 * 4 + 8 * 64 * 4
    expected = (base + 64 * 64 * 2 + 8 * 64 * 2, base + 8 * 64 * 2)  # the cached copy, then only y
    assert run(torch.autocast("cpu", dtype=torch.bfloat16)) == expected
    assert run(HFAutocast(lower=frozenset({"linear"}))) == expected


def test_a_mixture_of_experts_runs_on_cpu_and_is_refused_on_meta():
    from lm_accounting.analytic.params import parameter_breakdown as params
    from lm_accounting.measure.hf import measure_hf_step

    moe = dataclasses.replace(
        load_config("qwen3-30b-a3b"), **TINY_LLAMA, head_dim=16, num_experts=4, experts_per_token=2, expert_d_ff=32
    )
    with pytest.raises(AccountingError, match="meta kernel takes bf16 weights only") as err:
        measure_hf_step(moe, S, B)
    assert "\n" not in str(err.value)
    tensors = 2 * 11 + 3  # q k v o q_norm k_norm, 2 norms, router, experts' gate_up and down; + 3
    memory = measure_hf_step(moe, S, B, device="cpu")
    assert memory.baseline == 12 * params(moe).total + 2 * B * S * 8 + ROPE_BUFFERS + 4 * tensors


@pytest.mark.parametrize(
    ("cfg", "setup", "device", "message"),
    [
        ("llama", TrainingSetup(checkpoint="selective"), "meta", "no selective activation checkpointing"),
        ("llama", TrainingSetup(checkpoint="op"), "meta", "no op activation checkpointing"),
        ("gpt2-small", TrainingSetup(), "meta", "not a Hugging Face model"),
        ("llama", TrainingSetup(), "meta-allocator", "reads the CPU allocator"),
        ("gemma2", TrainingSetup(attention="sdpa"), "meta", "transformers refuses this model: Gemma2ForCausalLM"),
    ],
)
def test_what_transformers_cannot_run_is_one_line(cfg, setup, device, message):
    from lm_accounting.measure.hf import measure_hf_step

    if cfg == "llama":
        cfg = tiny_llama()
    elif cfg == "gemma2":
        cfg = few_layers(config_from_hf(CONFIGS["gemma-2-2b"][0]))
        cfg = dataclasses.replace(cfg, vocab_size=512, d_model=64, num_heads=4, num_kv_heads=2, head_dim=16, d_ff=96)
    else:
        cfg = load_config(cfg)
    device, _, method = device.partition("-")
    with pytest.raises(AccountingError, match=message) as err:
        measure_hf_step(cfg, S, B, setup, device, method or "tracker")
    assert "\n" not in str(err.value)


def test_without_transformers_the_error_names_the_extra(monkeypatch):
    import sys

    from lm_accounting.measure.hf import measure_hf_step

    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    with pytest.raises(AccountingError, match=r'not installed: pip install "lm-accounting\[hf\]"$'):
        measure_hf_step(tiny_llama(), S, B)


def tiny_of(name):
    """The committed config.json ``name`` at test shapes (its architecture options kept)."""
    cfg = few_layers(config_from_hf(CONFIGS[name][0], name=name))
    shapes = dict(vocab_size=512, d_model=64, num_heads=4, d_ff=96, context_length=256)
    shapes["num_kv_heads"] = None if cfg.num_kv_heads is None else 2
    shapes["head_dim"] = None if cfg.head_dim is None else 16
    if cfg.positions == "learned":
        shapes["max_position_embeddings"] = 256
    if cfg.sliding_window is not None:
        shapes["sliding_window"] = 16
    if cfg.hf_model_type == "phi3":
        shapes["vocab_size"] = 32064  # Phi3Config's pad_token_id 32000 must be a row of the embedding
    return dataclasses.replace(cfg, **shapes)


DENSE = ["llama-3.1-8b", "qwen3-8b", "qwen2.5-0.5b", "mistral-7b", "phi-3-mini-4k", "gemma-2-2b", "gemma-3-1b"]
DENSE += ["olmo-2-7b", "openai-gpt2"]  # one config.json of every dense model type
HF_SETUPS = [TrainingSetup(attention="sdpa"), TrainingSetup(precision="amp-bf16", checkpoint="full")]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "setup"),
    [(n, s) for n in DENSE for s in HF_SETUPS if not (n == "gemma-2-2b" and s.attention == "sdpa")],  # refused
    ids=lambda v: v if isinstance(v, str) else v.label,
)
def test_every_dense_type_allocates_on_meta_what_it_does_on_cpu(name, setup):
    cfg = tiny_of(name)
    (_, meta), (_, cpu) = events(cfg, setup, "meta"), events(cfg, setup, "cpu")
    assert len(meta) > 300 and meta == cpu


@pytest.mark.slow
def test_cpu_layer_norm_keeps_bf16_statistics_where_meta_keeps_fp32():
    """The one difference of a pure-bf16 GPT-2 between meta and cpu: ``native_layer_norm``'s saved mean and rstd
    (one value a token each) are fp32 on meta (and CUDA: ``acc_type``) and bf16 on the CPU kernel."""
    gpt2 = tiny_of("openai-gpt2")
    (_, meta), (_, cpu) = (events(gpt2, TrainingSetup(precision="bf16"), device) for device in ("meta", "cpu"))
    differ = {(m, c) for m, c in zip(meta, cpu, strict=True) if m != c}
    tokens = B * S
    assert {(abs(m[1]), abs(c[1])) for m, c in differ} == {(4 * tokens, 2 * tokens)}


# -- FSDP2 over transformers' decoder layers, one rank on the fake process group --------------------------
def shard_elements(rows: int, cols: int, world: int) -> int:
    """Elements of rank 0's FSDP2 shard of a (rows, cols) parameter: ceil(rows / world) rows (dim-0 chunks,
    padded equal on every rank; rank 0's chunk is always full)."""
    return -(-rows // world) * cols


def rank0_parameters(world: int) -> int:
    """Rank 0's elements of TINY_LLAMA's parameters under FSDP2 (each 1-D norm weight is (64, 1))."""
    layer = 2 * shard_elements(64, 64, world) + 2 * shard_elements(32, 64, world)  # q, o; k, v
    layer += 2 * shard_elements(96, 64, world) + shard_elements(64, 96, world) + 2 * shard_elements(64, 1, world)
    return 2 * shard_elements(512, 64, world) + 2 * layer + shard_elements(64, 1, world)


@pytest.mark.parametrize("world", [4, 64])
def test_fsdp2_rank_holds_its_shards_by_hand(world):
    """ZeRO-3 over ``world`` ranks, on FakeTensors: rank 0 starts with its padded parameter shards and AdamW's
    two moments of them (12 bytes an element), the token ids and the RoPE buffers (unsharded); backward ends
    with its gradient shards added; the step ends where it began.  (AdamW's step counters, made by
    ``torch.tensor``, are no op's output: the rank tracker does not see them.)"""
    from lm_accounting.layout import ParallelLayout
    from lm_accounting.measure.hf import measure_hf_step

    shard = rank0_parameters(world)
    assert world != 4 or shard * 4 == N  # every dimension divides by 4: a quarter of the model
    memory = measure_hf_step(tiny_llama(), S, B, layout=ParallelLayout(dp=world, zero=3))
    assert memory.baseline == 12 * shard + 2 * B * S * 8 + ROPE_BUFFERS
    assert memory.backward.end == memory.baseline + 4 * shard
    assert memory.optimizer_step.end == memory.baseline
    assert memory.forward.peak > memory.baseline + 4 * N // world  # a layer gathered, activations held


@pytest.mark.parametrize(
    "setup",
    [TrainingSetup(), TrainingSetup(attention="sdpa", precision="amp-bf16", checkpoint="full")],
    ids=lambda s: s.label,
)
def test_fsdp2_on_fake_tensors_equals_real_cpu_tensors(setup):
    from lm_accounting.layout import ParallelLayout
    from lm_accounting.measure.hf import measure_hf_step

    layout = ParallelLayout(dp=4, zero=3)
    fake, real = (measure_hf_step(tiny_llama(), S, B, setup, device, layout=layout) for device in ("meta", "cpu"))
    assert figures(fake) == figures(real)


def test_fsdp2_zero2_keeps_the_layers_gathered_after_forward():
    """ZeRO-2 (``reshard_after_forward=False``, here on every unit, the root's too) ends the forward holding
    every unit's all-gathered parameters, the whole unsharded model (4·N bytes in fp32), which ZeRO-3 frees
    after each unit's forward; the two start and end the step alike."""
    from lm_accounting.layout import ParallelLayout
    from lm_accounting.measure.hf import measure_hf_step

    zero2, zero3 = (measure_hf_step(tiny_llama(), S, B, layout=ParallelLayout(dp=4, zero=z)) for z in (2, 3))
    assert zero2.baseline == zero3.baseline and zero2.optimizer_step.end == zero3.optimizer_step.end
    assert zero2.forward.end - zero3.forward.end == 4 * N


def test_fsdp2_refuses_what_it_does_not_run():
    from lm_accounting.layout import ParallelLayout
    from lm_accounting.measure.hf import measure_hf_step

    with pytest.raises(AccountingError, match="tensor parallel is run alone"):
        measure_hf_step(tiny_llama(), S, B, layout=ParallelLayout(dp=4, zero=1, tp=2))


def test_checkpointing_takes_the_older_name_where_transformers_predates_the_rename():
    """transformers 5.17 (the lent H200's) has ``gradient_checkpointing_enable`` only; 5.24 renamed it
    ``activation_checkpointing_enable``.  Each library gets the name it has, with the same kwargs."""
    from lm_accounting.measure.hf import enable_checkpointing

    calls = []

    class Old:
        def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
            calls.append(("gradient", gradient_checkpointing_kwargs))

    class New(Old):
        def activation_checkpointing_enable(self, activation_checkpointing_kwargs=None):
            calls.append(("activation", activation_checkpointing_kwargs))

    enable_checkpointing(Old(), {"use_reentrant": False})
    enable_checkpointing(New(), {"use_reentrant": False})
    assert calls == [("gradient", {"use_reentrant": False}), ("activation", {"use_reentrant": False})]
