"""Partial rotary (``rotary_dim``; issue 30): RoPE on the first dimensions of each Q and K head, the rest passed.

GLM (``glm``, ``glm4``, ``glm4_moe``: GLM-4.5/4.6), MiniMax-M2 (``minimax_m2``) and StableLM (``stablelm``) rotate
the first dimensions of every Q and K head and pass the others through (transformers' ``apply_rotary_pos_emb``:
``q_rot``/``q_pass``, concatenated back).  Their parameters and forward FLOPs are proven against transformers in
tests/test_hf_zoo.py (``ZOO``; the published GLM-4.5-Air, GLM-4.5, MiniMax-M2, GLM-4-9B-0414, glm-4-9b-chat-hf and
StableLM configs in ``PUBLISHED``), and the course program's step memory against the live model in
tests/test_ops_course.py (``partial_rotary``, ``glm4_moe``, ``minimax_m2``).  Here:

* the rotated width our reader derives equals transformers' own (the width of its rotary table, built on meta;
  StableLM's ``rotary_ndims``): a factor given, the class's default, one in ``rope_parameters``, an odd
  ``int(head_dim · factor)``, MiniMax-M2's legacy ``rotary_dim``;
* our partial rotation equals GLM's ``apply_rotary_pos_emb`` on CPU and leaves the passed-through part as it was;
* the elementwise FLOPs by hand (3 per rotated element), transformers' parameter tensors (``hf_tensors``), the
  live model's cross-check on meta and cpu, its cached decode, and what the memory replays say;
* bad input: one line, exit 2.
"""

import dataclasses
import json

import pytest

from lm_accounting.analytic.flops import nonmatmul_flops
from lm_accounting.config import ConfigError, ModelConfig
from lm_accounting.hf_config import config_from_hf
from lm_accounting.layout import ParallelLayout
from lm_accounting.setup import TrainingSetup

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from test_hf_zoo import PUBLISHED, ZOO


def without(values: dict, key: str) -> dict:
    return {k: v for k, v in values.items() if k != key}


WIDTHS = {  # name -> (model_type, config.json values)
    "glm4_moe": ("glm4_moe", ZOO["glm4_moe"]),  # 0.5 of 24 given
    "glm4_moe-default": ("glm4_moe", without(ZOO["glm4_moe"], "partial_rotary_factor")),  # the class's 0.5
    "glm4_moe-odd": ("glm4_moe", {**ZOO["glm4_moe"], "head_dim": 26}),  # int(13): the cos table is 14 wide
    "glm4": ("glm4", ZOO["glm4"]),  # 0.75 of 16 in rope_parameters
    "glm4-both": ("glm4", {**ZOO["glm4"], "partial_rotary_factor": 0.25}),  # rope_parameters' wins
    "glm": ("glm", ZOO["glm"]),  # the class's 0.5 of 20
    "minimax_m2": ("minimax_m2", ZOO["minimax_m2"]),  # rotary_dim 8 of 32
    "minimax_m2-factor": ("minimax_m2", {**ZOO["minimax_m2"], "partial_rotary_factor": 0.5}),  # wins over it
    "minimax_m2-full": ("minimax_m2", without(ZOO["minimax_m2"], "rotary_dim")),
    "stablelm": ("stablelm", ZOO["stablelm"]),  # the class's 0.25 of 16
    "stablelm-half": ("stablelm", {**ZOO["stablelm"], "partial_rotary_factor": 0.5}),
}


def transformers_width(model_type: str, values: dict) -> int:
    """The dimensions transformers rotates: 2 × its inverse frequencies (``cos.shape[-1]``, what
    ``apply_rotary_pos_emb`` splits at); StableLM slices ``rotary_ndims``, checked to be the same."""
    config = transformers.AutoConfig.for_model(model_type, **values)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    width = 2 * model.model.rotary_emb.inv_freq.numel()
    if model_type == "stablelm":
        assert model.model.layers[0].self_attn.rotary_ndims == width
    return width


@pytest.mark.parametrize("name", WIDTHS)
def test_the_rotated_width_is_transformers_own(name):
    model_type, values = WIDTHS[name]
    cfg = config_from_hf({"model_type": model_type, **values})
    assert cfg.rope_dim == transformers_width(model_type, values)
    assert cfg.partial_rotary == (name != "minimax_m2-full")


