"""The sweep under a training setup (issue 9): its rows are the memory command's figures for that
setup, checked against independent counts (the storage tracker on meta, FlopCounterMode), and the
CLI flags reach the rows."""

from __future__ import annotations

import csv
import io
import json

import pytest

from lm_accounting.analytic.memory_report import memory_account
from lm_accounting.analytic.replay import traced_minus_plain
from lm_accounting.config import AccountingError, apply_overrides, load_config
from lm_accounting.setup import TrainingSetup
from lm_accounting.sweep import sweep

TINY = "vocab_size = 2000\ncontext_length = 64\nnum_layers = 2\nd_model = 24\nnum_heads = 4\nd_ff = 40\n"
SDPA_FULL = TrainingSetup(attention="sdpa", checkpoint="full")


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


def test_sweep_peak_is_the_plain_run_of_the_setup(tiny):
    """sdpa + full checkpointing at S = 32, B = 4: the tracker on meta measures the traced run
    phase by phase; a plain run peaks lower by ``traced_minus_plain`` in each phase (the gather
    backward's out-of-place copy of the T·V·4-byte logits gradient, T = 128, V = 2,000: 1,024,000
    bytes), so the plain step peak is max over phases of (measured − gap)."""
    from lm_accounting.measure.memory import measure_step

    cfg = load_config(tiny)
    s = sweep([cfg], [32], 4, setup=SDPA_FULL, measure="meta")
    (row,) = s.rows
    assert row["setup"] == "sdpa+full+fp32+foreach" and s.setup == SDPA_FULL
    measured = measure_step(cfg.with_context(32), 32, 4, device="meta", setup=SDPA_FULL)
    gap = traced_minus_plain(cfg.with_context(32), 32, 4, setup=SDPA_FULL)
    assert gap["backward"] == 128 * 2000 * 4 == 1_024_000
    plain = max(measured.phase(name).peak - gap[name] for name in gap)
    assert row["mem:peak"] == plain
    assert row["measured:peak"] == measured.peak == row["mem:peak_traced"] and row["measured:run"] == "traced"
    assert row["mem:peak_traced"] - row["mem:peak"] > 0  # the two runs really differ here
    # the memory command's step (the plain run) for the same setup
    assert row["mem:peak"] == memory_account(cfg.with_context(32), 32, 4, setup=SDPA_FULL).step.peak


def test_sweep_setup_changes_states_activations_and_fit(tiny):
    cfg = load_config(tiny)
    naive = sweep([cfg], [64], 1, budget=6_000_000).rows[0]
    fused = sweep([cfg], [64], 1, setup=SDPA_FULL, budget=6_000_000).rows[0]
    amp = sweep([cfg], [64], 1, setup=TrainingSetup(precision="amp-bf16"), budget=6_000_000).rows[0]
    bf16 = sweep([cfg], [64], 1, dtype="bf16", budget=6_000_000).rows[0]
    n = naive["params"]
    # model states: fp32 parameters under fp32 and amp-bf16 (4 bytes each), bf16 under pure bf16
    assert naive["mem:parameters"] == amp["mem:parameters"] == 4 * n and bf16["mem:parameters"] == 2 * n
    assert amp["mem:optimizer"] == 8 * n and bf16["mem:optimizer"] == 4 * n
    # full checkpointing keeps each block's input only: far fewer saved bytes, a later fit
    assert fused["mem:activations"] < naive["mem:activations"]
    assert fused["mem:max_context"] > naive["mem:max_context"]


def test_sweep_max_context_is_exact_for_the_setup(tiny):
    """The largest context whose plain step fits: the tracker on meta (minus the traced−plain gap)
    puts it within the budget, one token more over it."""
    from lm_accounting.measure.memory import measure_step

    cfg = apply_overrides(load_config(tiny), {"context_length": 4096})
    budget = 3_000_000
    (row,) = sweep([cfg], [64], 1, setup=SDPA_FULL, budget=budget).rows
    best = row["mem:max_context"]
    assert 64 < best < 4096

    def plain_peak(seq):
        got = measure_step(cfg.with_context(seq), seq, 1, device="meta", setup=SDPA_FULL)
        gap = traced_minus_plain(cfg.with_context(seq), seq, 1, setup=SDPA_FULL)
        return max(got.phase(name).peak - gap[name] for name in gap)

    assert plain_peak(best) <= budget < plain_peak(best + 1)


