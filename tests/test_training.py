"""Training time, AdamW FLOPs and the GPU table: expected numbers written out by hand."""

import pytest

from lm_accounting.analytic.training import (
    ADAMW_FLOPS_ALTERNATIVES,
    ADAMW_FLOPS_PER_PARAM,
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


def test_adamw_flops_per_param_derivation():
    # torch ops: decay 1, lerp 3, mul 1, addcmul 3, sqrt 1, /bc2 1, +eps 1, addcdiv 3
    assert ADAMW_FLOPS_PER_PARAM == 1 + 3 + 1 + 3 + 1 + 1 + 1 + 3 == 14
    assert adamw_step_flops(XL_PARAMS) == 29_778_806_400
    assert adamw_step_flops(XL_PARAMS, 10) == 21_270_576_000


def test_adamw_alternatives_are_data():
    counts = {c.name: c.flops_per_param for c in ADAMW_FLOPS_ALTERNATIVES}
    assert counts["fma-as-one"] == 2 + 3 + 4 + 1  # m, v, update, decay
    assert counts["per-element-bias-correction"] == 3 + 4 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1
    assert counts["torch-ops"] == 14
    assert len(counts) == len(ADAMW_FLOPS_ALTERNATIVES)


def test_gpu_table():
    assert gpu_peak_flops("a100", "fp32") == 19_500_000_000_000
    assert gpu_peak_flops("a100", "bf16") == 312_000_000_000_000
    assert gpu_peak_flops("h100-sxm", "bf16") == 989_400_000_000_000
    assert GPUS["h200"] == GPUS["h100-sxm"]
    assert gpu_peak_flops("v100", "fp16") == 125_000_000_000_000
    assert gpu_peak_flops("rtx-4090", "bf16") == 165_200_000_000_000
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


@pytest.mark.parametrize("kw", [dict(steps=0), dict(steps=1.5), dict(flops_per_step=0),
                                dict(flops_per_step=True), dict(peak_flops=0), dict(peak_flops=-1e12)])
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
