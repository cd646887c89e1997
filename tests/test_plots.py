"""The sweep figures: files written atomically, and each figure carries the series it claims."""

from __future__ import annotations

import math
import sys

PYPLOT_BEFORE = "matplotlib.pyplot" in sys.modules  # before this module imports matplotlib and plots

import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex
from matplotlib.figure import Figure

from lm_accounting.analytic.memory import adamw_step_temporary_bytes
from lm_accounting.config import load_config
from lm_accounting.sweep import sweep
from lm_accounting.views import plots

MODELS = ("gpt2-small", "gpt2-medium")
CONTEXTS = (256, 512, 1024, 2048, 4096)
MEASURED_AT = (512, 2048)


def sweep_frame(models=MODELS, contexts=CONTEXTS, batch=1, measured_at=MEASURED_AT) -> pd.DataFrame:
    """The real sweep's frame (default foreach AdamW, fp32), with stand-in measurements (±1%, on meta)
    at ``measured_at``."""
    frame = sweep([load_config(name) for name in models], contexts, batch).to_frame()
    if "mem:step_temporaries" not in frame:  # sweeps before the column existed
        frame["mem:step_temporaries"] = [
            adamw_step_temporary_bytes(load_config(m), "fp32", "foreach") for m in frame["model"]
        ]
    sign = frame["context"].rank(method="dense").map(lambda r: 1 if int(r) % 2 == 0 else -1)
    hit = frame["context"].isin(measured_at)
    frame["measured:flops"] = (frame["flops:total"] * (1 + 0.01 * sign)).where(hit, math.nan)
    frame["measured:peak"] = (frame["mem:peak"] * (1 - 0.01 * sign)).where(hit, math.nan)
    frame["measured:device"] = ["meta" if h else None for h in hit]
    return frame


@pytest.fixture(scope="module")
def frame():
    return sweep_frame()


@pytest.fixture(scope="module")
def wide():
    """Three models whose crossover S* (8-11k) lies inside the sweep; nothing measured."""
    return sweep_frame(models=("gpt2-small", "gpt2-medium", "gpt2-large"), contexts=(1024, 4096, 16384), measured_at=())


def check_files(paths, stem):
    assert [p.name for p in paths] == [f"{stem.name}.png", f"{stem.name}.svg"]
    png, svg = paths
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in svg.read_bytes()[:2000]
    assert png.stat().st_size > 20_000 and svg.stat().st_size > 20_000
    leftovers = [p.name for p in stem.parent.iterdir() if p.name.startswith(".") or p.suffix == ".tmp"]
    assert leftovers == []


def legend_texts(legend):
    return [t.get_text() for t in legend.get_texts()]


def line(ax, label):
    (found,) = [ln for ln in ax.lines if ln.get_label() == label]
    return found


def star_label(ax):
    (star,) = [ln for ln in ax.lines if ln.get_marker() == "*"]
    return star.get_label()


PARAMS_GRADS_TEMPS = "parameters = gradients =\nAdamW step temporaries"


def test_flops_shares(frame, tmp_path):
    paths, fig = plots.plot_flops_shares(frame, tmp_path / "shares", return_fig=True)
    check_files(paths, tmp_path / "shares")
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title().split(" (")[0] for ax in panels] == list(MODELS)  # ordered by params
    for ax in panels:
        assert len(ax.collections) == len(plots.GROUPS)  # one stacked area per group
        colors = [to_hex(c.get_facecolor()[0]) for c in ax.collections]
        assert colors == [plots.PALETTE[g].lower() for g in plots.GROUPS]
        assert ax.get_ylim() == (0, 100)
        assert [t.get_text() for t in ax.get_xticklabels()] == ["256", "512", "1k", "2k", "4k"]
    assert len(fig.legends) == 1 and legend_texts(fig.legends[0]) == list(plots.GROUPS)
    assert fig._suptitle.get_text().startswith("Where the forward FLOPs go")
    assert panels[0].get_ylabel() and panels[0].get_xlabel() == "context length (tokens)"


def test_flops_shares_wraps_into_a_grid(wide, tmp_path):
    _, fig = plots.plot_flops_shares(wide, tmp_path / "grid", ncols=2, return_fig=True)
    assert len(fig.axes) == 4 and sum(ax.get_visible() for ax in fig.axes) == 3


