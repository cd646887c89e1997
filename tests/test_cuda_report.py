"""The committed GPU measurements (reports/cuda, an H200 with torch 2.11) against this checkout's
predictions: ``benchmarks/cuda_validation.py --repredict`` recomputes the predicted columns (no GPU)
and every measured figure must equal its prediction, but the one in ``KNOWN`` (one naive amp-bf16 GQA
attention copy the legacy replay counts and the GPU does not make)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MEASURED = ROOT / "reports" / "cuda"
# naive attention under amp-bf16 with grouped K/V heads: at AV the GPU held one (B, S, kv, d_head) bf16 copy
# less than the replay (8,388,608 B here, the prediction high); the op library's course program has it
# (tests/test_ops_cuda.py), the legacy replay not
KNOWN = {("llama-3-8b (2 layers, vocab 512)", "naive+none+amp-bf16+foreach", "forward_peak")}


def validation():
    spec = importlib.util.spec_from_file_location("cuda_validation", ROOT / "benchmarks" / "cuda_validation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def unequal(rows: list[dict]) -> set[tuple[str, str, str]]:
    out = set()
    for r in rows:
        for key in [k for k in r if k.endswith("_predicted") and not r.get("error")]:
            what = key.removesuffix("_predicted")
            if r[key] != r[what + "_measured"]:
                out.add((r["model"], r.get("layout", "") + r["setup"], what))
    return out


@pytest.mark.slow
def test_every_measured_figure_equals_this_codes_prediction(tmp_path):
    cv = validation()
    shutil.copytree(MEASURED, tmp_path / "cuda")
    assert cv.main(["--repredict", "--out", str(tmp_path / "cuda")]) == 0
    tables = cv.read_tables(tmp_path / "cuda")
    memory, parallel = tables["memory"], tables["parallel"]
    assert len(memory) == 198 and len(parallel) == 72
    assert sum(1 for r in memory if not r.get("error")) == 174  # the other 24: fp32 + GQA fused attention, refused
    assert unequal(memory) == KNOWN
    assert unequal(parallel) == set()  # FSDP2 ZeRO-2/3, TP, TP+SP(+VP), FSDP2 x TP ranks on CUDA streams
