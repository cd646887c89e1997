"""Training time, AdamW FLOPs and the GPU table: expected numbers written out by hand."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lm_accounting.analytic.training import (
    ADAMW_FLOPS_ALTERNATIVES,
    GPUS,
    adamw_step_flops,
    gpu_peak_flops,
    step_flops,
    training_time,
)
from lm_accounting.config import AccountingError, load_config

XL_FORWARD_1024 = 4_513_336_524_800  # GPT-2 XL forward matmul FLOPs, one 1,024-token sequence
XL_PARAMS = 2_127_057_600


@pytest.fixture(scope="module")
def xl():
    return load_config("gpt2-xl")


def test_adamwaccounting_d_three_x_forward(xl):
    flops = step_flops(xl, 1024, 1024, "3x")
    assert flops == 3 * 4_513_336_524_800 * 1024
    t = training_time(flops, 400_000, gpu_peak_flops("a100", "fp32"), 0.5)
    expected_days = 3 * 4_513_336_524_800 * 1024 * 400_000 / (19.5e12 * 0.5) / 86400
    assert t.days == pytest.approx(expected_days, rel=1e-12)
    assert t.days == pytest.approx(6583.556, abs=1e-3)
    assert t.total_flops == 3 * 4_513_336_524_800 * 1024 * 400_000
    assert t.hours == pytest.approx(24 * expected_days, rel=1e-12)
    assert t.seconds == pytest.approx(86400 * expected_days, rel=1e-12)


def test_adamwaccounting_d_six_nd(xl):
    flops = step_flops(xl, 1024, 1024, "6nd")
    assert flops == 6 * 2_127_057_600 * 1024 * 1024
    t = training_time(flops, 400_000, 19_500_000_000_000, 0.5)
    expected_days = 6 * 2_127_057_600 * 1024 * 1024 * 400_000 / (19.5e12 * 0.5) / 86400
    assert t.days == pytest.approx(expected_days, rel=1e-12)
    assert t.days == pytest.approx(6354.363, abs=1e-3)


def test_palm_equals_three_x(xl):
    assert step_flops(xl, 1024, 2, "palm") == 3 * 4_513_336_524_800 * 2


# FLOPs per element of each elementwise op torch's AdamW runs, counted by hand (one per
# multiply, add, subtract, divide or sqrt):
#   mul (p·(1 - lr·λ), v·β2) 1;  lerp m + w·(g - m): subtract, multiply, add 3;
#   addcmul v + c·g·g: two multiplies, add 3;  sqrt 1;  div (by √(1-β2^t)) 1;  add (+eps) 1;
#   addcdiv p + s·m/denom: divide, multiply, add 3.
TORCH_OP_FLOPS = {"mul": 1, "mul_": 1, "lerp_": 3, "addcmul_": 3, "sqrt": 1, "div": 1, "add_": 1, "addcdiv_": 3}


class _ElementwiseOps(TorchDispatchMode):
    """Records (op name, output numel) of every aten op run under it."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor):
            self.calls.append((func.overloadpacket.__name__, out.numel()))
        return out


def test_adamw_flops_per_param_counted_on_torchs_own_step():
    # Run a real torch.optim.AdamW step (for-loop implementation; default weight decay 0.01, so
    # the decay multiply runs) on a 37-element parameter and count the elementwise ops that
    # produce a 37-element tensor.  The 0-d step counter's add is not per parameter.
    n = 37
    p = torch.nn.Parameter(torch.randn(n))
    opt = torch.optim.AdamW([p], foreach=False)
    p.grad = torch.randn(n)
    opt.step()  # the first step creates m and v; count a steady-state step
    p.grad = torch.randn(n)
    with torch.no_grad(), _ElementwiseOps() as rec:
        opt.step()
    per_param_ops = [name for name, numel in rec.calls if numel == n]
    assert set(per_param_ops) <= set(TORCH_OP_FLOPS), per_param_ops  # no op we have not priced
    measured = sum(TORCH_OP_FLOPS[name] for name in per_param_ops)
    # mul_ 1 + lerp_ 3 + mul_ 1 + addcmul_ 3 + sqrt 1 + div 1 + add_ 1 + addcdiv_ 3 = 14
    assert measured == 14
    # The CS336 handout's AdamW (algorithm 1), counted the same way: m = β1·m + (1-β1)·g (3),
    # v = β2·v + (1-β2)·g² (4), θ -= α_t·m/(√v + ε) (5: sqrt, add, divide, multiply, subtract),
    # θ -= α·λ·θ (2): 3 + 4 + 5 + 2 = 14 as well.
    assert adamw_step_flops(n) == measured * n == 518
    # GPT-2 XL: 14 · 2,127,057,600 = 29,778,806,400
    assert adamw_step_flops(XL_PARAMS) == 29_778_806_400
    # the 10-per-parameter convention: 10 · 2,127,057,600 = 21,270,576,000
    assert adamw_step_flops(XL_PARAMS, 10) == 21_270_576_000


