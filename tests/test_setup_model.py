"""Training setups (lm_accounting.setup) in the live model: every combination runs a full training
step on meta and cpu, and on cpu matches the course model's numbers with the same weights."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lm_accounting.config import AccountingError, ModelConfig
from lm_accounting.measure.step import build_step, training_step
from lm_accounting.model import build_model, cross_entropy, random_tokens
from lm_accounting.model.autocast import CudaAutocast
from lm_accounting.names import ADAMW_IMPLS
from lm_accounting.setup import (
    ATTENTIONS,
    CHECKPOINTS,
    OPTIMIZERS,
    PRECISIONS,
    TrainingSetup,
    every_setup,
)

TINY = ModelConfig(vocab_size=97, context_length=16, num_layers=2, d_model=32, num_heads=4, d_ff=64, name="tiny")
# GQA (6 query heads over 2 KV heads), head_dim 8 != d_model/h, qk-norm, tied embeddings
TINY_GQA = dataclasses.replace(
    TINY, num_heads=6, num_kv_heads=2, head_dim=8, qk_norm=True, tie_embeddings=True, name="tiny-gqa"
)
B, S = 2, 16
SETUPS = list(every_setup())


# -- the description ----------------------------------------------------------------
def test_defaults_and_choices():
    s = TrainingSetup()
    assert (s.attention, s.checkpoint, s.precision, s.optimizer) == ("naive", "none", "fp32", "foreach")
    assert ATTENTIONS == ("naive", "sdpa") and CHECKPOINTS == ("none", "full", "selective", "op")
    assert PRECISIONS == ("fp32", "bf16", "amp-bf16") and OPTIMIZERS is ADAMW_IMPLS
    assert len(SETUPS) == 24 and len({x.label for x in SETUPS}) == 24
    assert TrainingSetup(precision="bf16").param_dtype == "bf16"
    assert TrainingSetup(precision="amp-bf16").param_dtype == "fp32"


@pytest.mark.parametrize(
    "field, value", [("attention", "flash"), ("checkpoint", "some"), ("precision", "fp16"), ("optimizer", "adam")]
)
def test_bad_choice_is_a_one_line_error(field, value):
    with pytest.raises(AccountingError) as err:
        TrainingSetup(**{field: value})
    assert len(str(err.value).splitlines()) == 1 and value in str(err.value)


def test_frozen_and_keyword_only():
    with pytest.raises(TypeError):
        TrainingSetup("sdpa")
    with pytest.raises(dataclasses.FrozenInstanceError):
        TrainingSetup().attention = "sdpa"


def test_setup_module_imports_no_torch():
    code = "import sys, lm_accounting.setup, lm_accounting.analytic.hardware_flops; print('torch' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )


def test_dtype_must_agree_with_precision():
    assert build_model(TINY, setup=TrainingSetup(precision="bf16")).lm_head.weight.dtype == torch.bfloat16
    assert build_model(TINY, setup=TrainingSetup(precision="amp-bf16")).lm_head.weight.dtype == torch.float32
    with pytest.raises(AccountingError):
        build_model(TINY, dtype=torch.float32, setup=TrainingSetup(precision="bf16"))


def test_module_tree():
    """The default keeps the course's ``attn.qk``/``attn.av``; sdpa has one ``attn.sdpa`` instead."""
    naive = {n for n, _ in build_model(TINY).named_modules()}
    assert naive == {n for n, _ in build_model(TINY, setup=TrainingSetup()).named_modules()}
    assert "layers.0.attn.qk" in naive and "layers.0.attn.sdpa" not in naive
    sdpa = {n for n, _ in build_model(TINY, setup=TrainingSetup(attention="sdpa")).named_modules()}
    assert sdpa == (naive - {f"layers.{i}.attn.{m}" for i in (0, 1) for m in ("qk", "av")}) | {
        "layers.0.attn.sdpa",
        "layers.1.attn.sdpa",
    }


# -- one full training step everywhere ----------------------------------------------------
@pytest.mark.grid
@pytest.mark.parametrize("setup", SETUPS, ids=lambda s: s.label)
@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_every_setup_trains_one_step(setup, device):
    for cfg in (TINY, TINY_GQA):
        model, inputs, targets, opt = build_step(cfg, S, B, setup, device)
        for _ in range(2):  # the second step has AdamW state
            loss = training_step(model, inputs, targets, opt)
        assert loss.shape == () and loss.dtype == (torch.bfloat16 if setup.precision == "bf16" else torch.float32)
        if device == "cpu":
            assert torch.isfinite(loss)
            assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("optimizer", ["for-loop", "fused"])
