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
    assert "largest swept context within 1 GiB: none fits (the shortest, 1k tokens, needs" in ax.get_title()
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_plot_all_skips_predicted_vs_measured_when_nothing_was_measured(tmp_path, run_cli):
    """Nothing measured: no predicted-vs-measured figure (it was written empty and listed), in plot_all
    and in what `sweep` says it wrote."""
    tiny = sweep_frame(models=("gpt2-small",), contexts=(512, 2048), measured_at=())
    paths = plots.plot_all(tiny, tmp_path / "out")
    assert paths and not any("predicted_vs_measured" in p.name for p in paths)
    assert not any("predicted_vs_measured" in p.name for p in (tmp_path / "out").iterdir())
    r = run_cli("sweep", "gpt2-small", "--contexts", "512,2048", "--out", tmp_path / "s")
    assert r.code == 0 and "wrote 11 files" in r.err and "predicted_vs_measured" not in r.err
    # the budget is memory's (h100-80gb's CUDA total 84,944,011,264 B − the 3 GB allowance), not a flat 80 GB
    assert "fits the budget of 81.944 GB (76.316 GiB) per GPU (--gpu, --allowance or --budget) at batch 1:" in r.out


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


# ---------------------------------------------------------------- every figure says what it assumes
SDPA_SELECTIVE_BF16_FUSED = "sdpa attention, selective checkpointing, bf16, AdamW fused"  # written by hand


def titles(fig) -> str:
    """Every title of a figure (its suptitle and each panel's), one string."""
    parts = [fig._suptitle.get_text()] if fig._suptitle is not None else []
    return "\n".join(parts + [ax.get_title() for ax in fig.axes])


@pytest.fixture(scope="module")
def bf16_frame():
    """A sweep under a setup that differs from the default in all four choices."""
    from lm_accounting.setup import TrainingSetup

    setup = TrainingSetup(attention="sdpa", checkpoint="selective", precision="bf16", optimizer="fused")
    return sweep([load_config("gpt2-small")], (256, 1024), setup=setup).to_frame()


@pytest.mark.slow
def test_every_sweep_figure_names_its_setup(bf16_frame, tmp_path):
    """Each sweep figure's title names the precision, attention, checkpointing and optimizer of the sweep
    (the FLOPs figures add that forward matmul FLOPs do not depend on them); none says the default's fp32."""
    frame = bf16_frame.assign(**{"measured:flops": bf16_frame["flops:total"], "measured:device": "meta"})
    figures = {
        "shares": plots.plot_flops_shares(frame, tmp_path / "s", return_fig=True)[1],
        "flops": plots.plot_flops_vs_context(frame, tmp_path / "f", return_fig=True)[1],
        "memory": plots.plot_memory_vs_context(frame, tmp_path / "m", model="gpt2-small", return_fig=True)[1],
        "measured": plots.plot_predicted_vs_measured(frame, tmp_path / "p", return_fig=True)[1],
        "comparison": plots.plot_model_comparison(frame, tmp_path / "c", context=1024, return_fig=True)[1],
    }
    for name, fig in figures.items():
        text = titles(fig)
        assert SDPA_SELECTIVE_BF16_FUSED in text, name
        assert "fp32" not in text and "naive" not in text, name
    for name in ("shares", "flops", "comparison"):
        assert "forward matmul FLOPs do not depend on it" in titles(figures[name])


def test_a_sweep_where_nothing_fits_says_none_fits(tmp_path):
    """gpt2-medium's fp32 model states alone are 16 bytes × 354,823,168 params > 5 GB: no context fits
    5 GB, and the figure, the table note and the markdown say "none fits", never "0 tokens"."""
    from lm_accounting.views.sweep import sweep_tables

    s = sweep([load_config("gpt2-medium")], (256, 512), budget=5 * 10**9)
    assert s.rows[0]["mem:max_context"] == 0
    _, fig = plots.plot_memory_vs_context(
        s.to_frame(), tmp_path / "m", model="gpt2-medium", budget_bytes=5 * 10**9, budget_label="5 GB", return_fig=True
    )
    title = fig.axes[0].get_title()
    assert title.endswith("\nlargest context within 5 GB: none fits (exact step model)")
    assert not any(line.get_marker() == "*" for line in fig.axes[0].lines)
    (note,) = sweep_tables(s)[0].notes
    assert note.endswith(": none fits") and "0 tokens" not in note


