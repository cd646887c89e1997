"""``--impl course|transformers|torchtitan`` on ``memory``: the default for each input, the header and the
JSON naming the implementation, and every refusal (one line, exit 2, before anything is built)."""

import json

import pytest

from lm_accounting.analytic.program_report import program_unsupported
from lm_accounting.commands import memory
from lm_accounting.config import AccountingError, load_config
from lm_accounting.implementations import default_impl
from lm_accounting.setup import TrainingSetup

LLAMA_MINI = {  # a Llama config.json as transformers writes one (model_type picks LlamaForCausalLM)
    "model_type": "llama",
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}
TOML = "vocab_size = 128\ncontext_length = 64\nnum_layers = 2\nd_model = 64\nnum_heads = 4\nd_ff = 96\n"
IMPLEMENTATION_KEYS = {"name", "model_class", "library", "extra", "program", "predicted_by"}


@pytest.fixture
def config_json(tmp_path):
    path = tmp_path / "llama-mini" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(LLAMA_MINI))
    return path


def memory_json(run_cli, *args):
    r = run_cli("memory", *args, "--format", "json")
    assert r.code == 0, r.err
    return json.loads(r.out)


def one_line_exit_2(r, message):
    lines = r.err.strip().splitlines()
    assert r.code == 2 and len(lines) == 1 and lines[0].startswith("lm-account: error: "), r.err
    assert message in lines[0] and "Traceback" not in r.err and r.out == "", r.err


# -- the default: what a user bringing that input most likely runs ------------------------------------------


def test_default_rule_from_the_argument_alone(tmp_path):
    assert default_impl("gpt2-small") == "course"
    assert default_impl("llama-3-8b") == "course"  # a preset of a published model is still our preset
    assert default_impl("configs/big.toml") == "course"
    assert default_impl("meta-llama/config.json") == "transformers"
    assert default_impl(tmp_path / "CONFIG.JSON") == "transformers"
    assert default_impl("meta-llama/config.json", layout=True) == "course"  # the one a layout models


def test_a_preset_defaults_to_course_and_a_config_json_to_transformers(run_cli, config_json, tmp_path):
    preset = memory_json(run_cli, "gpt2-small", "-S", "64")
    assert preset["schema"] == "lm-accounting/memory/8"
    assert set(preset["implementation"]) == IMPLEMENTATION_KEYS
    assert preset["implementation"]["name"] == "course" and preset["implementation"]["library"] is None
    assert preset["implementation"]["model_class"] == "TransformerLM"
    assert preset["implementation"]["predicted_by"] == "replay"  # the legacy replay still models the course's model
    hf = memory_json(run_cli, config_json, "-S", "32")
    assert hf["implementation"]["name"] == "transformers" and hf["implementation"]["library"] == "transformers"
    assert hf["implementation"]["model_class"] == "LlamaForCausalLM" and hf["implementation"]["extra"] == "hf"
    toml = tmp_path / "mini.toml"
    toml.write_text(TOML)
    assert memory_json(run_cli, toml)["implementation"]["name"] == "course"
    # --impl course on the config.json: our model of the same shape, which the legacy replay predicts
    course = memory_json(run_cli, config_json, "-S", "32", "--impl", "course")
    assert course["implementation"]["name"] == "course" and course["implementation_exact"]["step"] is not None


def test_under_a_layout_the_default_is_course_and_says_so(run_cli, config_json):
    data = memory_json(run_cli, config_json, "-S", "32", "--dp", "2", "--zero", "3")
    assert data["schema"] == "lm-accounting/parallel-memory/7" and data["implementation"]["name"] == "course"
    text = run_cli("memory", config_json, "-S", "32", "--dp", "2", "--zero", "3").out
    assert "--impl course: our TransformerLM (lm_accounting.model), naive attention" in text
    assert "the default under a layout; --impl transformers covers DDP, ZeRO-1 and FSDP2 data parallel" in text