def test_other_optimizers_on_cpu(optimizer):
    setup = TrainingSetup(attention="sdpa", checkpoint="selective", precision="amp-bf16", optimizer=optimizer)
    model, inputs, targets, opt = build_step(TINY_GQA, S, B, setup, "cpu")
    assert torch.isfinite(training_step(model, inputs, targets, opt))


# -- numbers on cpu, same weights ------------------------------------------------------------
def loss_and_grads(cfg: ModelConfig, setup: TrainingSetup, state: dict):
    model = build_model(cfg, device="cpu", setup=setup)
    model.load_state_dict(state)
    inputs, targets = random_tokens(cfg, B, S, "cpu", seed=0), random_tokens(cfg, B, S, "cpu", seed=1)
    loss = cross_entropy(model(inputs), targets)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


SDPA_VS_NAIVE = {"fp32": 1e-5, "bf16": 5e-2, "amp-bf16": 2e-2}
"""Relative error allowed between fused and naive attention: rounding only (bf16: 8-bit mantissa)."""


@pytest.mark.slow
@pytest.mark.parametrize("cfg", [TINY, TINY_GQA], ids=lambda c: c.name)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_numbers_match_the_course_model(cfg, precision):
    """Checkpointing changes nothing (bit for bit); sdpa is close to naive; amp is close to fp32."""
    torch.manual_seed(0)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    state = build_model(cfg, device="cpu", dtype=dtype).state_dict()
    results = {
        (a, c): loss_and_grads(cfg, TrainingSetup(attention=a, checkpoint=c, precision=precision), state)
        for a in ATTENTIONS
        for c in CHECKPOINTS
    }
    for (a, c), (loss, grads) in results.items():  # the recompute runs the very same ops
        base_loss, base_grads = results[a, "none"]
        assert torch.equal(loss, base_loss) and all(torch.equal(grads[n], base_grads[n]) for n in grads), (a, c)
    (naive_loss, naive_grads), (sdpa_loss, sdpa_grads) = results["naive", "none"], results["sdpa", "none"]
    tol = SDPA_VS_NAIVE[precision]
    assert rel_err(sdpa_loss, naive_loss) <= tol
    assert max(rel_err(sdpa_grads[n], g) for n, g in naive_grads.items()) <= tol
    if precision == "amp-bf16":  # bf16 matmuls vs the fp32 model with the same weights
        fp32_loss, fp32_grads = loss_and_grads(cfg, TrainingSetup(), state)
        assert rel_err(naive_loss, fp32_loss) <= 1e-2
        assert all(naive_grads[n].dtype == torch.float32 for n in fp32_grads)  # fp32 grads of fp32 weights
        assert max(rel_err(naive_grads[n], g) for n, g in fp32_grads.items()) <= 5e-2


# -- what is saved ---------------------------------------------------------------------------
def saved_shapes(setup: TrainingSetup, cfg: ModelConfig = TINY_GQA):
    seen = []

    def pack(t):
        seen.append((tuple(t.shape), t.dtype))
        return t

    model = build_model(cfg, "meta", setup=setup)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(random_tokens(cfg, B, S, "meta"))
    return seen


def graph_nodes(root) -> list:
    seen, stack, nodes = set(), [root], []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        nodes.append(node)
        stack.extend(n for n, _ in node.next_functions)
    return nodes


@pytest.mark.parametrize("precision", PRECISIONS)
def test_sdpa_saves_no_square_and_a_fp32_logsumexp(precision):
    """Naive attention saves (B, h, S, S) tensors; the fused kernel saves q (B, h, S, d), k and v with
    their kv heads (B, kv, S, d), the output (B, h, S, d) and a fp32 logsumexp (B, h, S)."""
    h, kv, d = TINY_GQA.num_heads, TINY_GQA.kv_heads, TINY_GQA.d_head
    assert any(shape == (B, h, S, S) for shape, _ in saved_shapes(TrainingSetup(precision=precision)))
    setup = TrainingSetup(attention="sdpa", precision=precision)
    assert not any(shape[-2:] == (S, S) for shape, _ in saved_shapes(setup))
    model = build_model(TINY_GQA, "meta", setup=setup)
    logits = model(random_tokens(TINY_GQA, B, S, "meta"))
    flash = [
        n for n in graph_nodes(logits.grad_fn) if type(n).__name__ == "ScaledDotProductFlashAttentionForCpuBackward0"
    ]
    assert len(flash) == TINY_GQA.num_layers
    act = torch.float32 if precision == "fp32" else torch.bfloat16
    for node in flash:
        assert (node._saved_query.shape, node._saved_query.dtype) == ((B, h, S, d), act)
        assert node._saved_key.shape == node._saved_value.shape == (B, kv, S, d)
        assert (node._saved_output.shape, node._saved_output.dtype) == ((B, h, S, d), act)
        assert (node._saved_logsumexp.shape, node._saved_logsumexp.dtype) == ((B, h, S), torch.float32)
        assert node._saved_is_causal is True