def test_crossover_is_analytic():
    # GPT-2 shapes: linear = L·32·S·d² + 2·S·d·V, quadratic = L·4·S²·d, so S* = 8·d + V/(2·L)
    small = sweep_frame(models=("gpt2-small",), contexts=(256, 4096), measured_at=())
    assert plots.crossover_context(small, "gpt2-small") == pytest.approx(8 * 768 + 50257 / 24, rel=1e-12)


def test_flops_vs_context(frame, tmp_path):
    paths, fig = plots.plot_flops_vs_context(frame, tmp_path / "fvc", return_fig=True)
    check_files(paths, tmp_path / "fvc")
    (ax,) = fig.axes
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert len(ax.lines) == 4 * len(MODELS)  # total, linear, quadratic, crossover marker
    styles = [line.get_linestyle() for line in ax.lines[:4]]
    assert styles == ["-", "--", ":", "None"]
    notes = [t.get_text() for t in ax.texts]
    stars = [plots.crossover_context(frame, m) for m in MODELS]
    assert notes == [f"S* ≈ {s:,.0f}" for s in stars]
    marker = ax.lines[3]
    assert marker.get_xdata()[0] == pytest.approx(stars[0])
    labels = legend_texts(ax.get_legend())
    assert labels[: len(MODELS)] == [f"{m}: S* = {s:,.0f} (outside sweep)" for m, s in zip(MODELS, stars, strict=True)]
    assert ax.get_xlim()[1] > max(stars)  # x range widened to show S* beyond 4k
    assert any("outside the sweep" in t for t in labels)
    assert all(label.get_text() for label in ax.get_yticklabels() if 1e9 <= label.get_position()[1] <= 1e14)
    assert ax.yaxis.get_offset_text().get_text() == ""


def test_flops_vs_context_crossover_inside_sweep(wide, tmp_path):
    _, fig = plots.plot_flops_vs_context(wide, tmp_path / "in", return_fig=True)
    (ax,) = fig.axes
    assert legend_texts(ax.get_legend())[0] == "gpt2-small: S* = 8,238"
    assert len(ax.lines) == 4 * 3
    assert not any("outside" in t for t in legend_texts(ax.get_legend()))
    assert ax.get_xlim()[1] < 16384 * 1.3


def test_max_fitting_context():
    rows = pd.DataFrame({"context": [1, 2, 4, 8], "mem:peak": [1e9, 2e9, 4e9, 8e9]})
    assert plots.max_fitting_context(rows, 3e9) == (2, pytest.approx(3.0))  # peak ∝ S: exact on log-log
    assert plots.max_fitting_context(rows, 4e9) == (4, pytest.approx(4.0))
    assert plots.max_fitting_context(rows, 100e9) == (8, None)
    assert plots.max_fitting_context(rows, 0.5e9) == (None, None)


def test_memory_vs_context(frame, tmp_path):
    paths, fig = plots.plot_memory_vs_context(
        frame, tmp_path / "mem", model="gpt2-medium", budget_bytes=40 * 10**9, budget_label="40 GB", return_fig=True
    )
    check_files(paths, tmp_path / "mem")
    (ax,) = fig.axes
    labels = legend_texts(ax.get_legend())
    # foreach AdamW at fp32: gradients and the step's extra copy of v are as large as the parameters
    assert labels[:5] == [PARAMS_GRADS_TEMPS, "optimizer", "activations", "peak of the step", "budget 40 GB"]
    assert len(labels) == 6 and "log-log interpolation" in labels[5]
    medium = frame[frame["model"] == "gpt2-medium"]
    assert list(line(ax, PARAMS_GRADS_TEMPS).get_ydata()) == pytest.approx(list(medium["mem:parameters"] / 1e9))
    assert line(ax, "budget 40 GB").get_ydata()[0] == 40
    peak = line(ax, "peak of the step")
    assert list(peak.get_ydata()) == pytest.approx(list(medium["mem:peak"] / 1e9))
    largest, crossing = plots.max_fitting_context(medium, 40e9)
    assert largest == 2048 and 2048 < crossing < 4096
    star = next(line for line in ax.lines if line.get_marker() == "*")
    assert star.get_xdata()[0] == pytest.approx(crossing) and star.get_ydata()[0] == 40
    assert "largest swept context within 40 GB: 2k" in ax.get_title()  # mem:max_context is for 80 GB
    assert ax.get_ylabel() == "memory (GB = 10⁹ bytes)"