# -- the header names the implementation and its program -----------------------------------------------------


@pytest.mark.parametrize(
    ("attention", "words"),
    [("naive", "eager attention"), ("sdpa", "sdpa attention")],  # transformers' names: eager is our naive
)
def test_the_header_names_transformers_class_and_attention(run_cli, config_json, attention, words):
    r = run_cli("memory", config_json, "-S", "32", "--attention", attention, "--precision", "bf16")
    assert r.code == 0, r.err
    header = r.out.split("\n\n")[0]
    assert f"--impl transformers: transformers 5.24 LlamaForCausalLM, training mode, {words}" in header
    bf16 = ("--precision", "bf16")  # fp32 with grouped KV heads has no fused CUDA kernel
    program = memory_json(run_cli, config_json, "-S", "32", "--attention", attention, *bf16)["implementation"][
        "program"
    ]
    assert program == f"transformers 5.24 LlamaForCausalLM, training mode, {words}"


def test_the_header_names_our_model_for_a_preset(run_cli):
    r = run_cli("memory", "gpt2-small", "-S", "64")
    assert r.code == 0, r.err
    assert "--impl course: our TransformerLM (lm_accounting.model), naive attention" in r.out.split("\n\n")[0]


def test_deepseek_v3_under_transformers_is_predicted_eager_and_sdpa(run_cli):
    """deepseek-v3 (latent attention) under --impl transformers: the op library's DeepseekV3ForCausalLM predicts
    the eager and the sdpa step (cuDNN attention with a value head unlike the query/key head; both measured on an
    H200, reports/cuda-h200).  A type no program models keeps model states only: test_exactness_labels.py's
    phimoe without its program."""
    setup = TrainingSetup(attention="naive")
    assert program_unsupported(load_config("deepseek-v3").with_context(1024), setup, "transformers") == []
    data = memory_json(run_cli, "deepseek-v3", "-S", "1024", "--impl", "transformers", "--attention", "naive")
    assert data["implementation"]["model_class"] == "DeepseekV3ForCausalLM"
    assert data["implementation"]["predicted_by"] == "ops" and data["implementation_exact"]["step"] is not None
    # 671B parameters' fp32 model states: 16 bytes per parameter, far over the H100's budget
    assert data["implementation_exact"]["fits_budget"] is False
    sdpa = memory_json(run_cli, "deepseek-v3", "-S", "1024", "--impl", "transformers", "--attention", "sdpa")
    assert sdpa["implementation_exact"]["step"] is not None and sdpa["implementation_exact"]["exact"] is True
    assert "reports/cuda-h200/hf_memory.csv" in sdpa["implementation_exact"]["exactness"]


# -- refusals: one line, exit 2, before anything is built ---------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["gpt2-small", "--impl", "transformers"],
            "gpt2-small is the course's model; transformers has no class for it",
        ),
        (["gpt2-xl", "--impl", "transformers", "--measure", "meta"], "transformers has no class for it"),
        (["openai-gpt2", "--impl", "torchtitan"], "torchtitan ships deepseek_v3, llama3, qwen3 only"),
        (["mistral-7b", "--impl", "torchtitan"], "torchtitan ships deepseek_v3, llama3, qwen3 only"),
        (["gpt2-small", "--impl", "torchtitan"], "gpt2-small is none of them"),
        (["qwen3-0.6b", "--impl", "torchtitan"], "torchtitan 0.3.0 installs against torch 2.13"),
        (["llama-3-8b", "--impl", "transformers", "--dp", "8", "--zero", "1", "--tp", "2"], "run alone"),
        (["llama-3-8b", "--impl", "transformers", "--tp", "2", "--sp"], "no sequence parallel"),
        (["openai-gpt2", "--impl", "transformers", "--tp", "2"], "tensor parallel over transformers' gpt2"),
        (["llama-3-8b", "--impl", "transformers", "--tp", "8", "--measure", "meta"], "TP runs on real tensors only"),
        (["gpt2-small", "--impl", "nosuch"], "Invalid value for '--impl'"),
    ],
)
def test_an_implementation_the_input_cannot_have_is_refused(run_cli, args, message):
    one_line_exit_2(run_cli("memory", *args), message)


