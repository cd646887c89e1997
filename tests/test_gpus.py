"""The GPU table against figures written out from the vendors' datasheets (not read from the code)."""

import subprocess
import sys

import pytest

from lm_accounting.config import AccountingError
from lm_accounting.gpus import ALIASES, GPUS, gpu


def test_datasheet_figures():
    # NVIDIA L4 datasheet: 24GB GDDR6 at 300 GB/s (one public table lists 3,350 GB/s: an H100's figure).
    l4 = gpu("l4")
    assert l4.bandwidth == 300_000_000_000
    assert l4.memory_bytes == 24_000_000_000
    assert l4.peak["bf16"] == 121_000_000_000_000  # 242 TFLOPS with sparsity / 2
    # H100 SXM datasheet: 80GB at 3.35 TB/s, NVLink 900 GB/s; Hopper whitepaper: BF16 989.4 dense.
    h100 = gpu("h100-80gb")
    assert h100.bandwidth == 3_350_000_000_000
    assert h100.peak["bf16"] == 989_400_000_000_000
    assert h100.peak["fp8"] == 1_978_900_000_000_000
    assert h100.interconnect_bytes_per_s == 900_000_000_000
    assert h100.interconnect_one_way == 450_000_000_000
    # A100 datasheet: 40GB SXM 1,555 GB/s, 80GB SXM 2,039 GB/s; BF16 312 dense; no FP8.
    assert gpu("a100-40gb").bandwidth == 1_555_000_000_000
    assert gpu("a100-80gb").bandwidth == 2_039_000_000_000
    assert gpu("a100-80gb").peak["bf16"] == 312_000_000_000_000
    assert "fp8" not in gpu("a100-80gb").peak
    # H200 datasheet: 141GB at 4.8 TB/s, the H100 SXM's compute.
    assert (gpu("h200").memory_bytes, gpu("h200").bandwidth) == (141_000_000_000, 4_800_000_000_000)
    assert gpu("h200").peak["bf16"] == 989_400_000_000_000
    # MI300X datasheet: 192 GB at 5.3 TB/s, FP16/BF16 1,307.4 dense.
    assert gpu("mi300x").bandwidth == 5_300_000_000_000
    assert gpu("mi300x").peak["bf16"] == 1_307_400_000_000_000
    # HGX B200: BF16 4.5 PF with sparsity per GPU -> 2,250 dense; 8 TB/s.
    assert gpu("b200").peak["bf16"] == 2_250_000_000_000_000
    assert gpu("b200").bandwidth == 8_000_000_000_000


def test_every_gpu_is_complete():
    for g in GPUS.values():
        assert g.memory_bytes > 0 and g.bandwidth > 0 and g.interconnect_bytes_per_s > 0
        assert g.source and g.interconnect
        assert all(isinstance(v, int) and v > 0 for v in g.peak.values())
        assert "fp32" in g.peak
        # dense tensor-core bf16 (when listed) is at least the fp32 rate
        assert g.peak.get("bf16", g.peak["fp32"]) >= g.peak["fp32"]
    for alias, name in ALIASES.items():
        assert gpu(alias) is GPUS[name]


def test_names_are_case_insensitive_and_old_names_work():
    assert gpu("H100-80GB") is gpu("h100-sxm") is gpu("h100")
    assert gpu("a100") is gpu("a100-80gb")


@pytest.mark.parametrize("name,guess", [("h100-80", "h100-80gb"), ("mi300", "mi300x"), ("l40", "l4")])
def test_unknown_gpu_did_you_mean(name, guess):
    with pytest.raises(AccountingError, match=f"did you mean '{guess}'"):
        gpu(name)


def test_unknown_gpu_on_the_cli_is_exit_2_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "lm_accounting", "train-time", "gpt2-small", "--gpu", "h100-80"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "did you mean 'h100-80gb'" in proc.stderr


def test_table_imports_no_torch():
    code = "import sys, lm_accounting.gpus; assert 'torch' not in sys.modules and 'pandas' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