def test_the_published_widths():
    """Half of each 128-wide head for GLM-4.5(-Air) and GLM-4 (``partial_rotary_factor`` 0.5) and MiniMax-M2
    (``rotary_dim`` 64); a quarter of StableLM's (0.25 of 64 and of 80)."""
    widths = {name: config_from_hf(values).rotary_dim for name, values in PUBLISHED.items()}
    assert {n: widths[n] for n in ("GLM-4.5-Air", "GLM-4.5", "MiniMax-M2", "GLM-4-9B-0414", "glm-4-9b-chat-hf")} == {
        "GLM-4.5-Air": 64,
        "GLM-4.5": 64,
        "MiniMax-M2": 64,
        "GLM-4-9B-0414": 64,
        "glm-4-9b-chat-hf": 64,
    }
    assert (widths["stablelm-2-1_6b"], widths["stablelm-3b-4e1t"]) == (16, 20)
    from lm_accounting.views.account import describe_config

    assert "head_dim 128 (RoPE on the first 64)" in describe_config(config_from_hf(PUBLISHED["MiniMax-M2"]))


def test_our_partial_rotation_is_glms():
    """On CPU: GLM's rotary table and ``apply_rotary_pos_emb`` (interleaved pairs, as ours) against our
    attention's ``rotate_part``: equal on the first 10 of 20 dimensions, the other 10 untouched."""
    from transformers.models.glm.modeling_glm import GlmRotaryEmbedding, apply_rotary_pos_emb

    from lm_accounting.model.layers import RotaryPositionalEmbedding
    from lm_accounting.model.transformer import CausalSelfAttention

    values = {**ZOO["glm"], "rope_theta": 500.0}
    cfg = config_from_hf({"model_type": "glm", **values})
    S, h, kv, hd, r = 12, cfg.num_heads, cfg.kv_heads, cfg.d_head, cfg.rotary_dim
    assert (hd, r) == (20, 10)
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, h, S, hd, generator=gen), torch.randn(1, kv, S, hd, generator=gen)
    positions = torch.arange(S)
    cos, sin = GlmRotaryEmbedding(transformers.AutoConfig.for_model("glm", **values))(q, positions[None])
    want_q, want_k = apply_rotary_pos_emb(q, k, cos, sin)
    attn = CausalSelfAttention(cfg.d_model, h, kv, hd, rotary_dim=r)
    rope = RotaryPositionalEmbedding(cfg.rope_theta, r, S)
    got_q, got_k = attn.rotate_part(rope, q, positions), attn.rotate_part(rope, k, positions)
    torch.testing.assert_close(got_q, want_q)
    torch.testing.assert_close(got_k, want_k)
    assert torch.equal(got_q[..., r:], q[..., r:]) and not torch.allclose(got_q[..., 1:, :r], q[..., 1:, :r])


def test_rope_flops_count_the_rotated_part_only():
    """GLM-4.5-Air at 1,024 tokens: 3 FLOPs per rotated element, (96 + 8) heads × 64 dimensions, half the
    full-head RoPE; nothing else changes."""
    T = 1024
    cfg = config_from_hf(PUBLISHED["GLM-4.5-Air"]).with_context(T)
    nm = nonmatmul_flops(cfg, T)
    assert nm["layers.*.attn.rope"].per_layer == 3 * T * (96 + 8) * 64 == 20_447_232
    full = nonmatmul_flops(dataclasses.replace(cfg, rotary_dim=None), T)
    assert full["layers.*.attn.rope"].per_layer == 2 * nm["layers.*.attn.rope"].per_layer
    assert full.total - nm.total == 46 * 3 * T * 104 * 64
    assert "first 64 of 128" in cfg.architecture


