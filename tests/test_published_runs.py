"""reports/published/: published training runs beside the one rule of ``analytic.published_runs``.

The table is recomputed from the data and the predictor and compared with the committed files; one row's
prediction and one published TFLOP/s conversion are written out by hand; every row names its source, and its cause
where the error passes 10 %; the summary is recomputed from the rows (whatever it is: the issue's target, median
|error| <= 10 %, is not asserted, it is published)."""

import json
from pathlib import Path

import pytest

from lm_accounting.analytic.published_runs import EXCLUDE, RUNS, compare, rows, summary
from lm_accounting.analytic.step_time import predict_step_time
from lm_accounting.config import load_config
from lm_accounting.setup import TrainingSetup
from lm_accounting.views.published_runs import write_published

REPORTS = Path(__file__).resolve().parents[1] / "reports" / "published"


@pytest.fixture(scope="module")
def records():
    return rows()


def test_committed_table_is_the_recomputed_one(tmp_path):
    paths = write_published(tmp_path)
    assert sorted(p.name for p in paths) == ["runs.csv", "runs.json", "runs.md"]
    for p in paths:
        assert (REPORTS / p.name).read_bytes() == p.read_bytes(), f"{p.name} is stale: run `lm-account report`"


def test_one_row_by_hand():
    """torchtitan's Table 1 FSDP row: Llama 3.1 8B, 8 GPUs, FSDP 8, local batch 2 (no accumulation), S = 8,192,
    selective op AC, 5,762 TPS/GPU.  With tp = pp = 1 every GPU runs the whole model on its 2 sequences, so the
    rule's compute is the calibrated forward + backward of that step, and AdamW over an eighth of the states (FSDP2).
    The FSDP2 collectives are at most two all-gathers and one reduce-scatter of the fp32 parameters, (n - 1)/n of
    them on the wire at NVLink's 450 GB/s one way, overlapped: below the compute, so the step is the compute."""
    run = next(r for r in RUNS if r.name == "TT T1 8B FSDP 8")
    cfg = load_config("llama-3.1-8b")
    t = predict_step_time(
        cfg, 8192, TrainingSetup(attention="sdpa", checkpoint="op", precision="amp-bf16"), impl="course", batch=2
    )
    compute = t.forward.seconds + t.backward.seconds + t.optimizer_step / 8
    params = 8_030_261_248  # Llama-3.1-8B (the preset table; tests/test_transformers_truth.py)
    dp_bound = 3 * 4 * params * 7 / 8 / 450e9
    assert dp_bound < compute
    row = compare(run)
    assert row["dp_comm_s"] <= dp_bound and row["tp_comm_s"] == 0 and row["pp_comm_s"] == 0
    tokens_per_s = 2 * 8192 / compute  # one GPU's tokens over its step
    assert row["predicted_tokens_per_s"] == pytest.approx(tokens_per_s, rel=1e-9)
    assert row["error"] == pytest.approx(tokens_per_s / 5762 - 1, rel=1e-9)


def test_a_published_tflops_figure_by_hand():
    """The Llama 3 paper's 430 TFLOP/s per GPU (405B, 8,192 GPUs) in tokens/s at torchtitan's convention:
    6·(N - V·d) + 12·l·h·d_head·S FLOPs per token."""
    run = next(r for r in RUNS if r.name.startswith("Llama 3 405B 8,192"))
    n = 405_853_388_800 - 128_256 * 16_384  # the preset's parameters less the token embedding
    per_token = 6 * n + 12 * 126 * 128 * 128 * 8192
    assert compare(run)["published_tokens_per_s"] == pytest.approx(430e12 / per_token, rel=1e-12)


def test_every_row_has_a_source_and_its_cause(records):
    assert len(RUNS) >= 10 and len({r.name for r in RUNS}) == len(RUNS)
    assert sum(r["predicted_tokens_per_s"] is not None for r in records) >= 10
    for run, r in zip(RUNS, records, strict=True):
        assert run.source.startswith(("https://", "Llama Team")), run.name
        assert run.global_batch % (run.dp * run.micro_batch) == 0, run.name  # the layout splits the batch
        assert run.gpus == run.dp * run.tp * run.pp * run.cp, run.name
        if r["error"] is None:
            assert r["cause"].startswith("not predicted") and not r["in_summary"], run.name
        elif abs(r["error"]) > 0.10:
            assert r["cause"], run.name
        assert r["in_summary"] == (not run.flags & set(EXCLUDE)), run.name


def test_summary_as_computed(records):
    errors = sorted(abs(r["error"]) for r in records if r["in_summary"])
    mid = len(errors) // 2
    median = errors[mid] if len(errors) % 2 else (errors[mid - 1] + errors[mid]) / 2
    s = summary(records)
    assert s["in_summary"] == len(errors) >= 5
    assert s["median_abs_error"] == pytest.approx(median) and s["worst_abs_error"] == errors[-1]
    assert s["over_10pct"] == sum(e > 0.10 for e in errors)
    committed = json.loads((REPORTS / "runs.json").read_text())["summary"]
    assert committed == pytest.approx(s)
    text = (REPORTS / "runs.md").read_text()
    verdict = "met" if median <= 0.10 and errors[-1] <= 0.25 else "NOT met"
    assert f"median |error| {100 * median:.1f} %" in text and f"is {verdict}." in text


def test_the_table_needs_no_torch():
    import subprocess
    import sys

    code = (
        "import sys; from lm_accounting.analytic.published_runs import rows; rows(); "
        "print(','.join(m for m in ('torch', 'transformers', 'pandas', 'matplotlib') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_the_mpt_rows_are_the_models_that_ran():
    """llm-foundry's table prints each run's NumParams: the GPT-2 architecture at the MPT sizes, with its 50,368
    vocabulary and learned positions up to the row's sequence, has exactly that many parameters (an independent
    count: the table's, against ours)."""
    from lm_accounting.analytic.params import parameter_breakdown
    from lm_accounting.analytic.published_runs import MPT_H100, config

    mpt = [r for r in RUNS if r.name.startswith("MPT ")]
    assert len(mpt) == len(MPT_H100) == 52
    for run, published in zip(mpt, MPT_H100, strict=True):
        assert parameter_breakdown(config(run)).total == published[-1], run.name


def test_the_mpt_mfu_column_is_the_throughput():
    """llm-foundry's MFU column (collect_results.py: (3·flops_per_seq + 3·attn_flops_per_seq)·seq/s over GPUs and
    Composer's 989.4 TFLOP/s bf16 H100 peak, flops_per_seq = 2·N·S, attn = l·2·2·d·S²) is its T/s/GPU times
    6·N + 12·l·d·S per token on every row (to the T/s/GPU's truncation): the two columns are one measurement, so the
    errors of the MPT rows are in the time, not in a FLOP convention."""
    from lm_accounting.analytic.published_runs import MPT_H100, MPT_SIZES

    for model, seq, _gpus, _b, _gbs, _ck, tps, mfu, n in MPT_H100:
        d, _h, layers = MPT_SIZES[model]
        per_token = 6 * n + 12 * layers * d * seq
        assert 100 * per_token * tps / 989.4e12 == pytest.approx(mfu, rel=1e-3), (model, seq)