# -- the autocast emulation ------------------------------------------------------------------
class OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else (out,)
        self.ops.append(
            (str(func), tuple((tuple(o.shape), o.dtype, o.stride()) for o in outs if isinstance(o, torch.Tensor)))
        )
        return out


def op_log(model, inputs, targets, context):
    model.zero_grad(set_to_none=True)
    log = OpLog()
    with log:
        with context:
            logits = model(inputs)
        cross_entropy(logits.float(), targets).backward()
    return log.ops


# torch 2.13 aten/src/ATen/autocast_mode.cpp, TORCH_LIBRARY_IMPL(aten, AutocastCPU): lower_precision_fp
CPU_LOWER = frozenset(
    {
        "conv1d",
        "conv2d",
        "conv3d",
        "bmm",
        "mm",
        "linalg_vecdot",
        "baddbmm",
        "addmm",
        "_addmm_activation",
        "addbmm",
        "linear",
        "_convolution",
        "matmul",
        "conv_tbc",
        "mkldnn_rnn_layer",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
        "prelu",
        "scaled_dot_product_attention",
        "_native_multi_head_attention",
    }
)


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_emulation_matches_torch_autocast_on_cpu(attention):
    """With the CPU op lists, the emulation dispatches the very ops (and dtypes, strides) of
    ``torch.autocast("cpu")``: the casting mechanism is torch's.  (Only the lists differ on cuda.)"""
    torch.manual_seed(0)
    model = build_model(TINY_GQA, "cpu", setup=TrainingSetup(attention=attention))
    inputs, targets = random_tokens(TINY_GQA, B, S, "cpu", 0), random_tokens(TINY_GQA, B, S, "cpu", 1)
    real = op_log(model, inputs, targets, torch.autocast("cpu", dtype=torch.bfloat16))
    fake = op_log(
        model,
        inputs,
        targets,
        CudaAutocast(
            torch.bfloat16, lower=CPU_LOWER, fp32=frozenset(), fp32_set_opt_dtype=frozenset(), promote=frozenset()
        ),
    )
    assert fake == real and any(op == "aten._to_copy.default" for op, _ in real)


def test_emulated_cuda_policy_upcasts_exp_and_keeps_the_residual_in_fp32():
    """CUDA's lists on the naive model: exp runs in fp32 (so softmax probabilities are fp32), the
    matmuls in bf16, and the residual stream stays fp32 (fp32 + bf16 promotes)."""
    torch.manual_seed(0)
    model = build_model(TINY, "meta", setup=TrainingSetup())
    inputs = random_tokens(TINY, B, S, "meta")
    log = OpLog()
    with log, CudaAutocast(torch.bfloat16):
        model(inputs)
    dtypes = {}
    for op, outs in log.ops:
        dtypes.setdefault(op, set()).update(o[1] for o in outs)
    assert dtypes["aten.mm.default"] == dtypes["aten.bmm.default"] == {torch.bfloat16}
    assert dtypes["aten.exp.default"] == {torch.float32}
    assert log.ops[-1][1][0][1] == torch.bfloat16  # logits straight out of the LM head matmul
    assert any(op == "aten.add.Tensor" and outs[0][:2] == ((B, S, TINY.d_model), torch.float32) for op, outs in log.ops)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("attention", ATTENTIONS)
def test_emulation_matches_torch_autocast_on_cuda(attention):
    """The amp-bf16 model on cuda (real torch.autocast) dispatches the ops, dtypes and strides that the
    emulation produces from the fp32 model: what meta and cpu measure is what a GPU run does."""
    torch.manual_seed(0)
    amp = build_model(TINY_GQA, "cuda", setup=TrainingSetup(attention=attention, precision="amp-bf16"))
    plain = build_model(TINY_GQA, "cuda", setup=TrainingSetup(attention=attention))
    plain.load_state_dict(amp.state_dict())
    inputs, targets = random_tokens(TINY_GQA, B, S, "cuda", 0), random_tokens(TINY_GQA, B, S, "cuda", 1)
    import contextlib

    real = op_log(amp, inputs, targets, contextlib.nullcontext())
    fake = op_log(plain, inputs, targets, CudaAutocast(torch.bfloat16))
    assert fake == real