@pytest.mark.parametrize("model_type", ["glm4_moe", "minimax_m2", "glm4", "glm", "stablelm"])
def test_transformers_tensors_are_those_of_its_real_model(model_type):
    """``memory --impl transformers`` sizes AdamW's step counters and for-loop temporaries from transformers'
    parameter tensors (``analytic.hf_tensors``): GLM's fused ``gate_up_proj``, GLM-4-0414's four norms, StableLM's
    LayerNorm biases, MiniMax-M2's router before its experts; equal to the real model's, untied and tied."""
    from test_transformers_truth import build_hf

    from lm_accounting.analytic.hf_tensors import hf_parameter_tensor_count, hf_parameter_tensor_sizes

    for tie in (False, True):
        values = {"model_type": model_type, **ZOO[model_type], "tie_word_embeddings": tie}
        cfg = config_from_hf(values)
        real = [p.numel() for p in build_hf(values).parameters()]
        assert hf_parameter_tensor_sizes(cfg) == real and hf_parameter_tensor_count(cfg) == len(real), tie


TINY = dict(vocab_size=97, context_length=64, num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, d_ff=48)


@pytest.mark.parametrize(
    "cfg",
    [
        ModelConfig(**TINY, rotary_dim=4, qk_norm=True, qkv_bias=True, name="glm-like"),
        ModelConfig(**TINY, head_dim=12, rotary_dim=6, num_experts=4, experts_per_token=2, name="moe-like"),
    ],
    ids=["glm-like", "moe-like"],
)
@pytest.mark.parametrize(("device", "seq"), [("meta", 64), ("cpu", 32)])
def test_live_model_crosscheck_is_exact(cfg, device, seq, monkeypatch):
    from lm_accounting.measure import devices
    from lm_accounting.measure.crosscheck import crosscheck

    monkeypatch.setattr(devices, "counting_run_bytes", lambda *args: 0)  # sized by the legacy replay: refused here
    assert crosscheck(cfg, seq, 2, device=device, backward=True).mismatches() == []


def test_every_replay_models_it_and_no_gpu_measured_it():
    """The legacy replay (single GPU, parallel layouts, inference) and the course program model partial rotary
    (tests/test_memory_setups.py, tests/test_ops_course.py, tests/test_infer_live.py and the layouts below prove
    them against the live model); no GPU ran it, so a cuda prediction names it; it is not the course
    architecture (whose convention rotates whole heads)."""
    from lm_accounting.analytic.memory_report import gpu_unmeasured
    from lm_accounting.analytic.ops import unsupported
    from lm_accounting.analytic.replay import replay_unsupported
    from lm_accounting.setup import TrainingSetup

    cfg = ModelConfig(**TINY, rotary_dim=4)
    assert cfg.unsupported_for_replay() == [] == replay_unsupported(cfg) == unsupported(cfg, TrainingSetup(), "course")
    assert gpu_unmeasured(cfg) == ["partial rotary"] and not cfg.course_architecture
    assert cfg.family == "GLM-style (partial rotary)"
    assert ModelConfig(**TINY, rotary_dim=8).course_architecture  # the whole head: the course model
    assert ModelConfig(**TINY, rotary_dim=8) != ModelConfig(**TINY)  # ... though not the same config as None


LAYOUT_CFG = ModelConfig(
    vocab_size=101, context_length=16, num_layers=4, d_model=24, num_heads=4, num_kv_heads=2, d_ff=40, rotary_dim=4
)  # tests/test_parallel_measured.py's TINY (with 4 layers for pp 4), RoPE on 4 of 6


@pytest.mark.slow
@pytest.mark.parametrize(
    "lay",
    [
        ParallelLayout(dp=4, zero=0),
        ParallelLayout(dp=4, zero=3),
        ParallelLayout(tp=2, sequence_parallel=True),
        ParallelLayout(dp=2, zero=2, tp=2, vocab_parallel=True),
    ],
    ids=["ddp", "zero3", "tp+sp", "fsdp×tp+vp"],
)
def test_a_parallel_rank_is_exact(lay):
    """On the fake process group (tracker, traced): the rank's step equals the legacy replay's."""
    from lm_accounting.analytic.parallel import rank_step
    from lm_accounting.measure.distributed import measure_rank

    cfg = dataclasses.replace(LAYOUT_CFG, qk_norm=True)
    for setup in (TrainingSetup(), TrainingSetup(attention="sdpa", checkpoint="full", precision="amp-bf16")):
        assert measure_rank(cfg, 16, 1, setup, lay).step == rank_step(cfg, 16, 1, setup, lay, mode="traced")[0]