def test_measure_with_a_library_that_is_not_installed_names_the_extra(run_cli, config_json, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name, *a)
    )
    r = run_cli("memory", config_json, "-S", "32", "--measure", "meta")
    one_line_exit_2(r, 'transformers is not installed: pip install "lm-accounting[hf]"')
    # the analytic prediction needs no library: the same input without --measure answers
    assert run_cli("memory", config_json, "-S", "32").code == 0


def test_refusals_happen_when_the_request_is_made(config_json):
    """The command layer's contract: ``memory.Request`` refuses before ``run`` or ``measure`` builds anything."""
    with pytest.raises(AccountingError, match="transformers has no class for it"):
        memory.Request(load_config("gpt2-small"), 64, impl="transformers")
    with pytest.raises(AccountingError, match="unknown --impl 'hf'"):
        memory.Request(load_config("gpt2-small"), 64, impl="hf")
    request = memory.Request(load_config(config_json), 32, impl="transformers")
    assert request.impl == "transformers"
    assert memory.Request(load_config(config_json), 32).impl == "course"  # the Python API names what it wants


def test_measure_transformers_compares_every_phase_or_says_what_is_missing(run_cli, config_json):
    """--measure meta --impl transformers builds transformers' own LlamaForCausalLM on meta and sets it beside
    the prediction phase by phase; until the transformers program models the config, one line says so."""
    cfg = load_config(config_json).with_context(16)
    missing = program_unsupported(cfg, TrainingSetup(), "transformers")
    r = run_cli("memory", config_json, "-S", "16", "-B", "2", "--measure", "meta", "--format", "json")
    if missing:
        one_line_exit_2(r, "--measure needs the transformers program, which does not model")
        return
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["measured"]["device"] == "meta" and data["measured"]["compared_with"] == "step_traced"
    for phase in ("forward", "backward", "optimizer_step"):
        assert data["measured"][phase] == data["implementation_exact"]["step_traced"][phase], phase


# -- the op library's path, with a stand-in program ---------------------------------------------------------


@pytest.fixture
def replay_as_program(monkeypatch):
    """``ops.predict_step``/``ops.unsupported`` stood in by the legacy replay of our own model (the op library's
    course program must equal it), so the op-library path of ``memory`` can be checked without the programs."""
    from lm_accounting.analytic import ops
    from lm_accounting.analytic.replay import replay_training_step, replay_unsupported

    def predict_step(cfg, seq, setup, *, impl, batch=1, mode="traced", device="meta"):
        return replay_training_step(cfg, seq, device=device, setup=setup, mode=mode)

    monkeypatch.setattr(ops, "predict_step", predict_step, raising=False)
    monkeypatch.setattr(ops, "unsupported", lambda cfg, setup, impl: replay_unsupported(cfg, setup), raising=False)


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_the_op_library_path_gives_the_replays_figures_for_the_same_step(replay_as_program, config_json, device):
    """Given the same step (the stand-in), the op-library account prints the replay's figures: the step at B,
    the traced run, the traced − plain gap, the peak lines, the largest batch and context."""
    from lm_accounting.analytic.memory_report import memory_account
    from lm_accounting.analytic.program_report import implementation_account

    cfg, setup = load_config(config_json).with_context(32), TrainingSetup(attention="sdpa", precision="amp-bf16")
    budget = 3_000_000  # bytes: a few sequences of this mini model, so the largest batch and context are small
    got = implementation_account(cfg, 32, 3, impl="transformers", setup=setup, budget=budget, device=device)
    want = memory_account(cfg, 32, 3, budget=budget, device=device, setup=setup)
    assert got.predicted_by == "ops" and got.impl == "transformers" and want.predicted_by == "replay"
    assert got.step == want.step and got.step_traced == want.step_traced and got.peak_lines == want.peak_lines
    assert 0 < got.max_batch == want.max_batch and 0 < got.max_context == want.max_context
    assert got.states == want.states and got.step_counters == want.step_counters
    assert got.saved is None and got.not_modelled == [] and got.no_lines is None
    if device == "meta":  # the replay's gap is the meta run's (on cpu it adds the allocator's own extras)
        assert got.gap == want.gap


