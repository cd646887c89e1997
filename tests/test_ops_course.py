"""The op library's programs of our own model (``--impl course``, ``analytic/ops/course``) against the live model.

* Every architecture our live model builds (the course/Llama block with GQA, qk-norm, q/k/v biases and tied
  embeddings; GPT-2; Gemma 2/3; OLMo-2; Phi-3's sliding window; DeepSeek's latent attention) is predicted
  phase by phase, byte for byte, equal to the storage tracker's measurement of the live model on meta (the
  traced run), at B = 1 and 2 and two sequence lengths, over precision × attention × checkpointing; and so is the
  mixture of experts (Mixtral-like, and DeepSeek-V3-like with latent attention, shared experts and a dense layer).
* The plain run on CPU (no dispatch mode: in-place gradient sums, wrapped Python numbers, kernel scratch, the
  mixed-dtype copies of amp-bf16) equals the CPU allocator's own events (``measure_step(method="allocator")``).
* For the Llama-like block the program equals the legacy replay (``analytic.replay.predict_training_step``),
  traced and plain, on meta and cpu: the first proof that the op library can replace the single-rank path.
* ``unsupported`` says no only for what the live model refuses (the fused kernel with windows or latent attention).

The measured side is the live model (``lm_accounting.model``) run by torch; the predicted side imports no torch.
"""

import dataclasses
import subprocess
import sys

import pytest

from lm_accounting.analytic.ops import course, predict_step, unsupported
from lm_accounting.analytic.ops.tensors import alike_runs
from lm_accounting.analytic.replay import predict_training_step
from lm_accounting.config import ModelConfig
from lm_accounting.measure.memory import measure_step
from lm_accounting.setup import TrainingSetup

BASE = dict(
    vocab_size=31, context_length=16, num_layers=3, d_model=18, num_heads=6, num_kv_heads=2, head_dim=10, d_ff=22
)  # every tensor size distinct, so a wrong term cannot hide
ARCHS = {
    "llama": {},
    "qwen3": {"qk_norm": True, "tie_embeddings": True},
    "qwen2": {"qkv_bias": True},
    "gpt2": dict(
        norm="layernorm",
        qkv_bias=True,
        output_bias=True,
        mlp_bias=True,
        mlp="gelu",
        positions="learned",
        max_position_embeddings=20,
        tie_embeddings=True,
        num_kv_heads=None,
    ),
    "gemma2": dict(
        norm_placement="sandwich",
        mlp="geglu",
        sliding_window=4,
        full_attention_every=2,
        scale_embeddings=True,
        tie_embeddings=True,
    ),
    "gemma3": dict(
        norm_placement="sandwich",
        mlp="geglu",
        sliding_window=5,
        full_attention_every=3,
        scale_embeddings=True,
        qk_norm=True,
        tie_embeddings=True,
        num_kv_heads=1,
    ),
    "olmo2": dict(norm_placement="post", qk_norm=True, qk_norm_scope="projection"),
    "phi3": dict(sliding_window=5),
    "deepseek_v2": dict(
        kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=12, num_kv_heads=None, head_dim=None
    ),
    "deepseek_v3": dict(
        kv_lora_rank=14,
        q_lora_rank=12,
        qk_nope_head_dim=6,
        qk_rope_head_dim=4,
        v_head_dim=8,
        num_kv_heads=None,
        head_dim=None,
        num_experts=4,
        experts_per_token=3,
        expert_d_ff=6,
        shared_experts=1,
        shared_expert_d_ff=5,
        dense_layers_first=1,
    ),
    "mixtral": dict(num_experts=4, experts_per_token=2, expert_d_ff=8),
    "partial_rotary": dict(rotary_dim=4, qk_norm=True),  # RoPE on the first 4 of 10, the rest passed through
    "glm": dict(rotary_dim=6, qkv_bias=True),  # GLM-4's attention: Q/K/V biases (fp32 q, k under amp), RoPE on 6 of 10
    "glm4_moe": dict(  # GLM-4.5's block: Q/K/V biases, qk-norm, half-head RoPE, a dense first layer, shared experts
        rotary_dim=6,
        qkv_bias=True,
        qk_norm=True,
        num_experts=4,
        experts_per_token=2,
        expert_d_ff=6,
        shared_experts=1,
        dense_layers_first=1,
    ),
    "minimax_m2": dict(  # MiniMax-M2's: whole-projection qk-norm, RoPE on 4 of 10, experts in every layer
        rotary_dim=4, qk_norm=True, qk_norm_scope="projection", num_experts=4, experts_per_token=2, expert_d_ff=8
    ),
}
NAIVE_ONLY = {"gemma2", "gemma3", "phi3", "deepseek_v2", "deepseek_v3"}  # the live model refuses sdpa for them
SEQS = (8, 7)  # the routed split: lines in B at S = 8 (4 experts divide S·k), at S = 7 replayed at each B


LEGACY = ("llama", "qwen3", "qwen2", "partial_rotary", "glm")  # the architectures the legacy replay models


def config(arch: str) -> ModelConfig:
    return ModelConfig(**{**BASE, **ARCHS[arch]}, name=arch)


