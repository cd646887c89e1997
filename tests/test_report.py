"""reports/ is generated, committed and never stale; the sweep and the Python API agree with
the calculator (one source for every number)."""

import csv
import io
import json
import math
from pathlib import Path

import pandas as pd
import pytest

from lm_accounting import account, load_config, memory_account, sweep
from lm_accounting.course.assignment import write_report
from lm_accounting.views import plots

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"
PLOT_STEMS = [
    "flops_shares",
    "flops_vs_context",
    "predicted_vs_measured",
    "model_comparison",
    *[f"memory_vs_context_gpt2-{s}" for s in ("small", "medium", "large", "xl")],
]


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory):
    out = tmp_path_factory.mktemp("reports")
    answers, paths = write_report(out, live=True, plots=False)
    return out, answers, paths


@pytest.mark.slow  # the regenerated fixture rebuilds reports/ live: ~27 s
def test_committed_tables_match_regenerated(regenerated):
    out, answers, _paths = regenerated
    assert answers.mismatches() == []
    generated = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert generated and all(p.suffix in (".md", ".csv", ".json") for p in generated)
    stale = [
        str(p) for p in generated if not (REPORTS / p).is_file() or (REPORTS / p).read_bytes() != (out / p).read_bytes()
    ]
    assert stale == [], f"reports/ is stale; run `lm-account report`: {stale}"
    committed = sorted(
        p.relative_to(REPORTS)
        for p in REPORTS.rglob("*")
        if p.suffix in (".md", ".csv", ".json")
        and not p.relative_to(REPORTS).parts[0].startswith(("cuda", "calibration"))  # measured on a GPU
    )
    assert committed == generated  # nothing left over from an older layout


@pytest.mark.slow
def test_a_report_carries_the_gpu_validation_over(tmp_path):
    """reports/cuda/ is written by benchmarks/cuda_validation.py on a GPU: `lm-account report` (here
    without live runs and plots) keeps it byte for byte and refuses nothing because of it."""
    from lm_accounting.course.assignment import is_report_file
    from lm_accounting.output import MARKER, MARKER_TEXT

    (tmp_path / MARKER).write_text(MARKER_TEXT)  # a folder lm-account wrote, as reports/ is
    (tmp_path / "cuda").mkdir()
    (tmp_path / "cuda" / "memory.csv").write_text("model,setup\ngpt2-small,naive\n")
    assert is_report_file("cuda/memory.csv") and not is_report_file("cuda/other.csv")
    write_report(tmp_path, live=False, plots=False)
    assert (tmp_path / "cuda" / "memory.csv").read_text() == "model,setup\ngpt2-small,naive\n"
    assert (tmp_path / "answers.json").is_file()


@pytest.mark.slow
def test_committed_plots_exist_with_their_series(tmp_path):
    for stem in PLOT_STEMS:
        png, svg = REPORTS / "sweep" / f"{stem}.png", REPORTS / "sweep" / f"{stem}.svg"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000, stem
        assert b"<svg" in svg.read_bytes()[:2000] and svg.stat().st_size > 20_000, stem
    # redraw from the committed data and count series
    frame = pd.DataFrame(json.loads((REPORTS / "sweep" / "sweep.json").read_text())["rows"])
    _, fig = plots.plot_flops_shares(frame, tmp_path / "s", return_fig=True)
    assert [len(ax.collections) for ax in fig.axes] == [4, 4, 4, 4]
    _, fig = plots.plot_flops_vs_context(frame, tmp_path / "f", return_fig=True)
    assert len(fig.axes[0].lines) == 4 * 4
    _, fig = plots.plot_predicted_vs_measured(frame, tmp_path / "p", return_fig=True)
    measured = [sum(1 for x in line.get_xdata()) for line in fig.axes[0].lines[1::2]]
    assert measured[0] == 8 and sum(measured[1:]) == 0  # gpt2-small measured at all 8 contexts
    _, fig = plots.plot_model_comparison(frame, tmp_path / "c", return_fig=True)
    assert len(fig.axes[0].patches) == 4 * 4


@pytest.mark.slow
def test_report_numbers_are_the_calculators(regenerated):
    out, _answers, _ = regenerated
    data = json.loads((out / "answers.json").read_text())
    ta = data["transformer_accounting"]
    xl = account(load_config("gpt2-xl"), 1024)
    assert ta["a"]["parameters"] == xl.params.total == 2_127_057_600
    assert ta["b"]["forward_flops"] == xl.forward.total == 4_513_336_524_800
    assert ta["b"]["per_layer_flops"] == 90_596_966_400 and ta["b"]["lm_head_flops"] == 164_682_137_600
    assert ta["e"]["forward_flops"] == 149_522_795_724_800
    # the sweep's shares are the calculator's shares
    rows = list(csv.DictReader(io.StringIO((out / "sweep" / "sweep.csv").read_text())))
    row = {r["quantity"]: r["value"] for r in rows if r["model"] == "gpt2-xl" and r["context"] == "16384"}
    at_16k = account(load_config("gpt2-xl").with_context(16384), 16384)
    assert float(row["share:attention matmuls"]) == at_16k.attention_matmuls / at_16k.forward.total
    assert int(row["mem:peak"]) == memory_account(load_config("gpt2-xl").with_context(16384), 16384, 1).step.peak
    # the crosscheck tables show the same totals as the calculator
    cc = (out / "tables" / "xl_crosscheck_16384.csv").read_text()
    assert "149522795724800,149522795724800,149522795724800,0,ok" in cc
    md = (out / "assignment.md").read_text()
    for needle in ("2,127,057,600", "4,513,336,524,800", "149,522,795,724,800", "55.15%", "6,584 days"):
        assert needle in md