def test_memory_draws_distinct_components_apart(frame, tmp_path):
    # gradients in another dtype than the parameters, for-loop AdamW's smaller temporaries: own lines
    small = frame[frame["model"] == "gpt2-small"].copy()
    small["mem:gradients"] = small["mem:parameters"] // 2
    small["mem:step_temporaries"] = small["mem:parameters"] // 10
    _, fig = plots.plot_memory_vs_context(small, tmp_path / "m", model="gpt2-small", return_fig=True)
    (ax,) = fig.axes
    labels = legend_texts(ax.get_legend())
    assert labels[:5] == ["parameters", "gradients", "optimizer", "AdamW step temporaries", "activations"]
    assert list(line(ax, "gradients").get_ydata()) == pytest.approx(list(small["mem:parameters"] / 2e9))
    temporaries = line(ax, "AdamW step temporaries")
    assert list(temporaries.get_ydata()) == pytest.approx(list(small["mem:parameters"] / 1e10))
    assert to_hex(temporaries.get_color()) == plots.PALETTE[plots.TEMPORARIES].lower()


@pytest.mark.parametrize("temporaries", ["absent", "zero"])  # older frames; fused AdamW
def test_memory_without_step_temporaries(frame, tmp_path, temporaries):
    small = frame[frame["model"] == "gpt2-small"]
    small = (
        small.drop(columns=["mem:step_temporaries"])
        if temporaries == "absent"
        else small.assign(**{"mem:step_temporaries": 0})
    )
    _, fig = plots.plot_memory_vs_context(small, tmp_path / "m", model="gpt2-small", return_fig=True)
    (ax,) = fig.axes
    assert legend_texts(ax.get_legend())[:3] == ["parameters = gradients", "optimizer", "activations"]


def test_memory_labels_both_ends_of_a_long_log_axis(frame, tmp_path):
    # gpt2-small's activations at 256 tokens are ~0.5 GB: the part below 1 GB gets its 2x/5x labels
    _, fig = plots.plot_memory_vs_context(
        frame, tmp_path / "m", model="gpt2-small", budget_bytes=40 * 10**9, budget_label="40 GB", return_fig=True
    )
    (ax,) = fig.axes
    lo, hi = ax.get_ylim()
    assert lo < 0.5 and 10 < hi < 100 and hi / lo > 100
    shown = {
        t.get_position()[1]: t.get_text() for t in ax.get_yticklabels(minor=True) if lo <= t.get_position()[1] <= hi
    }
    assert shown[0.5] == "0.5" and shown[20] == "20"  # below 1 and above 10: labelled
    assert shown[2] == shown[5] == ""  # between two labelled powers of 10: not


def test_memory_marks_the_exact_largest_context(tmp_path):
    # the sweep computed mem:max_context for its budget: the star sits there, not interpolated
    budget = 40 * 10**9
    medium = sweep([load_config("gpt2-medium")], CONTEXTS, budget=budget).to_frame()
    exact = int(medium["mem:max_context"].iloc[0])
    assert 2048 < exact < 4096
    _, fig = plots.plot_memory_vs_context(
        medium, tmp_path / "m", model="gpt2-medium", budget_bytes=budget, budget_label="40 GB", return_fig=True
    )
    (ax,) = fig.axes
    star = next(line for line in ax.lines if line.get_marker() == "*")
    assert star.get_xdata()[0] == exact
    assert f"largest context that fits: {exact:,} tokens" in star_label(ax)
    assert ax.get_title().endswith(f"\nlargest context within 40 GB: {exact:,} tokens (exact step model)")
    assert "swept" not in ax.get_title()
    # swept only above it: no star, the title still gives the exact context and says where it lies
    above = medium[medium["context"] > exact]
    _, fig = plots.plot_memory_vs_context(
        above, tmp_path / "a", model="gpt2-medium", budget_bytes=budget, budget_label="40 GB", return_fig=True
    )
    (ax,) = fig.axes
    assert not any(line.get_marker() == "*" for line in ax.lines)
    assert ax.get_title().endswith(f": {exact:,} tokens (exact step model), below the swept contexts")


def test_memory_budget_label_and_errors(wide, tmp_path):
    _, fig = plots.plot_memory_vs_context(
        wide, tmp_path / "m", model="gpt2-small", budget_bytes=2**30, budget_label="1 GiB", return_fig=True
    )
    (ax,) = fig.axes
    assert "budget 1 GiB = 1.074 GB" in legend_texts(ax.get_legend())
    assert "no swept context fits in 1 GiB" in ax.get_title()
    assert not any(line.get_marker() == "*" for line in ax.lines)
    with pytest.raises(ValueError, match="gpt2-xl"):
        plots.plot_memory_vs_context(wide, tmp_path / "x", model="gpt2-xl")


