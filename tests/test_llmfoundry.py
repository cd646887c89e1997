"""llm-foundry's MPT program (``ops.llmfoundry``) and the Triton kernel's price (``step_time`` rule 2b), by hand.

A tiny MPT (2 blocks, d 256, 2 heads of 128, vocabulary 512, S 256) at micro-batch 2 in bf16: its recorded work is
checked against counts written out from llm-foundry 061f2c7's modules (module docstring of ``ops.llmfoundry``)."""

import dataclasses

import pytest

from lm_accounting.analytic.ops import predict_step, unsupported
from lm_accounting.analytic.ops.engine import Affine
from lm_accounting.analytic.ops.tensors import recording_work
from lm_accounting.analytic.step_time import attention_seconds, load
from lm_accounting.config import load_config
from lm_accounting.setup import TrainingSetup

L, D, H, V, S, BATCH = 2, 256, 2, 512, 256, 2
T = BATCH * S  # tokens of the micro-batch


def tiny():
    sizes = dict(vocab_size=V, d_model=D, num_heads=H, num_layers=L, d_ff=4 * D, context_length=S)
    return dataclasses.replace(load_config("openai-gpt2"), max_position_embeddings=S, **sizes)


def at(x) -> int:
    return x.at(BATCH) if isinstance(x, Affine) else x


@pytest.fixture(scope="module")
def phases():
    """The recorded work per phase (parameters, forward, backward), sizes at micro-batch 2."""
    work: list = []
    with recording_work(work):
        setup = TrainingSetup(attention="sdpa", checkpoint="none", precision="bf16")
        predict_step(tiny(), S, setup, impl="llm-foundry", batch=2, mode="plain", device="cuda", optimizer_step=False)
    out, current = [], []
    for kind, times, *f in work:
        if kind == "phase":
            out.append(current)
            current = []
        else:
            current.append((kind, times, *f))
    return [*out, current]


def gemm_flops(phase) -> int:
    total = 0
    for kind, times, *f in phase:
        if kind == "gemm":  # (dtype, layout, batch, m, n, k, ...)
            batch, m, n, k = (at(x) for x in f[2:6])
            total += times * 2 * batch * m * n * k
    return total


def test_gemms_are_the_four_linears_and_the_tied_head(phases):
    """Per block Wqkv (d -> 3d), out_proj (d -> d), up_proj (d -> 4d), down_proj (4d -> d): 2·T·d²·(3+1+4+4);
    the head 2·T·d·V; the backward twice that (the input's and the weight's gradients)."""
    forward = L * 2 * T * D * D * (3 + 1 + 4 + 4) + 2 * T * D * V
    assert forward == 1_744_830_464
    assert gemm_flops(phases[1]) == forward
    assert gemm_flops(phases[2]) == 2 * forward


def test_triton_attention_once_a_block_each_way(phases):
    for phase, what in ((phases[1], "forward"), (phases[2], "backward")):
        calls = [(times, *(at(x) for x in f)) for kind, times, *f in phase if kind == "attention"]
        assert calls == [(1, "triton", what, BATCH, H, S, D // H, "bf16")] * L


def allocs(phase, label):
    return [(times, at(f[1]), f[2]) for kind, times, *f in phase if kind == "alloc" and f[0] == label]


def test_low_precision_layernorm_fused_loss_and_train_metrics(phases):
    """LPLayerNorm: norm_1, norm_2 per block and norm_f, each a bf16 output of T·d (no fp32 copy of the input);
    the fused cross-entropy: fp32 losses and log-sum-exps of T, a read of the bf16 logits (T·V·2 bytes), one bf16
    gradient of T·V; Composer's two train metrics: an fp32 copy of the logits and its log-softmax each (T·V·4
    bytes), the only fp32 tensors of the logits' size."""
    outputs = [a for a in allocs(phases[1], "native_layer_norm") if a[1] == T * D * 2]
    assert outputs == [(1, T * D * 2, "bf16")] * (2 * L + 1)
    assert allocs(phases[1], "xentropy") == [(1, T * 4, "fp32")] * 2
    assert ("reads", 1, T * V * 2, V) in [(k, t, at(f[0]), f[1]) for k, t, *f in phases[1] if k == "reads"]
    assert allocs(phases[2], "xentropy_backward") == [(1, T * V * 2, "bf16")]
    big = [[(a[0], at(a[1])) for kind, _, *a in phase if kind == "alloc" and a[2] == "fp32" and at(a[1]) >= T * V * 4]
           for phase in phases]  # fmt: skip
    assert big[1] == [("_to_copy", T * V * 4), ("_log_softmax", T * V * 4)] * 2
    assert big[0] == big[2] == []


def test_triton_priced_at_its_published_bound():
    """Rule 2b: 1.7x the measured torch flash kernel (Dao 2023 §4.1: FlashAttention-2 1.7-3.0x faster than
    FlashAttention; flash_attn_triton.py: the Triton kernel slightly slower than FlashAttention's CUDA)."""
    cal = load("h100-80gb")
    for what in ("forward", "backward"):
        for s in (512, 8192, 65536):
            flash = attention_seconds(cal, "flash", what, 1, 32, s, 128, "bf16")
            assert attention_seconds(cal, "triton", what, 1, 32, s, 128, "bf16") == pytest.approx(1.7 * flash)


def test_only_what_the_benchmark_ran():
    cfg = tiny()
    assert unsupported(cfg, TrainingSetup(attention="sdpa", precision="bf16"), "llm-foundry") == []
    assert unsupported(cfg, TrainingSetup(attention="sdpa", precision="fp32"), "llm-foundry")
    assert unsupported(dataclasses.replace(cfg, num_kv_heads=1), TrainingSetup(precision="bf16"), "llm-foundry")
    with pytest.raises(ValueError, match="cuda only"):
        predict_step(cfg, S, TrainingSetup(attention="sdpa", precision="bf16"), impl="llm-foundry", device="meta")