@pytest.mark.slow
@pytest.mark.parametrize(("pp", "micro", "stage"), [(2, 4, 1), (4, 4, 2)])
def test_a_pipeline_stage_is_exact(pp, micro, stage):
    from lm_accounting.analytic.pipeline import stage_step
    from lm_accounting.measure.pipeline import measure_stage

    cfg = dataclasses.replace(LAYOUT_CFG, qkv_bias=True)
    lay = ParallelLayout(pp=pp, micro_batches=micro)
    for setup in (TrainingSetup(), TrainingSetup(precision="amp-bf16", checkpoint="selective")):
        assert (
            measure_stage(cfg, 16, 1, setup, lay, stage=stage)
            == stage_step(cfg, 16, 1, setup, lay, stage, mode="traced")[0]
        )


# -- bad input: one line, exit 2 ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(rotary_dim=5), "rotary_dim=5 is odd; RoPE rotates pairs of dimensions"),
        (dict(rotary_dim=10), "rotary_dim=10 exceeds head_dim=8"),
        (dict(rotary_dim=0), "rotary_dim must be positive"),
        (dict(rotary_dim=4, positions="learned"), "rotary_dim applies only with positions = rope"),
    ],
)
def test_bad_rotary_dim_is_one_line_exit_2(change, message, run_cli, tmp_path):
    with pytest.raises(ConfigError, match=message):
        ModelConfig(**TINY, **change)
    lines = [f"{k} = {json.dumps(v)}" for k, v in {**TINY, **change}.items()]
    path = tmp_path / "model.toml"
    path.write_text("\n".join(lines) + "\n")
    r = run_cli("account", path)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and message in r.err, r.err


def test_rotary_dim_with_latent_attention_is_refused():
    with pytest.raises(ConfigError, match="rotary_dim applies only with positions = rope, without latent attention"):
        mla = dict(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)
        ModelConfig(**without(TINY, "num_kv_heads"), **mla, rotary_dim=4)


@pytest.mark.parametrize(
    ("model_type", "change", "message"),
    [
        ("glm4_moe", {"partial_rotary_factor": 0}, "field 'partial_rotary_factor' must be a number in (0, 1]"),
        ("glm4_moe", {"partial_rotary_factor": 1.5}, "field 'partial_rotary_factor' must be a number in (0, 1]"),
        ("glm", {"partial_rotary_factor": -0.5}, "field 'partial_rotary_factor' must be a number in (0, 1]"),
        ("glm", {"partial_rotary_factor": "half"}, "field 'partial_rotary_factor' must be a number in (0, 1]"),
        (
            "glm4",
            {"rope_parameters": {"rope_type": "default", "partial_rotary_factor": True}},
            "field 'rope_parameters.partial_rotary_factor' must be a number in (0, 1]",
        ),
        ("minimax_m2", {"rotary_dim": 0}, "field 'rotary_dim' must be between 1 and 10^18"),
        ("stablelm", {"partial_rotary_factor": 0.33}, "int(16 · 0.33) = 5 dimensions of a head"),
        ("stablelm", {"qk_layernorm": True}, "field 'qk_layernorm' = True is not supported"),
        ("llama", {"partial_rotary_factor": 0.5}, "RoPE on every dimension only"),
    ],
)
def test_bad_partial_rotary_fields_are_one_line_exit_2(model_type, change, message, run_cli, tmp_path):
    values = {**ZOO.get(model_type, ZOO["glm"]), **change}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": model_type, **values}))
    r = run_cli("account", path)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and message in r.err, r.err


def test_cached_decode_reproduces_the_full_forward():
    """Inference (``model.kv_cache``): K is cached after its partial rotation, so decoding token by token gives
    the full forward's logits."""
    from lm_accounting.model import build_model
    from lm_accounting.model.kv_cache import StaticKVCache, decode, prefill

    cfg = ModelConfig(**TINY, rotary_dim=4, qk_norm=True)
    torch.manual_seed(0)
    model = build_model(cfg, "cpu")
    ids = torch.randint(0, cfg.vocab_size, (2, 14))
    with torch.no_grad():
        full = model(ids)
        cache = StaticKVCache(cfg, 2, 14, "cpu", torch.float32)
        steps = [prefill(model, ids[:, :8], cache)] + [decode(model, ids[:, t : t + 1], cache) for t in range(8, 14)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)