def setups(arch: str, checkpoints=("none", "full", "selective", "op")):
    for attention in ("naive",) if arch in NAIVE_ONLY else ("naive", "sdpa"):
        for checkpoint in checkpoints:
            for precision in ("fp32", "bf16", "amp-bf16"):
                yield TrainingSetup(attention=attention, checkpoint=checkpoint, precision=precision)


def sample(arch: str):
    """Three setups per architecture for the default run: every checkpointing, precision and attention once."""
    fused = "naive" if arch in NAIVE_ONLY else "sdpa"
    yield TrainingSetup(attention="naive", checkpoint="none", precision="fp32")
    yield TrainingSetup(attention=fused, checkpoint="full", precision="amp-bf16")
    yield TrainingSetup(attention=fused, checkpoint="selective", precision="bf16")
    yield TrainingSetup(attention="naive", checkpoint="op", precision="amp-bf16")  # torchtitan's policy: bmm rerun


def assert_same(measured, predicted, what):
    assert measured.baseline == predicted.baseline, what
    for name in ("forward", "backward", "optimizer_step"):
        got, want = predicted.phase(name), measured.phase(name)
        assert (got.peak, got.end) == (want.peak, want.end), f"{what}: {name}"


def check(arch: str, setup: TrainingSetup, seqs=SEQS):
    cfg = config(arch)
    assert unsupported(cfg, setup, "course") == []
    for seq in seqs:
        for batch in (1, 2):
            what = f"{arch} {setup.label} S={seq} B={batch}"
            predicted = predict_step(cfg, seq, setup, impl="course", batch=batch).at(batch)
            assert_same(measure_step(cfg, seq, batch, setup=setup), predicted, what)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_every_architecture_equals_the_live_model(arch):
    """The default run: each architecture under three setups (every checkpointing, precision and attention)."""
    for setup in sample(arch):
        check(arch, setup, seqs=SEQS[:1])


@pytest.mark.grid
@pytest.mark.parametrize("checkpoint", ["none", "full", "selective", "op"])
@pytest.mark.parametrize("arch", ARCHS)
def test_grid_equals_the_live_model(arch, checkpoint):
    """Every precision and attention the live model runs, two sequence lengths, B = 1 and 2."""
    for setup in setups(arch, (checkpoint,)):
        check(arch, setup)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["gpt2", "phi3", "deepseek_v3"])
def test_alike_layers_are_replayed_once(arch):
    """Six layers, the middle ones replayed once for all (``tensors.repeated``): still equal to the live model;
    the work is three runs of layers (one for DeepSeek-V3-like's dense first layer, its MoE ones, the last)
    however deep the model."""
    cfg = dataclasses.replace(config(arch), num_layers=6)
    assert len(alike_runs(dataclasses.replace(cfg, num_layers=60))) == 3
    for setup in (TrainingSetup(), TrainingSetup(checkpoint="full", precision="amp-bf16")):
        for batch in (1, 2):
            predicted = predict_step(cfg, 8, setup, impl="course", batch=batch).at(batch)
            assert_same(measure_step(cfg, 8, batch, setup=setup), predicted, f"{arch} {setup.label} B={batch}")


def check_plain_cpu(arch: str, setup: TrainingSetup, seq: int = 8):
    import torch

    cfg, threads = config(arch), torch.get_num_threads()
    for batch in (1, 2):
        what = f"{arch} {setup.label} S={seq} B={batch} plain cpu"
        predicted = predict_step(
            cfg, seq, setup, impl="course", batch=batch, mode="plain", device="cpu", cpu_threads=threads
        ).at(batch)
        assert_same(measure_step(cfg, seq, batch, setup=setup, device="cpu", method="allocator"), predicted, what)


@pytest.mark.slow
def test_the_plain_cpu_run_equals_the_allocator():
    """GPT-2 (tied: the LM head's transposed gradient summed out of place; biases: fp32 + bf16 sums under amp)
    under three setups; every architecture in the grid."""
    for setup in sample("gpt2"):
        check_plain_cpu("gpt2", setup)


@pytest.mark.grid
@pytest.mark.parametrize("precision", ["fp32", "bf16", "amp-bf16"])
@pytest.mark.parametrize("checkpoint", ["none", "full", "selective", "op"])
@pytest.mark.parametrize("arch", ARCHS)
def test_grid_plain_cpu_run_equals_the_allocator(arch, checkpoint, precision):
    for setup in setups(arch, (checkpoint,)):
        if setup.precision == precision:
            check_plain_cpu(arch, setup)


def legacy_cases(arch: str, seq: int, batches, runs):
    cfg = config(arch)
    for setup in setups(arch, ("none", "full", "selective")):  # the legacy replay's (not torchtitan's ``op``)
        for mode, device in runs:
            for batch in batches:
                got = course.predict_step(cfg, seq, setup, batch=batch, mode=mode, device=device, cpu_threads=2)
                want = predict_training_step(cfg, seq, batch, setup=setup, mode=mode, device=device, cpu_threads=2)
                assert got.at(batch) == want, f"{arch} {setup.label} S={seq} {mode} {device} B={batch}"


