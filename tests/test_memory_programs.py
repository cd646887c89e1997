"""``memory`` on steps the op library predicts (GPT-2, Gemma, MLA/MoE, transformers' classes): the lines in B
at batch 1, the largest batch and context, and the header's word on a cuda figure."""

import json

import pytest

from lm_accounting import load_config, provenance
from lm_accounting.analytic import ops
from lm_accounting.analytic.capacity import PeakLine, PhasePeakLines, max_context_that_fits
from lm_accounting.analytic.program_report import program_account
from lm_accounting.setup import TrainingSetup

SMALL = dict(vocab_size=97, context_length=64, num_layers=2, d_model=32, num_heads=4, head_dim=8, d_ff=64)


def test_max_batch_walks_the_pieces_by_hand():
    """peak 10 at B = 1 (its own piece), then 4·B + 5 from B = 2: budget 20 fits B = 3 (17), not 4 (21); a
    budget of 12 fits B = 1 only (B = 2 needs 13); 9 fits nothing."""
    phase = PhasePeakLines("backward", (PeakLine(4, 6, 1, 1), PeakLine(4, 5, 2, None)), ())
    assert [phase.max_batch(budget) for budget in (20, 21, 12, 13, 9)] == [3, 4, 1, 2, 0]


@pytest.mark.parametrize("impl", ["course", "transformers"])
def test_lines_at_batch_one_equal_each_batch_replayed(impl):
    """The account's lines in B (from a replay exact for B >= 2 and one at B = 1) equal the step replayed at
    each batch itself, and the largest batch is the last one whose replayed peak fits."""
    cfg = load_config("openai-gpt2").with_context(64) if impl == "transformers" else load_config("gpt2-small")
    cfg = cfg if impl == "transformers" else cfg.with_context(64)
    setup = TrainingSetup()
    peaks = {b: ops.predict_step(cfg, 64, setup, impl=impl, batch=b, mode="plain").at(b).peak for b in range(1, 6)}
    budget = (peaks[3] + peaks[4]) // 2
    acc = program_account(cfg, 64, 1, impl=impl, setup=setup, budget=budget, device="meta")
    assert [acc.peak_lines.at(b) for b in range(1, 6)] == [peaks[b] for b in range(1, 6)]
    assert acc.step.peak == peaks[1] and acc.max_batch == 3


def test_a_learned_position_table_caps_the_largest_context():
    """GPT-2's 1,024 learned positions: the search stops there (a larger context is no model) and the view says
    so; a budget too small for 1,024 still searches below it."""
    cfg = load_config("openai-gpt2")
    assert cfg.max_position_embeddings == 1024
    setup = TrainingSetup()

    def at(run, s):
        return ops.predict_step(run, s, setup, impl="course", batch=1, mode="plain").at(1)

    assert max_context_that_fits(cfg, 10**13, predict=at) == 1024
    need = at(cfg.with_context(512), 512).peak
    assert max_context_that_fits(cfg, need, predict=at) == 512


def test_gpt2_memory_on_cuda_runs_and_names_the_position_limit(run_cli):
    r = run_cli("memory", "openai-gpt2", "--context", "1024")
    assert r.code == 0 and r.err == ""
    assert "every learned position" in r.out and "model states only" not in r.out


def test_a_transformers_step_on_cuda_is_called_exact_only_where_a_gpu_ran_it(run_cli, tmp_path, monkeypatch):
    """transformers' GPT-2 ran on an H100 and an H200 (provenance.HF_CUDA_RUNS): exact on both; an A100 has other
    kernels: not exact, and said.  Qwen2 ran on the H100 at stop 39: exact; with that run's record taken out, as for
    a program no GPU ran yet, not exact, and said."""
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps({"model_type": "gpt2", "vocab_size": 97, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64})
    )
    r = run_cli("memory", path)
    assert r.code == 0 and "exact prediction for cuda" in r.out and "(GPT2LMHeadModel, exact)" in r.out
    r = run_cli("memory", path, "--gpu", "a100-80gb")
    assert r.code == 0 and "exact prediction for cuda" not in r.out and "(GPT2LMHeadModel, exact)" not in r.out
    assert "prediction for cuda, not exact there" in r.out and "(GPT2LMHeadModel, not exact on cuda)" in r.out
    qwen2 = tmp_path / "qwen2.json"
    fields = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    qwen2.write_text(
        json.dumps({"model_type": "qwen2", **fields, "num_key_value_heads": 2, "max_position_embeddings": 64})
    )
    r = run_cli("memory", qwen2, "-S", "16")
    assert r.code == 0 and "(Qwen2ForCausalLM, exact)" in r.out
    runs = tuple((run, {a: kinds - {"qwen2"} for a, kinds in by.items()}) for run, by in provenance.HF_CUDA_RUNS)
    monkeypatch.setattr(provenance, "HF_CUDA_RUNS", runs)
    r = run_cli("memory", qwen2, "-S", "16")
    assert r.code == 0 and "(Qwen2ForCausalLM, not exact on cuda)" in r.out