def test_the_op_library_path_renders_and_names_the_class(replay_as_program, run_cli, config_json):
    r = run_cli("memory", config_json, "-S", "32", "-B", "2")
    assert r.code == 0, r.err
    # eager Llama on cuda: an H200 ran transformers' own LlamaForCausalLM (provenance.HF_CUDA_RUNS)
    assert "This implementation (LlamaForCausalLM, exact): training step by phase at B = 2" in r.out
    assert "analytic/ops" in r.out and "reports/cuda-h200/hf_memory.csv" in r.out
    data = memory_json(run_cli, config_json, "-S", "32", "-B", "2")
    assert data["implementation"]["predicted_by"] == "ops" and data["implementation_exact"]["activations"] is None
    assert "LlamaForCausalLM" in data["implementation_exact"]["assumptions"]


# -- sweep: each model's implementation, the same rule ------------------------------------------------------


def test_sweep_names_each_models_implementation(run_cli, config_json, tmp_path):
    out = tmp_path / "sweep"
    r = run_cli("sweep", "gpt2-small", config_json, "--contexts", "32", "--no-plots", "--out", out)
    assert r.code == 0, r.err
    data = json.loads((out / "sweep.json").read_text())
    assert data["schema"] == "lm-accounting/sweep/3"
    assert {row["model"]: row["impl"] for row in data["rows"]} == {"gpt2-small": "course", "llama-mini": "transformers"}
    assert "llama-mini (78,144 parameters), --impl transformers, batch 1" in r.out
    # 78,144 by hand: embedding and untied head 2·128·64 = 16,384; per layer q, o 2·64·64, k, v 2·64·32, SwiGLU
    # 3·64·96, two norms 2·64: 30,848, twice 61,696; final norm 64


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["gpt2-small", "--impl", "transformers"], "transformers has no class for it"),
        (["qwen3-0.6b", "--impl", "torchtitan"], "torchtitan 0.3.0 installs against torch 2.13"),
    ],
)
def test_sweep_refuses_before_writing(run_cli, tmp_path, args, message):
    out = tmp_path / "sweep"
    one_line_exit_2(run_cli("sweep", *args, "--contexts", "32", "--no-plots", "--out", out), message)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_sweep_measure_without_the_library_names_the_extra(run_cli, config_json, tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name, *a)
    )
    out = tmp_path / "sweep"
    r = run_cli("sweep", config_json, "--contexts", "32", "--measure-memory", "meta", "--no-plots", "--out", out)
    one_line_exit_2(r, 'pip install "lm-accounting[hf]"')
    assert not out.exists()


def test_sweep_memory_columns_come_from_the_implementations_predictor(replay_as_program, config_json, tmp_path):
    """With the stand-in program (the replay), the transformers row's step columns are that step's figures."""
    from lm_accounting.analytic.replay import predict_training_step
    from lm_accounting.sweep import sweep

    cfg = load_config(config_json)
    got = sweep([cfg], [32], 2, budget=3_000_000, impls=["transformers"]).rows[0]
    run = cfg.with_context(32)
    plain = predict_training_step(run, 32, 2, setup=TrainingSetup(optimizer="foreach"), device="cuda")
    traced = predict_training_step(run, 32, 2, setup=TrainingSetup(optimizer="foreach"), mode="traced")
    assert got["impl"] == "transformers" and got["mem:peak"] == plain.peak and got["mem:peak_traced"] == traced.peak
    assert got["mem:activations"] is None and got["mem:max_context"] > 0