def test_setups_table_and_figure_are_written_from_the_setups(tmp_path):
    """The setups comparison names what its rows share (here bf16, fused AdamW) in the title and what
    tells them apart in each row; a setup where nothing fits says "none fits" in the table and legend."""
    from lm_accounting.setup import TrainingSetup
    from lm_accounting.views.setups import SetupRow, plot_setups, setup_table

    naive = TrainingSetup(attention="naive", precision="bf16", optimizer="fused").label
    full = TrainingSetup(attention="sdpa", checkpoint="full", precision="bf16", optimizer="fused").label
    rows = [
        SetupRow("m", naive, 1024, 9 * 10**9, 0),
        SetupRow("m", naive, 2048, 12 * 10**9, 0),
        SetupRow("m", full, 1024, 2 * 10**9, 1),
        SetupRow("m", full, 2048, 3 * 10**9, 1),
    ]
    table = setup_table(rows, "8 GB")
    assert table.title == "Peak memory of one training step (batch 1, bf16, AdamW fused), plain run on a CUDA GPU"
    assert [(r[1], r[-1]) for r in table.rows] == [
        ("naive attention, no checkpointing", "none fits"),
        ("sdpa attention, full checkpointing", "1"),
    ]
    assert table.notes[0].startswith("bf16: bf16 weights") and "amp-bf16" not in table.notes[0]
    _, fig = plot_setups(rows, tmp_path / "s", 8 * 10**9, "8 GB", return_fig=True)
    assert "batch 1, bf16, AdamW fused" in fig._suptitle.get_text()
    labels = legend_texts(fig.axes[0].get_legend())
    assert labels[:2] == ["naive attention, no checkpointing: none fits", "sdpa attention, full checkpointing: 1 token"]
    assert "budget 8 GB" in labels


def serving_records(fits=(93, 1, 0)):
    """Hand-made inference-report records: one model, the report's three lengths, two batches each."""
    from lm_accounting.views.infer_report import LENGTHS

    return [
        dict(
            model="m",
            prompt=P,
            generate=G,
            batch=b,
            tokens_per_s=100.0 * b,
            serving_peak_bytes=(10 + b) * 10**9,
            knee_batch=None,
            knee_tokens_per_s=None,
            max_batch_serving=fit,
            weights="int8",
            kv_dtype="fp8",
            attention="naive",
            budget_bytes=79_500_000_000,
        )
        for (P, G), fit in zip(LENGTHS, fits, strict=True)
        for b in (1, 2)
    ]


def test_serving_memory_figure_says_which_capacity_and_the_budget(tmp_path):
    """The inference memory figure: each 'at most N' is the sequences that fit prefilled one at a time and
    decoded together (in the legend's title), with the number in words ('1 sequence fits', 'none fits');
    the budget line carries the GPU and its value; the title names the dtypes and attention read from the records."""
    from lm_accounting.views.infer_report import plot_memory, plot_tokens_per_s

    records = serving_records()
    _, fig = plot_memory(records, tmp_path / "mem", return_fig=True)
    legend = fig.axes[0].get_legend()
    assert (
        legend.get_title().get_text()
        == "★ most sequences that fit: prompts prefilled one at a time, then decoded together"
    )
    assert legend_texts(legend) == [
        "P + G = 256: at most 93 sequences fit",
        "P + G = 2,560: at most 1 sequence fits",
        "P + G = 5,120: none fits",
        "NVIDIA H100 SXM 80GB = 79.5 GB budget",
    ]
    budget = line(fig.axes[0], "NVIDIA H100 SXM 80GB = 79.5 GB budget")
    assert budget.get_ydata()[0] == 79.5
    assert "int8 weights, fp8 KV cache, naive attention (engine program: last-token logits, paged KV cache)" in titles(
        fig
    )
    _, fig = plot_tokens_per_s(records, tmp_path / "tok", return_fig=True)
    assert "int8 weights, fp8 KV cache, naive attention" in titles(fig)
    assert legend_texts(fig.axes[0].get_legend())[2].endswith("no knee (memory-bound at every B); none fits")