@pytest.mark.slow
def test_adamw_answers_hand_computed(regenerated):
    _, answers, _ = regenerated
    N, L, S, d, h, V = 2_127_057_600, 48, 1024, 1600, 25, 50257
    a = 4 * (L * (16 * S * d + 2 * h * S * S) + S * d + 2 * S * V)
    b = 16 * N
    first = answers.course_conventions[0]
    assert (first["a"], first["b"]) == (a, b)
    assert first["max batch (80 GB)"] == (80 * 10**9 - b) // a == 2
    assert first["max batch (80 GiB)"] == (80 * 2**30 - b) // a == 3
    assert answers.adamw_default["flops_per_step"] == 14 * N
    days = 3 * 4_513_336_524_800 * 1024 * 400_000 / (19.5e12 * 0.5) / 86_400
    assert answers.training[0]["days"] == pytest.approx(days, rel=1e-12)


@pytest.mark.slow
def test_sweep_cli_writes_tables_and_plots(run_cli, tmp_path):
    r = run_cli("sweep", "gpt2-small", "gpt2-medium", "--contexts", "256:1024:x2", "--out", tmp_path)
    assert r.code == 0, r.err
    rows = list(csv.DictReader(io.StringIO((tmp_path / "sweep.csv").read_text())))  # tidy: one fact per row
    assert list(dict.fromkeys((x["model"], int(x["context"])) for x in rows)) == [
        (m, s) for m in ("gpt2-small", "gpt2-medium") for s in (256, 512, 1024)
    ]
    checked = [x for x in rows if x["quantity"] in ("flops:total", "flops:layers.*.attn.qk")]
    assert len(checked) == 2 * 6
    for x in checked:
        acc = account(load_config(x["model"]).with_context(int(x["context"])), int(x["context"]))
        counted = acc.forward if x["quantity"] == "flops:total" else acc.forward["layers.*.attn.qk"]
        assert int(x["value"]) == counted.total
    names = {p.name for p in tmp_path.iterdir()}
    assert {"sweep.md", "sweep.json", "flops_shares.png", "memory_vs_context_gpt2-medium.svg"} <= names
    assert not [n for n in names if n.startswith(".") and n != ".lm-account.json"]  # no temp files left


def test_sweep_cli_live_points_agree(run_cli, tmp_path):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text("vocab_size = 97\ncontext_length = 64\nnum_layers = 2\nd_model = 24\nnum_heads = 4\nd_ff = 40\n")
    r = run_cli(
        "sweep",
        cfg,
        "--contexts",
        "16,32",
        "--crosscheck",
        "--measure-memory",
        "meta",
        "--out",
        tmp_path / "out",
        "--no-plots",
        "--format",
        "json",
    )
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["mismatches"] == []
    for row in data["rows"]:
        assert row["measured:flops"] == row["flops:total"]
        assert row["measured:peak"] == row["mem:peak_traced"]  # the tracker sees the traced run


@pytest.mark.parametrize("contexts", ["0,128", "abc", "1024:128:x2", "128:1024:x1", ""])
def test_sweep_bad_contexts(run_cli, tmp_path, contexts):
    r = run_cli("sweep", "gpt2-small", "--contexts", contexts, "--out", tmp_path)
    assert r.code == 2 and "--contexts" in r.err and len(r.err.strip().splitlines()) == 1


def test_python_api_frames():
    s = sweep([load_config("gpt2-small")], [128, 1024])
    frame = s.to_frame()
    assert list(frame["context"]) == [128, 1024]
    assert frame.loc[1, "flops:total"] == account(load_config("gpt2-small"), 1024).forward.total
    acc = account(load_config("gpt2-xl"), 1024)
    fwd = acc.forward.to_frame()
    assert fwd.loc["lm_head", "total"] == 164_682_137_600
    assert math.isclose(fwd["share"].sum(), 1.0)
    long = acc.to_frame()
    assert long[long["section"] == "parameters"]["total"].sum() == 2_127_057_600
    frame = memory_account(load_config("gpt2-small"), 256, 1).to_frame()
    step = frame[frame["section"] == "implementation_exact.step"]
    assert list(dict.fromkeys(step["key"])) == ["baseline", "forward", "backward", "optimizer_step"]