def test_transformers_defaults_to_its_own_sdpa_and_names_eager_attention(run_cli, tmp_path):
    """A config.json runs transformers' code, whose default attention is sdpa (eager is opt-in: --attention naive,
    which the header calls by transformers' name, eager)."""
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps({"model_type": "gpt2", "vocab_size": 97, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64})
    )
    r = run_cli("memory", path, "--measure", "meta")
    assert r.code == 0 and "sdpa attention" in r.out and "sdpa+none+fp32+foreach" in r.out
    r = run_cli("memory", path, "--measure", "meta", "--attention", "naive")
    assert r.code == 0 and "eager attention" in r.out and "attention naive" not in r.out
    assert "exact prediction for meta" in r.out and "eager+none+fp32+foreach" in r.out
    r = run_cli("memory", path, "--impl", "course")  # our model keeps its own default
    assert r.code == 0 and "naive attention" in r.out


def test_a_mixture_of_experts_config_json_is_predicted_and_fp32_refused_on_meta(run_cli, tmp_path):
    """transformers' grouped_mm experts: the step is predicted; in fp32 the meta kernel cannot run them (bf16
    only), so ``--measure meta`` says so in one line, and in bf16 the measurement equals the prediction."""
    path = tmp_path / "config.json"
    moe = {"model_type": "mixtral", "vocab_size": 97, "hidden_size": 32, "intermediate_size": 64}
    path.write_text(
        json.dumps(
            {
                **moe,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "max_position_embeddings": 64,
                "num_local_experts": 4,
                "num_experts_per_tok": 2,
            }
        )
    )
    r = run_cli("memory", path, "-S", "32", "--measure", "meta", "--dtype", "fp32")
    assert r.code == 2 and "meta kernel takes bf16 weights only" in r.err and "\n" not in r.err.strip()
    r = run_cli("memory", path, "-S", "32", "--measure", "meta", "--dtype", "bf16", "--format", "json")
    assert r.code == 0, r.err
    out = json.loads(r.out)
    traced, measured = out["implementation_exact"]["step_traced"], out["measured"]
    assert measured["device"] == "meta" and measured["peak"] > 0
    assert {k: traced[k] for k in ("baseline", "peak", "forward", "backward", "optimizer_step")} == {
        k: measured[k] for k in ("baseline", "peak", "forward", "backward", "optimizer_step")
    }


def test_a_sweep_leaves_out_contexts_past_gpt2s_positions(run_cli, tmp_path):
    """GPT-2's 1,024 learned positions: 2,048 is left out for it (and said), 512 is swept; a sweep of nothing
    but contexts it cannot run is refused in one line."""
    r = run_cli("sweep", "openai-gpt2", "--contexts", "512,2048", "--out", tmp_path / "out")
    assert r.code == 0 and "openai-gpt2 at 2,048 tokens: beyond its 1,024 learned positions" in r.out
    rows = json.loads((tmp_path / "out" / "sweep.json").read_text())["rows"]
    assert [row["context"] for row in rows] == [512]
    refused = run_cli("sweep", "openai-gpt2", "--contexts", "2048", "--out", tmp_path / "none")
    assert refused.code == 2 and "exceeds the 1,024 learned positions" in refused.err


@pytest.mark.parametrize(
    "model_type, fields, refused",
    [
        ("qwen3", {"attention_dropout": 0.1}, "dropout of attention_dropout 0.1"),
        ("qwen3", {"attention_dropout": 0.0}, None),  # the class default: the program's
        ("gpt2", {"resid_pdrop": 0.0}, "dropout of resid_pdrop 0"),  # GPT-2's program applies 0.1
        ("gpt2", {"resid_pdrop": 0.1, "attn_pdrop": 0.1}, None),
    ],
)
def test_a_config_jsons_dropout_is_modelled_or_said(run_cli, tmp_path, model_type, fields, refused):
    """In training transformers applies a config.json's dropout and keeps its masks for the backward (hostile
    finding F19: a tiny Phi-3 saved 14% more with attention_dropout 0.1); the programs model GPT-2's 0.1 and every
    other family's 0, and say so for any other probability instead of predicting a step without it."""
    shapes = {
        "qwen3": dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=64),
        "gpt2": dict(vocab_size=97, n_embd=32, n_layer=2, n_head=4, n_positions=64),
    }[model_type]  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": model_type, **shapes, **fields}))
    r = run_cli("memory", path, "-S", "32")
    assert r.code == 0
    if refused is None:
        assert "model states only" not in r.out and "step peak" in r.out
    else:
        assert "model states only" in r.out and refused in r.out
        m = run_cli("memory", path, "-S", "32", "--measure", "meta")
        assert m.code == 2 and refused in m.err and len(m.err.strip().splitlines()) == 1