def test_predicted_vs_measured(frame, tmp_path):
    paths, fig = plots.plot_predicted_vs_measured(frame, tmp_path / "pvm", return_fig=True)
    check_files(paths, tmp_path / "pvm")
    assert len(fig.axes) == 2
    for ax in fig.axes:  # measured:flops, measured:peak
        assert len(ax.lines) == 2 * len(MODELS)  # analytic line + measured markers per model
        markers = ax.lines[1]
        assert list(markers.get_xdata()) == list(MEASURED_AT)
        assert len(legend_texts(ax.get_legend())) == len(MODELS)
        assert "max |Δ| 1.00%" in legend_texts(ax.get_legend())[0]
    assert "no measurements" not in fig._suptitle.get_text()
    flops, memory = fig.axes
    assert flops.get_title() == "forward FLOPs: analytic vs FlopCounterMode (live model)"
    assert memory.get_title() == "peak memory: analytic vs measured (live model on meta)"


def test_predicted_vs_measured_without_measurements(wide, tmp_path):
    bare = wide.drop(columns=["measured:peak"]).astype({"measured:flops": object})
    bare["measured:flops"] = None  # a missing column, None or NaN all count as not measured
    _, fig = plots.plot_predicted_vs_measured(bare, tmp_path / "none", return_fig=True)
    assert "no measurements" in fig._suptitle.get_text()
    assert fig.axes[1].get_title() == "peak memory: analytic vs measured (live model)"  # no measured:device
    for ax in fig.axes:
        assert sum(len(line.get_xdata()) > 0 for line in ax.lines) == 3  # the curves are still drawn
        assert all("not measured" in t for t in legend_texts(ax.get_legend()))


def test_model_comparison(frame, tmp_path):
    paths, fig = plots.plot_model_comparison(frame, tmp_path / "cmp", context=1024, return_fig=True)
    check_files(paths, tmp_path / "cmp")
    (ax,) = fig.axes
    assert len(ax.patches) == len(MODELS) * len(plots.GROUPS)
    ticks = sorted(ax.get_yticklabels(), key=lambda t: -t.get_position()[1])  # top first
    assert [t.get_text().split("\n")[0] for t in ticks] == list(MODELS)
    row = frame[(frame["model"] == "gpt2-small") & (frame["context"] == 1024)].iloc[0]
    ffn = f"{100 * row['share:ffn']:.1f}%"
    assert ffn in [t.get_text() for t in ax.texts]
    assert ax.get_xlim() == (0, 100)
    bar_colors = {to_hex(p.get_facecolor()) for p in ax.patches}
    assert bar_colors == {plots.PALETTE[g].lower() for g in plots.GROUPS}
    assert legend_texts(fig.legends[0]) == list(plots.GROUPS)
    with pytest.raises(ValueError, match="context 1000 not in the sweep"):
        plots.plot_model_comparison(frame, tmp_path / "bad", context=1000)


def test_model_comparison_labels_fit_their_segments(tmp_path):
    # gpt2-xl at 1k: the LM head is 3.6% (too narrow for its label); at 128 the attention matmuls are 1%
    xl = sweep_frame(models=("gpt2-xl",), contexts=(128, 1024), measured_at=())
    for context, outside in ((1024, {"lm head"}), (128, {"attention matmuls", "lm head"})):
        _, fig = plots.plot_model_comparison(xl, tmp_path / "cmp", context=context, return_fig=True)
        (ax,) = fig.axes
        renderer = FigureCanvasAgg(fig).get_renderer()
        fig.draw(renderer)
        row = xl[xl["context"] == context].iloc[0]
        for bar, group in zip(ax.patches, plots.GROUPS, strict=True):
            (label,) = [t for t in ax.texts if t.get_text() == f"{100 * row[f'share:{group}']:.1f}%"]
            box, text = bar.get_window_extent(renderer), label.get_window_extent(renderer)
            if group in outside:  # written next to the bar: right of its end, or under it
                assert text.x0 >= box.x1 if group == plots.GROUPS[-1] else text.y1 <= box.y0
                assert label.get_color() != "white"
            else:  # inside, with room to spare
                assert box.x0 < text.x0 and text.x1 < box.x1 and label.get_color() == "white"
        assert all(
            fig.bbox.x0 <= t.get_window_extent(renderer).x0 and t.get_window_extent(renderer).x1 <= fig.bbox.x1
            for t in ax.texts
        )  # the layout made room for a label right of the axes


