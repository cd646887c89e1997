"""Adding an op variant is one op type plus its place in a program: torch's own ``nn.RMSNorm`` (torchtitan's
norm) in place of transformers' ``LlamaRMSNorm``.

The measured side is transformers' own Llama (qwen3 for the per-head q/k norms) with every ``*RMSNorm`` module
replaced by ``torch.nn.RMSNorm`` holding the same ``Parameter`` (so the optimizer is unchanged); the predicted
side is ``LlamaForCausalLM(..., norm=TorchRMSNorm)``.  Both the traced run on meta and the plain CPU run (the
allocator) are compared, phase by phase, byte for byte; the two norms are also shown to differ, so the variant
is not a relabelled original."""

import dataclasses

import pytest

from lm_accounting.analytic.ops.step import training_step
from lm_accounting.analytic.ops.transformers.llama import B, LlamaForCausalLM, RMSNorm, TorchRMSNorm
from lm_accounting.config import load_config
from lm_accounting.setup import TrainingSetup

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from lm_accounting.measure import hf
from lm_accounting.measure.allocator import measure_training_step_plain
from lm_accounting.measure.tracker import init_optimizer_state, measure_training_step


def tiny(preset: str):
    fields = dict(vocab_size=96, d_model=16, num_heads=4, num_kv_heads=2, d_ff=24, num_layers=3, context_length=64)
    return dataclasses.replace(load_config(preset), head_dim=None, **fields)


def measured(cfg, seq, batch, setup, device, method="tracker"):
    """transformers' model with torch's RMSNorm modules, one training step measured as ``measure.hf`` does."""
    with hf.patched_for(device):
        model, inputs, labels, opt, loss_fn = hf.build_hf_step(cfg, seq, batch, setup, device)
        for parent in list(model.hf.modules()):
            for name, child in list(parent.named_children()):
                if type(child).__name__.endswith("RMSNorm"):
                    new = torch.nn.RMSNorm(child.weight.shape[0], eps=1e-6, device="meta")
                    new.weight = child.weight  # the same Parameter: the optimizer's list is unchanged
                    setattr(parent, name, new)
        if method == "allocator":
            init_optimizer_state(opt)
            return measure_training_step_plain(model, inputs, labels, loss_fn, opt)
        return measure_training_step(model, inputs, labels, loss_fn, optimizer=opt)


def predicted(cfg, seq, batch, setup, device="meta", mode="traced", norm=TorchRMSNorm):
    b = 1 if batch == 1 else B
    step = training_step(
        lambda: LlamaForCausalLM(cfg, seq, setup, b, norm=norm),
        optimizer=setup.optimizer,
        device=device,
        traced=mode == "traced",
    )
    return step.at(batch)


@pytest.mark.parametrize("preset", ["llama-3-8b", "qwen3-8b"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("checkpoint", ["none", "full"])
def test_torch_rms_norm_equals_the_swapped_model_on_meta(preset, precision, checkpoint):
    cfg, setup = tiny(preset), TrainingSetup(attention="sdpa", precision=precision, checkpoint=checkpoint)
    for batch in (1, 2):
        assert predicted(cfg, 8, batch, setup) == measured(cfg, 8, batch, setup, "meta"), batch


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_torch_rms_norm_plain_cpu_run_equals_the_allocator(precision):
    cfg, setup = tiny("llama-3-8b"), TrainingSetup(attention="naive", precision=precision)
    got = predicted(cfg, 8, 2, setup, device="cpu", mode="plain")
    assert got == measured(cfg, 8, 2, setup, "cpu", method="allocator")


def test_the_variant_differs_from_llamas_norm():
    """bf16: LlamaRMSNorm multiplies by the weight in bf16 after the cast; torch's multiplies in fp32 first, so
    each norm's forward holds an fp32 product of the input's size where Llama's holds a bf16 one."""
    cfg, setup = tiny("llama-3-8b"), TrainingSetup(attention="sdpa", precision="bf16")
    torch_norm = predicted(cfg, 8, 2, setup)
    llama_norm = predicted(cfg, 8, 2, setup, norm=RMSNorm)
    assert torch_norm.forward.peak != llama_norm.forward.peak