def test_adamw_alternatives_are_data():
    counts = {c.name: c.flops_per_param for c in ADAMW_FLOPS_ALTERNATIVES}
    assert counts["fma-as-one"] == 2 + 3 + 4 + 1  # m, v, update, decay
    assert counts["per-element-bias-correction"] == 3 + 4 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1
    assert counts["torch-ops"] == 14
    assert len(counts) == len(ADAMW_FLOPS_ALTERNATIVES)


def test_gpu_table():
    # Dense (no 2:4 sparsity) peak FLOP/s from the vendors' datasheets:
    assert gpu_peak_flops("a100", "fp32") == 19_500_000_000_000  # A100 datasheet: FP32 19.5 TFLOPS
    assert gpu_peak_flops("a100", "bf16") == 312_000_000_000_000  # BF16 tensor core 312 (624 sparse)
    assert gpu_peak_flops("h100-sxm", "bf16") == 989_400_000_000_000  # Hopper whitepaper: BF16 989.4 dense
    assert gpu_peak_flops("h100-sxm", "fp32") == 67_000_000_000_000  # H100 SXM datasheet: FP32 67
    # H200 SXM datasheet: FP32 67 TFLOPS, BF16 1,979 with sparsity -> 989.4 dense (the H100 SXM's compute)
    assert gpu_peak_flops("h200", "fp32") == 67_000_000_000_000
    assert gpu_peak_flops("h200", "bf16") == 989_400_000_000_000
    assert gpu_peak_flops("h100-pcie", "bf16") == 756_000_000_000_000  # H100 PCIe: 1,513 sparse / 2, rounded down
    assert gpu_peak_flops("l4", "bf16") == 121_000_000_000_000  # L4 datasheet: BF16 242 with sparsity
    assert gpu_peak_flops("v100", "fp16") == 125_000_000_000_000  # V100 SXM2 datasheet: tensor 125
    assert gpu_peak_flops("rtx-4090", "bf16") == 165_200_000_000_000  # Ada whitepaper: 330.4 sparse
    assert all(isinstance(v, int) and v > 0 for table in GPUS.values() for v in table.values())


def test_unknown_gpu_and_dtype():
    with pytest.raises(AccountingError, match="a100, h100-sxm"):
        gpu_peak_flops("a10", "fp32")
    with pytest.raises(AccountingError, match="fp32, fp16"):
        gpu_peak_flops("v100", "bf16")


@pytest.mark.parametrize("mfu", [0, -0.1, 1.01, True, "0.5"])
def test_training_time_rejects_mfu(mfu):
    with pytest.raises(AccountingError, match=r"\(0, 1\]"):
        training_time(10**15, 10, 10**12, mfu)


def test_training_time_full_mfu_allowed():
    t = training_time(86_400 * 10**12, 1, 10**12, 1)
    assert t.days == 1.0


@pytest.mark.parametrize(
    "kw",
    [
        dict(steps=0),
        dict(steps=1.5),
        dict(flops_per_step=0),
        dict(flops_per_step=True),
        dict(peak_flops=0),
        dict(peak_flops=-1e12),
    ],
)
def test_training_time_rejects(kw):
    args = dict(flops_per_step=10**15, steps=10, peak_flops=10**12, mfu=0.5)
    args.update(kw)
    with pytest.raises(AccountingError):
        training_time(**args)


def test_bad_step_inputs(xl):
    with pytest.raises(AccountingError, match="3x, 6nd, palm"):
        step_flops(xl, 1024, 1, "2x")
    with pytest.raises(AccountingError):
        step_flops(xl, 1024, 0)
    with pytest.raises(AccountingError):
        adamw_step_flops(0)