BIG_COLUMNS = (
    "flops:total",
    "flops:linear",
    "flops:quadratic",
    "mem:peak",
    "mem:parameters",
    "mem:gradients",
    "mem:optimizer",
    "mem:activations",
    "mem:step_temporaries",
    "params",
    "measured:flops",
    "measured:peak",
)


@pytest.mark.slow
@pytest.mark.parametrize("columns", [("flops:total", "measured:flops"), BIG_COLUMNS], ids=["flops", "all"])
def test_plots_take_ints_beyond_int64(tmp_path, columns):
    # exact Python ints past int64 make pandas store object columns, which matplotlib cannot plot
    big = sweep_frame(models=("gpt2-small",), contexts=(512, 2048), measured_at=(512,))
    for col in columns:
        big[col] = pd.Series([None if pd.isna(v) else int(v) * 10**12 for v in big[col]], dtype=object, index=big.index)
    assert big["flops:total"].dtype == object and big["flops:total"].iloc[0] > 2**63
    paths = plots.plot_all(big, tmp_path / "big", budget_bytes=80 * 10**21, budget_label="80 ZB")
    assert len(paths) == 10
    _, fig = plots.plot_predicted_vs_measured(big, tmp_path / "pvm", return_fig=True)
    assert all("max |Δ| 1.00%" in legend_texts(ax.get_legend())[0] for ax in fig.axes)


def test_output_is_byte_reproducible(frame, tmp_path):
    first = plots.plot_memory_vs_context(frame, tmp_path / "a", model="gpt2-small")
    second = plots.plot_memory_vs_context(frame, tmp_path / "b", model="gpt2-small")
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]


def test_plot_all(tmp_path):
    tiny = sweep_frame(models=("gpt2-small",), contexts=(512, 2048), measured_at=(512,))
    paths = plots.plot_all(tiny, tmp_path / "out")  # context 1024 is not swept: the nearest one is used
    stems = [
        "flops_shares",
        "flops_vs_context",
        "memory_vs_context_gpt2-small",
        "model_comparison",
        "predicted_vs_measured",
    ]
    expected = sorted(f"{stem}.{ext}" for stem in stems for ext in ("png", "svg"))
    assert sorted(p.name for p in paths) == expected
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == expected  # and no temp files
    assert all(p.stat().st_size > 20_000 for p in paths)


def test_plot_all_skips_predicted_vs_measured_when_nothing_was_measured(tmp_path, run_cli):
    """Nothing measured: no predicted-vs-measured figure (it was written empty and listed), in plot_all
    and in what `sweep` says it wrote."""
    tiny = sweep_frame(models=("gpt2-small",), contexts=(512, 2048), measured_at=())
    paths = plots.plot_all(tiny, tmp_path / "out")
    assert paths and not any("predicted_vs_measured" in p.name for p in paths)
    assert not any("predicted_vs_measured" in p.name for p in (tmp_path / "out").iterdir())
    r = run_cli("sweep", "gpt2-small", "--contexts", "512,2048", "--out", tmp_path / "s")
    assert r.code == 0 and "wrote 11 files" in r.err and "predicted_vs_measured" not in r.err
    assert "largest context whose step peak fits the budget (--budget) at batch 1:" in r.out


@pytest.mark.skipif(PYPLOT_BEFORE, reason="another module imported pyplot before these tests")
def test_pyplot_never_imported(frame, tmp_path):
    plots.plot_model_comparison(frame, tmp_path / "cmp")  # figures render headless, no GUI backend
    assert "matplotlib.pyplot" not in sys.modules


def test_failed_write_leaves_old_file_and_no_temp(frame, tmp_path, monkeypatch):
    stem = tmp_path / "cmp"
    (tmp_path / "cmp.png").write_bytes(b"old")

    def broken(self, target, **kwargs):
        with open(target, "wb") as fh:
            fh.write(b"partial")
        raise RuntimeError("disk full")

    monkeypatch.setattr(Figure, "savefig", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        plots.plot_model_comparison(frame, stem)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cmp.png"]
    assert (tmp_path / "cmp.png").read_bytes() == b"old"


def test_missing_columns_are_named(frame, tmp_path):
    with pytest.raises(ValueError, match="share:ffn"):
        plots.plot_flops_shares(frame.drop(columns=["share:ffn"]), tmp_path / "x")