@pytest.mark.slow
@pytest.mark.parametrize("arch", LEGACY)
def test_llama_block_equals_the_legacy_replay(arch):
    """The course program gives the legacy replay's step for every setup, traced (the tracker's run) and plain
    (in-place gradient sums), at B = 1 and 3 (the legacy replay is checked against the tracker and the CPU
    allocator by tests/test_memory_exact.py and tests/test_plain_run.py)."""
    legacy_cases(arch, 9, (1, 3), (("traced", "meta"), ("plain", "meta")))


@pytest.mark.grid
@pytest.mark.parametrize("run", [("traced", "meta"), ("plain", "meta"), ("plain", "cpu")], ids="-".join)
@pytest.mark.parametrize("seq", [8, 12])
@pytest.mark.parametrize("arch", LEGACY)
def test_grid_llama_block_equals_the_legacy_replay(arch, seq, run):
    """Also the plain CPU run (wrapped numbers, two threads' flash scratch)."""
    legacy_cases(arch, seq, (1, 2, 3), (run,))


def test_the_legacy_replay_misses_a_view_at_batch_one():
    """Qwen2's fp32 q/k/v under amp-bf16 with full checkpointing at B = 1: the live model's forward peaks 56 bytes
    below what the legacy replay says (its lines in B cannot hold a reshape that is a view at B = 1 only); the
    program, replayed at B = 1 exactly, equals the measurement."""
    cfg, setup = config("qwen2"), TrainingSetup(attention="naive", checkpoint="full", precision="amp-bf16")
    measured = measure_step(cfg, 7, 1, setup=setup)
    assert_same(measured, predict_step(cfg, 7, setup, impl="course", batch=1).at(1), "qwen2 B=1")
    legacy = predict_training_step(cfg, 7, 1, setup=setup, mode="traced")
    assert legacy.forward.peak == measured.forward.peak + 56


def test_op_checkpointing_keeps_every_second_mm_by_hand():
    """torchtitan's per-op policy against ours, measured on the live model (meta, bf16, sdpa, B 2, S 8: T = 16
    tokens, L = 3 blocks): a block's mms run q, k, v, output, w1, w3, w2, and ``op`` recomputes the 2nd, 4th and
    6th, so the forward ends holding per block k (T·kv·hd = 16·2·10), output (T·d = 16·18) and w3 (T·d_ff = 16·22)
    fewer bf16 outputs than ``selective``: 3 · 16 · (20 + 18 + 22) · 2 = 5,760 bytes; full keeps none of the
    seven.  The program predicts each step."""
    cfg, ends = config("llama"), {}
    for checkpoint in ("selective", "op", "full"):
        setup = TrainingSetup(attention="sdpa", checkpoint=checkpoint, precision="bf16")
        measured = measure_step(cfg, 8, 2, setup=setup)
        assert_same(measured, predict_step(cfg, 8, setup, impl="course", batch=2).at(2), checkpoint)
        ends[checkpoint] = measured.phase("forward").end
    assert ends["selective"] - ends["op"] == 3 * 16 * (20 + 18 + 22) * 2 == 5_760
    # op's cache per block: the q, v, w1, w2 outputs (T·(60 + 20 + 22 + 18) bf16), the fused kernel's output
    # (B·h·S·hd = 16·60 bf16) and logsumexp (B·h·S = 2·6·8 fp32)
    assert ends["op"] - ends["full"] == 3 * (16 * (60 + 20 + 22 + 18) * 2 + 16 * 60 * 2 + 2 * 6 * 8 * 4) == 18_432


def test_memory_takes_op_checkpointing_from_the_course_program():
    """``memory --checkpoint op`` on one GPU: the legacy replay lacks torchtitan's policy (``replay_unsupported``
    names it), so the account's traced step is the course program's, which equals the live model's."""
    from lm_accounting.analytic.program_report import predicted_steps, replayed
    from lm_accounting.analytic.replay import replay_unsupported

    cfg, setup = config("llama"), TrainingSetup(attention="naive", checkpoint="op", precision="fp32")
    assert not replayed(cfg, setup, "course") and any("per-op" in r for r in replay_unsupported(cfg, setup))
    _plain, traced = predicted_steps(cfg, 8, 2, impl="course", setup=setup, device="meta")
    assert_same(measure_step(cfg, 8, 2, setup=setup), traced, "memory --checkpoint op")


def test_what_the_course_program_does_not_model():
    for arch in ("phi3", "deepseek_v2"):  # the live model refuses the fused kernel for them
        assert unsupported(config(arch), TrainingSetup(attention="sdpa"), "course")
        assert unsupported(config(arch), TrainingSetup(), "course") == []


@pytest.mark.slow
def test_the_course_program_imports_no_torch():
    code = (
        "import sys; from lm_accounting.analytic.ops import predict_step; from lm_accounting.config import load_config;"
        "from lm_accounting.setup import TrainingSetup;"
        "predict_step(load_config('openai-gpt2'), 64, TrainingSetup(checkpoint='selective'), impl='course', batch=2);"
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
