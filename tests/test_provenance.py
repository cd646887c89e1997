"""The measured claims the views print, recounted from the committed GPU tables (reports/cuda), and no
stale machine named anywhere in the package."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from lm_accounting.provenance import CUDA, CUDA_H100, CUDA_H200, HF_CUDA_RUNS

ROOT = Path(__file__).resolve().parent.parent
CUDA_DIR = ROOT / "reports" / "cuda"


def rows(section: str) -> list[dict[str, str]]:
    with (CUDA_DIR / f"{section}.csv").open() as f:
        return list(csv.DictReader(f))


def pairs_equal(section: str) -> tuple[int, int]:
    """(equal, compared) over every X_predicted / X_measured pair of the rows that ran (no error)."""
    equal = total = 0
    for r in rows(section):
        if r.get("error"):
            continue
        for key in (k for k in r if k.endswith("_predicted")):
            total += 1
            equal += r[key] == r[key.removesuffix("_predicted") + "_measured"]
    return equal, total


def test_the_gpu_run_is_the_one_committed():
    env = json.loads((CUDA_DIR / "env.json").read_text())
    assert (CUDA.gpu, CUDA.torch, CUDA.date) == (env["gpu"], env["torch"], env["date"])


@pytest.mark.parametrize("section", ["memory", "parallel"])
def test_memory_figures_equal_as_the_tables_count_them(section):
    assert CUDA.equal[section] == pairs_equal(section)


def test_flops_points_equal_as_the_table_counts_them():
    ran = [r for r in rows("flops") if not r.get("error")]
    counts = [
        ("forward_analytic", "forward_fvcore", "forward_FlopCounterMode"),
        ("fwd_bwd_analytic", "fwd_bwd_FlopCounterMode"),
    ]
    equal = sum(all(len({r[k] for k in group}) == 1 for group in counts) for r in ran)
    assert CUDA.equal["flops"] == (equal, len(ran))


def test_inference_figures_equal_as_the_table_counts_them():
    table = rows("inference")
    assert CUDA.equal["inference"] == (sum(r["predicted"] == r["measured"] for r in table), len(table))


def test_the_phrase_names_the_machine_and_the_count():
    assert CUDA.phrase("memory") == (
        "measured on NVIDIA H200 with torch 2.11.0+cu130: 1,623 of 1,624 figures equal, reports/cuda/memory.csv"
    )


def test_no_stale_machine_or_claim_in_the_package():
    """The issue's grep: labels that contradicted reports/cuda (an H100 that was an H200; inference 'not yet
    measured' after the H200 measured it)."""
    stale = re.compile(r"H100, torch 2\.11|not yet measured on a GPU|not measured yet")
    hits = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in (ROOT / "lm_accounting").rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if stale.search(line)
    ]
    assert hits == []


def recount(folder, sections):
    """(figures equal and compared per section, model types with a compared hf_memory row per attention), recounted
    from a committed GPU folder (its predicted columns written by --repredict; each transformers figure compared less
    ``import_tensor_bytes``)."""
    counts, kinds = {}, {}
    for section in sections:
        with (folder / f"{section}.csv").open() as f:
            equal = total = 0
            for r in csv.DictReader(f):
                if r.get("error") or not r.get("baseline_predicted"):
                    continue
                extra = int(r.get("import_tensor_bytes") or 0)
                for key in (k for k in r if k.endswith("_predicted")):
                    total += 1
                    equal += int(r[key]) == int(r[key.removesuffix("_predicted") + "_measured"]) - extra
                if section == "hf_memory":
                    kinds.setdefault(r["setup"].split("+")[0], set()).add(r["model"].split(" ")[0])
        counts[section] = (equal, total)
    types = {"llama-3-8b": "llama", "mistral-7b": "mistral", "qwen3-0.6b": "qwen3", "openai-gpt2": "gpt2"}
    return counts, {k: frozenset(types.get(m, m) for m in v) for k, v in kinds.items()}


@pytest.mark.parametrize(("run", "sections"), [(CUDA_H100, ("memory", "hf_memory")), (CUDA_H200, ("hf_memory",))])
def test_the_transformers_gpu_claims_are_the_committed_tables(run, sections):
    """CUDA_H100's and CUDA_H200's counts recounted from their folders, and ``HF_CUDA_RUNS`` the model types and
    attentions with a compared row there."""
    folder = ROOT / run.folder
    env = json.loads((folder / "env.json").read_text())
    assert (run.gpu, run.torch, run.date) == (env["gpu"], env["torch"], env["date"])
    counts, kinds = recount(folder, sections)
    assert run.equal == counts
    assert kinds == next(measured for r, measured in HF_CUDA_RUNS if r is run)