def test_sweep_step_flops_are_flop_counter_over_a_checkpointed_step(tiny):
    """Model FLOPs = 3 × the forward FlopCounterMode counts; hardware FLOPs = FlopCounterMode over
    forward + backward with the full-checkpoint recompute and the fused attention backward."""
    from lm_accounting.measure.crosscheck import crosscheck

    cfg = load_config(tiny)
    (row,) = sweep([cfg], [32], 2, setup=SDPA_FULL, crosscheck=True).rows
    assert row["flops:model_step"] == 3 * row["measured:flops"]
    cc = crosscheck(cfg.with_context(32), 32, 2, backward=True, setup=SDPA_FULL)
    assert row["flops:hardware_step"] == cc.backward.total > row["flops:model_step"]


def test_sweep_setup_and_dtype_must_agree(tiny):
    cfg = load_config(tiny)
    with pytest.raises(AccountingError, match="contradicts"):
        sweep([cfg], [32], dtype="bf16", setup=TrainingSetup(precision="amp-bf16"))


def test_sweep_cli_flags_reach_the_rows(run_cli, tiny, tmp_path):
    args = ["--attention", "sdpa", "--checkpoint", "full", "--precision", "amp-bf16", "--batch", "2"]
    r = run_cli("sweep", tiny, "--contexts", "32", *args, "--out", tmp_path / "o", "--no-plots", "--format", "json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["schema"] == "lm-accounting/sweep/3"
    assert data["setup"]["label"] == "sdpa+full+amp-bf16+foreach" and data["dtype"] == "fp32"
    (row,) = data["rows"]
    assert row["setup"] == "sdpa+full+amp-bf16+foreach"
    m = run_cli("memory", tiny, "--context", "32", *args, "--format", "json")
    assert m.code == 0, m.err
    mem = json.loads(m.out)["implementation_exact"]
    assert row["mem:peak"] == mem["step"]["peak"] and row["mem:peak_traced"] == mem["step_traced"]["peak"]
    # --dtype is the shorthand for pure precision, as in `memory`
    r = run_cli("sweep", tiny, "--contexts", "32", "--dtype", "bf16", "--out", tmp_path / "b", "--no-plots")
    assert r.code == 0, r.err
    assert "naive attention, checkpoint none, bf16, AdamW foreach" in r.out


@pytest.mark.parametrize(
    "flags", [("--dtype", "bf16", "--precision", "amp-bf16"), ("--dtype", "fp32", "--precision", "bf16")]
)
def test_sweep_cli_contradicting_dtype_is_one_line(run_cli, tiny, tmp_path, flags):
    r = run_cli("sweep", tiny, "--contexts", "32", *flags, "--out", tmp_path / "o", "--no-plots")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "contradicts" in r.err
    assert not (tmp_path / "o").exists()


def test_memory_capacity_follows_the_setup(run_cli, tiny):
    """Capacity planning under sdpa + full checkpointing: a larger batch and context fit the same budget
    than with naive attention; the tracker (minus the traced−plain gap) confirms the batch edge."""
    from lm_accounting.measure.memory import measure_step

    def capacity(*flags):
        r = run_cli("memory", tiny, "--context", "64", "--budget", "6MB", *flags, "--format", "json")
        assert r.code == 0, r.err
        exact = json.loads(r.out)["implementation_exact"]
        return exact["max_batch"], exact["max_context_at_batch_1"]

    naive = capacity()
    fused = capacity("--attention", "sdpa", "--checkpoint", "full")
    assert fused[0] > naive[0] >= 1 and fused[1] > naive[1]
    cfg = load_config(tiny)

    def plain_peak(batch):
        got = measure_step(cfg, 64, batch, device="meta", setup=SDPA_FULL)
        gap = traced_minus_plain(cfg, 64, batch, setup=SDPA_FULL)
        return max(got.phase(name).peak - gap[name] for name in gap)

    assert plain_peak(fused[0]) <= 6_000_000 < plain_peak(fused[0] + 1)


@pytest.mark.slow  # two figures written as PNG and SVG: ~10 s on a loaded 2-core machine
def test_plots_name_the_setup_and_compare_the_tracker_with_the_traced_run(tiny, tmp_path):
    from lm_accounting.views import plots

    cfg = load_config(tiny)
    frame = sweep([cfg], [16, 32], 4, setup=SDPA_FULL, measure="meta").to_frame()
    _, fig = plots.plot_memory_vs_context(frame, tmp_path / "m", model=cfg.name, return_fig=True)
    assert "sdpa attention, full checkpointing, fp32, AdamW foreach" in fig.axes[0].get_title()
    _, fig = plots.plot_predicted_vs_measured(frame, tmp_path / "p", return_fig=True)
    assert "sdpa attention, full checkpointing" in fig.get_suptitle()
    memory = fig.axes[1]
    line, dots = memory.lines[0], memory.lines[1]  # the analytic line, then the measured markers
    assert list(line.get_ydata()) == pytest.approx(list(frame["mem:peak_traced"] / 1e9))
    assert list(dots.get_ydata()) == pytest.approx(list(frame["measured:peak"] / 1e9))
    assert "traced-run" in memory.get_ylabel()


def test_sweep_csv_is_tidy_records(run_cli, tiny, tmp_path):
    """sweep.csv (and --format csv) is tidy like every other command's CSV: one fact per row, the same
    columns on every row, each value with its unit; every sweep.json column is a row.  Hand counts for
    the tiny model (V 2,000, d 24, 2 layers, 4 heads, d_ff 40, untied, no biases):
    parameters = 2·V·d + L·(4·d² + 3·d·d_ff + 2·d) + d = 96,000 + 2·5,232 + 24 = 106,488;
    forward FLOPs at S = 16 = 2·S·(L·(4·d² + 3·d·d_ff) + d·V) + L·4·S²·d = 1,867,776 + 49,152."""
    out = tmp_path / "o"
    r = run_cli("sweep", tiny, "gpt2-small", "--contexts", "16,32", "--out", out, "--no-plots", "--format", "csv")
    assert r.code == 0, r.err
    text = (out / "sweep.csv").read_text()
    assert r.out == text
    assert text.splitlines()[0] == "model,context,batch,setup,quantity,value,unit"
    rows = list(csv.DictReader(io.StringIO(text)))
    assert all(len(row) == 7 and None not in row and None not in row.values() for row in rows)
    fact = {(x["model"], int(x["context"]), x["quantity"]): (x["value"], x["unit"]) for x in rows}
    assert len(fact) == len(rows)  # one row per (point, quantity)
    wide = json.loads((out / "sweep.json").read_text())["rows"]
    points = [(w["model"], w["context"]) for w in wide]
    assert points == [(m, s) for m in ("tiny", "gpt2-small") for s in (16, 32)]
    for w in wide:
        quantities = {q for (m, s, q) in fact if (m, s) == (w["model"], w["context"])}
        assert quantities == set(w) - {"model", "context", "batch", "setup"}
    assert fact["tiny", 16, "params"] == ("106488", "params")
    assert fact["tiny", 16, "flops:total"] == (str(1_867_776 + 49_152), "FLOPs")
    for name, seq in points:
        cfg = load_config(tiny if name == "tiny" else name).with_context(seq)
        assert fact[name, seq, "mem:peak"] == (str(memory_account(cfg, seq, 1).step.peak), "bytes")
        assert fact[name, seq, "share:ffn"][1] == "share" and fact[name, seq, "mem:max_context"][1] == "tokens"
        assert fact[name, seq, "measured:peak"] == ("", "bytes")  # not measured: an empty value, not a missing row


def test_sweep_predicts_for_cuda_unless_it_measures_on_meta(tiny):
    """The plain columns are the memory command's: for a CUDA GPU by default (fp32 sdpa: the
    memory-efficient kernel, whose merged heads are a view), for meta when the sweep measures there;
    fp32 fused attention with grouped KV heads has no CUDA kernel and is refused."""
    cfg = load_config(tiny)
    setup = TrainingSetup(attention="sdpa")
    (cuda,) = sweep([cfg], [32], 4, setup=setup).rows
    assert cuda["mem:peak"] == memory_account(cfg.with_context(32), 32, 4, setup=setup, device="cuda").step.peak
    assert cuda["mem:peak"] != memory_account(cfg.with_context(32), 32, 4, setup=setup).step.peak
    gqa = apply_overrides(cfg, {"num_kv_heads": 2})
    with pytest.raises(AccountingError, match="no CUDA kernel"):
        sweep([gqa], [32], 1, setup=setup)
    assert sweep([gqa], [32], 1, setup=setup, measure="meta").rows[0]["mem:peak"] > 0


def test_sweep_measures_a_moe_context_whose_split_varies_with_the_batch():
    """E = 6, k = 2 at S = 7: 14 slots, no lines in B.  The sweep printed the peak there but refused
    --measure-memory ('needs the step replay'), though memory --measure takes it; now the measured
    step is the tracker's, equal to mem:peak_traced, and memory_account agrees on the plain peak."""
    from lm_accounting.config import ModelConfig

    cfg = ModelConfig(
        vocab_size=1000, context_length=64, num_layers=3, d_model=64, num_heads=4, num_kv_heads=2, d_ff=96,
        num_experts=6, experts_per_token=2, expert_d_ff=32, name="tiny-moe",
    )  # fmt: skip
    (row,) = sweep([cfg], [7], 2, measure="meta").rows
    assert row["measured:peak"] == row["mem:peak_traced"] and row["measured:run"] == "traced"
    assert row["mem:peak"] == memory_account(cfg.with_context(7), 7, 2, device="meta").step.peak