def test_serving_capacity_is_the_one_at_a_time_prefill():
    """The capacity the figure calls 'prefilled one at a time' is infer's max_batch_serving, which for a long
    prompt is larger than the all-together max_batch (the prefill of B prompts at once holds B prompts' temporaries)."""
    from lm_accounting.analytic.inference_report import infer
    from lm_accounting.views.infer_report import GPU, rows

    cfg = load_config("llama-3-8b")
    record = next(r for r in rows([cfg]) if r["prompt"] == 4096 and r["batch"] == 1)
    analysed = infer(cfg, 4096, 1024, 1, gpu=GPU, budget=record["budget_bytes"], attention=record["attention"])
    assert record["max_batch_serving"] == analysed.max_batch_serving > analysed.max_batch


def test_memory_vs_gpus_labels_the_gpu_line_with_its_value(tmp_path):
    """The GPU line carries its value, and the title names the curves' setup (memory_vs_gpus's default)."""
    from lm_accounting.views.plan import plot_memory_vs_gpus

    curves = {"DDP": [(8, 90 * 10**9), (16, 90 * 10**9)], "FSDP2 ZeRO-3": [(8, 40 * 10**9), (16, 25 * 10**9)]}
    _, fig = plot_memory_vs_gpus(
        curves, 84_942_979_645, "m at S = 8,192", tmp_path / "g", memory_label="H100: CUDA total", return_fig=True
    )
    (ax,) = fig.axes
    assert legend_texts(ax.get_legend())[-1] == "H100: CUDA total = 84.9 GB"
    assert ax.get_title() == "m at S = 8,192\nsdpa attention, full checkpointing, amp-bf16, AdamW foreach"


def test_counts_are_in_words_by_number():
    from lm_accounting.views.words import fits_words, plural

    assert [plural(n, "step") for n in (0, 1, 2, 1000)] == ["0 steps", "1 step", "2 steps", "1,000 steps"]
    assert plural(1, "KV head") == "1 KV head" and plural(3, "index", "indices") == "3 indices"
    assert [fits_words(n) for n in (0, None, 1, 7214)] == ["none fits", "none fits", "1 token", "7,214 tokens"]


def test_views_count_by_number(run_cli, tmp_path):
    """A one-layer model with one KV head, trained one step at a one-token context: every count is singular."""
    cfg = tmp_path / "one.toml"
    cfg.write_text(
        "vocab_size = 97\ncontext_length = 64\nnum_layers = 1\nd_model = 24\nnum_heads = 4\nnum_kv_heads = 1\nd_ff = 40\n"
    )
    r = run_cli("account", cfg, "--context", "1")
    assert r.code == 0, r.err
    assert "· 1 layer ·" in r.out and "4 heads (1 KV head, GQA)" in r.out and "context 1 token" in r.out
    assert "all 1 layer + the rest" in r.out
    r = run_cli("train-time", cfg, "--steps", "1")
    assert r.code == 0, r.err
    assert "1 step ·" in r.out and "1 steps" not in r.out
    r = run_cli("infer", cfg, "--prompt", "4", "--generate", "2")  # one decode step
    assert r.code == 0, r.err
    assert "all 1 step " in r.out and "mean of 1 step," in r.out and "1 steps" not in r.out
