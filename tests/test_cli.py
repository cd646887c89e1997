"""The CLI as a user types it: headline numbers, formats, overrides, and every bad input."""

import csv
import difflib
import io
import json
import subprocess
import sys

import pytest


def test_headline_table(run_cli):
    r = run_cli("gpt2-xl", "--context", 16384)
    assert r.code == 0 and r.err == ""
    assert "2,127,057,600" in r.out
    assert "149,522,795,724,800" in r.out
    assert "attention QKᵀ+AV 55.15%" in r.out
    assert "Conventions:" in r.out and "GiB = 2^30" in r.out


def test_default_context_is_preset(run_cli):
    r = run_cli("gpt2-xl")
    assert "4,513,336,524,800" in r.out and "context 1,024 tokens" in r.out


def test_json_is_exact(run_cli):
    data = json.loads(run_cli("gpt2-xl", "--format", "json").out)
    assert data["parameters"]["total"] == 2_127_057_600
    assert data["forward_flops"]["total"] == 4_513_336_524_800
    assert data["forward_flops"]["per_layer_total"] == 90_596_966_400
    by_key = {c["key"]: c for c in data["forward_flops"]["components"]}
    assert by_key["lm_head"]["total"] == 164_682_137_600
    assert data["training_step_flops"]["step"] == 3 * 4_513_336_524_800
    assert data["config"]["head_dim"] == 64 and data["config"]["num_kv_heads"] == 25


def test_batch_scales_json(run_cli):
    one = json.loads(run_cli("gpt2-small", "--format", "json").out)
    four = json.loads(run_cli("gpt2-small", "-B", 4, "--format", "json").out)
    assert four["forward_flops"]["total"] == 4 * one["forward_flops"]["total"]
    assert four["kv_cache_bytes"]["bf16"] == 4 * one["kv_cache_bytes"]["bf16"]


def test_csv_and_markdown(run_cli):
    rows = list(csv.DictReader(io.StringIO(run_cli("gpt2-xl", "--format", "csv").out)))
    fwd = [r for r in rows if r["section"] == "forward_flops"]
    assert sum(int(r["total"]) for r in fwd) == 4_513_336_524_800
    params = [r for r in rows if r["section"] == "parameters"]
    assert sum(int(r["total"]) for r in params) == 2_127_057_600
    md = run_cli("gpt2-xl", "--format", "markdown").out
    assert (
        "| key | component | per layer | total | share |" in md and "| lm_head | LM head | - | 164,682,137,600 |" in md
    )


def test_llama_headline(run_cli):
    r = run_cli("llama-3-8b")
    assert r.code == 0 and "8,030,261,248" in r.out and "8 KV heads, GQA" in r.out


def test_presets_listing(run_cli):
    out = run_cli("presets").out
    for name, n in (
        ("gpt2-small", "190,460,160"),
        ("gpt2-xl", "2,127,057,600"),
        ("llama-3-8b", "8,030,261,248"),
        ("qwen3-0.6b", "596,049,920"),
    ):
        line = next(l for l in out.splitlines() if l.strip().startswith(name))
        assert line.rstrip().endswith(n)
    data = json.loads(run_cli("presets", "--format", "json").out)
    assert {p["name"] for p in data["presets"]} == {
        "gpt2-small",
        "gpt2-medium",
        "gpt2-large",
        "gpt2-xl",
        "llama-3-8b",
        "qwen3-0.6b",
        "openai-gpt2",
        "openai-gpt2-medium",
        "openai-gpt2-large",
        "openai-gpt2-xl",
        "llama-3.1-8b",
        "llama-3.1-70b",
        "llama-3.1-405b",
        "qwen3-8b",
        "qwen3-32b",
        "mistral-7b",
        "mixtral-8x7b",
        "deepseek-v3",
        "qwen3-30b-a3b",
        "gpt-oss-20b",
        "gpt-oss-120b",
        "qwen1.5-moe-a2.7b",
        "qwen3-next-80b-a3b",
        "qwen3.5-35b-a3b",
    }
    by_name = {p["name"]: p for p in data["presets"]}
    # Mixtral: 32·(8·3·4096·14336 experts + 4096·8 router + 2·4096²·(1 + 1/4) attention + 2·4096 norms)
    #          + 2·32000·4096 + 4096; active: 6 of the 8 experts idle per token
    experts = 3 * 4096 * 14336
    attention = 2 * 4096 * 4096 + 2 * 4096 * 1024
    mixtral = 32 * (8 * experts + 4096 * 8 + attention + 2 * 4096) + 2 * 32000 * 4096 + 4096
    assert by_name["mixtral-8x7b"]["parameters"] == mixtral == 46_702_792_704
    assert by_name["mixtral-8x7b"]["active_parameters"] == mixtral - 32 * 6 * experts == 12_879_925_248
    assert by_name["gpt2-xl"]["active_parameters"] == 2_127_057_600


def test_overrides_and_user_file(run_cli, tmp_path):
    base = json.loads(run_cli("gpt2-xl", "--format", "json").out)
    r = json.loads(run_cli("gpt2-xl", "--set", "d_ff=4288", "--format", "json").out)
    assert base["parameters"]["total"] - r["parameters"]["total"] == 48 * 3 * 1600 * (6400 - 4288)
    r2 = json.loads(run_cli("gpt2-xl", "--d-ff", 4288, "--format", "json").out)
    assert r2["parameters"]["total"] == r["parameters"]["total"]
    r3 = json.loads(run_cli("gpt2-xl", "--d-model", 1280, "--heads", 20, "--format", "json").out)
    assert r3["config"]["head_dim"] == 64  # re-derived from the new d_model, not kept stale
    f = tmp_path / "tiny.toml"
    f.write_text("vocab_size = 100\ncontext_length = 16\nnum_layers = 2\nd_model = 8\nnum_heads = 2\nd_ff = 16\n")
    tiny = json.loads(run_cli(f, "--format", "json").out)
    assert tiny["config"]["name"] == "tiny"
    assert tiny["parameters"]["total"] == 2 * 100 * 8 + 2 * (4 * 64 + 3 * 8 * 16 + 16) + 8


def write(tmp_path, text, name="model.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


GOOD = "vocab_size = 100\ncontext_length = 16\nnum_layers = 2\nd_model = 8\nnum_heads = 2\nd_ff = 16\n"

BAD_INPUTS = [
    (
        ["gpt2-xll"],
        ["'gpt2-xll' is neither a command nor a preset", "did you mean 'gpt2-xl'", "gpt2-small", "qwen3-0.6b"],
    ),
    (["memroy", "gpt2-xl"], ["'memroy' is neither a command nor a preset", "did you mean 'memory'"]),
    (
        ["nosuch"],
        ["'nosuch' is neither a command nor a preset (presets: ", "Hugging Face config.json", "./config.json"],
    ),
    (["llama3-8b"], ["did you mean 'llama-3-8b'", "config.json"]),
    (["infer", "nosuch", "-P", "5", "-G", "5"], ["unknown preset 'nosuch'", "config.json"]),
    (["account", "gpt2-xll"], ["unknown preset 'gpt2-xll'", "did you mean 'gpt2-xl'"]),
    (["gpt2-xl", "--context", "0"], ["--context", "positive integer"]),
    (["gpt2-xl", "--context", "-5"], ["--context", "positive integer"]),
    (["gpt2-xl", "--context", "1.5"], ["--context", "positive integer"]),
    (["gpt2-xl", "--context", "abc"], ["--context", "positive integer"]),
    (["gpt2-xl", "--batch", "0"], ["--batch", "positive integer"]),
    (["gpt2-xl", "--batch", "two"], ["--batch", "positive integer"]),
    (["gpt2-xl", "--heads", "7"], ["d_model=1600 is not divisible by num_heads=7", "head_dim"]),
    (["gpt2-xl", "--kv-heads", "7"], ["num_heads=25 is not divisible by num_kv_heads=7"]),
    (["gpt2-xl", "--set", "head_dim=63"], ["head_dim=63 is odd", "RoPE"]),
    (["gpt2-xl", "--d-ff", "0"], ["--d-ff", "must be a positive integer"]),
    (["gpt2-xl", "--set", "num_layers=-3"], ["num_layers must be positive"]),
    (["gpt2-xl", "--set", "bogus=3"], ["unknown key 'bogus'"]),
    (["gpt2-xl", "--set", "d_ff"], ["key=value"]),
    (["gpt2-xl", "--set", "d_ff=big"], ["'d_ff' must be int"]),
    (["gpt2-xl", "--format", "xml"], ["--format"]),
    (["no/such/file.toml"], ["no/such/file.toml", "no such file"]),
]


@pytest.mark.parametrize("args,needles", BAD_INPUTS)
def test_bad_input_is_one_line_exit_2(run_cli, args, needles):
    r = run_cli(*args)
    assert r.code == 2
    assert r.out == ""
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lm-account: error: ")
    for needle in needles:
        assert needle in lines[0]


BAD_FILES = [
    ("vocab_size = [\n", ["malformed TOML"]),
    (GOOD + "dropout = 0.1\n", ["unknown key 'dropout'"]),
    (GOOD.replace("d_ff = 16", "d_ff = 16.5"), ["key 'd_ff' must be int"]),
    (GOOD.replace("d_ff = 16", 'd_ff = "16"'), ["key 'd_ff' must be int"]),
    (GOOD.replace("d_ff = 16\n", ""), ["missing key 'd_ff'"]),
    (GOOD.replace("num_heads = 2", "num_heads = 3"), ["not divisible by num_heads=3"]),
    (GOOD.replace("num_layers = 2", "num_layers = 0"), ["num_layers must be positive"]),
    (GOOD + "tie_embeddings = 1\n", ["key 'tie_embeddings' must be bool"]),
    # each key's type is the dataclass annotation (``| None`` dropped); a tuple field is no key
    (GOOD + 'rope_theta = "big"\n', ["key 'rope_theta' must be float"]),
    (GOOD + "num_kv_heads = 1.5\n", ["key 'num_kv_heads' must be int"]),
    (GOOD + "norm = 3\n", ["key 'norm' must be str"]),
    (GOOD + "hf_model_type = 3\n", ["key 'hf_model_type' must be str"]),
    (GOOD + "ignored_fields = []\n", ["unknown key 'ignored_fields'"]),
]


@pytest.mark.parametrize("text,needles", BAD_FILES)
def test_bad_file_names_file_and_key(run_cli, tmp_path, text, needles):
    path = write(tmp_path, text)
    r = run_cli(path)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1
    assert str(path) in r.err
    for needle in needles:
        assert needle in r.err


def test_no_traceback_from_real_process(tmp_path):
    path = write(tmp_path, "vocab_size = [\n")
    proc = subprocess.run(
        [sys.executable, "-m", "lm_accounting", str(path)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and str(path) in proc.stderr


def test_analytic_path_imports_no_heavy_library():
    code = (
        "import sys, io, contextlib\n"
        "from lm_accounting.cli import main\n"
        "buf = io.StringIO()\n"
        "for args in (['gpt2-xl', '--context', '16384'], ['gpt2-xl', '--format', 'json'], ['presets']):\n"
        "    with contextlib.redirect_stdout(buf):\n"
        "        try: main(args)\n"
        "        except SystemExit as e: assert e.code == 0, e.code\n"
        "heavy = [m for m in ('torch', 'matplotlib', 'pandas', 'numpy', 'fvcore') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == ""


def test_reading_a_config_loads_no_step_replay():
    """``lm-account <model>`` (the account command) imports neither the step replay nor the memory report: they
    load on first use (``lm_accounting.__getattr__``), which keeps reading a config.json under 0.2 s CPU."""
    code = (
        "import sys, io, contextlib\n"
        "from lm_accounting.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try: main(['gpt2-xl'])\n"
        "    except SystemExit as e: assert e.code == 0, e.code\n"
        "names = ('replay', 'memory_report', 'capacity', 'program_report')\n"
        "print(','.join(m for m in names if 'lm_accounting.analytic.' + m in sys.modules))\n"
        "import lm_accounting\n"
        "print(lm_accounting.memory_account.__module__, lm_accounting.predict_training_step.__module__)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.split() == ["lm_accounting.analytic.memory_report", "lm_accounting.analytic.replay"]


def test_help_is_useful(run_cli):
    r = run_cli("--help")
    assert r.code == 0 and "presets" in r.out and "gpt2-xl --context 16384" in r.out
    r = run_cli("account", "--help")
    assert "--context" in r.out and "--set" in r.out and "--format" in r.out


def test_binary_and_directory_paths(run_cli, tmp_path):
    binary = tmp_path / "b.toml"
    binary.write_bytes(b"\xff\xfe\x00")
    r = run_cli(binary)
    assert r.code == 2 and "not a UTF-8 text file" in r.err
    r = run_cli(tmp_path)
    assert r.code == 2 and "is a directory" in r.err


@pytest.mark.parametrize(
    "args,needle",
    [
        (["gpt2-xl", "--context", str(10**160)], "beyond the supported 10^18"),
        (["gpt2-xl", "--set", f"d_model={10**19}"], "beyond the supported 10^18"),
        (["train-time", "gpt2-xl", "--steps", str(10**300)], "beyond the supported 10^18"),
        (["gpt2-xl", "--set", "rope_theta=inf"], "positive finite number"),
        (["gpt2-xl", "--set", "norm_eps=nan"], "positive finite number"),
        (["train-time", "gpt2-xl", "--peak-flops", "1e-300"], "finite number in [1, 1e+20]"),
        (["train-time", "gpt2-xl", "--peak-flops", "inf"], "finite number in [1, 1e+20]"),
        (["train-time", "gpt2-xl", "--efficiency", "nan"], "--efficiency must be in (0, 1.5], got nan"),
        (["train-time", "gpt2-xl", "--gpu", "a10"], "unknown GPU 'a10'; did you mean 'a100'?"),
        (["sweep", "gpt2-small", "gpt2-small", "--contexts", "256"], "two models are named 'gpt2-small'"),
        (["sweep", "gpt2-small", "--contexts", "1:100000000:+1"], "more than 1,000 contexts"),
    ],
)
def test_absurd_input_is_refused_on_one_line(run_cli, tmp_path, args, needle):
    r = run_cli(*args, *(["--out", tmp_path] if args[0] == "sweep" else []))
    assert r.code == 2 and needle in r.err and len(r.err.strip().splitlines()) == 1


def test_unwritable_output_directory(run_cli, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = run_cli("sweep", "gpt2-small", "--contexts", "256", "--no-plots", "--out", blocker / "sub")
    assert r.code == 2 and "cannot write" in r.err and str(blocker) in r.err


def test_largest_supported_context_stays_exact(run_cli):
    data = json.loads(run_cli("gpt2-xl", "--context", 10**18, "--format", "json").out)
    S, d, L, V = 10**18, 1600, 48, 50257
    per_layer = 8 * S * d * d + 4 * S * S * d + 6 * S * d * 6400
    assert data["forward_flops"]["total"] == L * per_layer + 2 * S * d * V


def test_gpu_names_are_case_insensitive_with_aliases(run_cli):
    a = json.loads(run_cli("train-time", "gpt2-xl", "--gpu", "A100", "--format", "json").out)
    h = json.loads(run_cli("train-time", "gpt2-xl", "--gpu", "H100", "--gpu-dtype", "bf16", "--format", "json").out)
    assert a["peak_flops"] == 19.5e12 and h["peak_flops"] == 989.4e12


def test_overridden_config_is_labelled(run_cli):
    r = run_cli("gpt2-xl", "--layers", 126)
    assert r.out.startswith("gpt2-xl (modified: num_layers=126):")


def test_verbose_lists_the_ignored_config_json_fields(run_cli, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(
        '{"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,'
        ' "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,'
        ' "max_position_embeddings": 8192, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,'
        ' "tie_word_embeddings": false, "attention_dropout": 0.0, "bos_token_id": 128000}'
    )
    r = run_cli(path, "--verbose")
    assert r.code == 0 and "8,030,261,248" in r.out  # Llama-3-8B's published count
    assert "ignored config fields" in r.err and "attention_dropout" in r.err and "bos_token_id" in r.err
    assert "ignored" not in run_cli(path).err


@pytest.mark.parametrize(
    "text,value",
    [("1e12", 10**12), ("15E12", 15 * 10**12), ("1.5e3", 1_500), ("2.50e2", 250), ("+1e1", 10), ("1_024", 1_024)],
)
def test_counts_take_exact_scientific_notation(text, value):
    from lm_accounting.cli import POSITIVE

    assert POSITIVE.convert(text, None, None) == value


@pytest.mark.parametrize("text", ["1.25e1", "1e99", "1e999", "1e-3", "1.5", "e12", "nan", "inf"])
def test_counts_refuse_what_is_not_a_whole_number_in_range(text):
    import click

    from lm_accounting.cli import POSITIVE

    with pytest.raises(click.BadParameter):
        POSITIVE.convert(text, None, None)


def test_plan_takes_tokens_as_1e12(run_cli):
    r = run_cli("plan", "llama-3-8b", "--gpus", "8..16", "--context", "8192", "--tokens", "1e12", "--top", "1")
    assert r.code == 0, r.err
    assert "1,000,000,000,000 tokens" in r.out


@pytest.mark.slow
def test_plan_and_sweep_take_the_model_overrides(run_cli, tmp_path):
    """README promises --set and the shape flags on every command that takes a model: plan and sweep
    lacked them.  The override reaches the numbers: plan names the modified model and answers
    differently, and gpt2-small's sweep at 2 layers reports the 2-layer parameter count, by hand."""
    import json

    full = json.loads(run_cli("plan", "llama-3-8b", "--tokens", "1e12", "--format", "json").out)
    cut = json.loads(run_cli("plan", "llama-3-8b", "--tokens", "1e12", "--layers", "16", "--format", "json").out)
    assert "num_layers=16" in cut["model"]
    out = tmp_path / "s"
    r = run_cli("sweep", "gpt2-small", "--set", "num_layers=2", "--contexts", "128", "--no-plots", "--out", str(out))
    assert r.code == 0, r.err
    rows = json.loads((out / "sweep.json").read_text())
    rows = rows["rows"] if isinstance(rows, dict) else rows
    d, v, f = 768, 50_257, 3_072  # gpt2-small as the course model: untied embedding and head, SwiGLU
    block = 4 * d * d + 3 * d * f + 2 * d
    assert rows[0]["params"] == 2 * v * d + 2 * block + d
    assert full != cut


@pytest.mark.parametrize("word", ["nosuch", "foo", "my-model", "mymodel"])
def test_an_unknown_model_name_is_not_called_a_command(run_cli, word):
    """`lm-account nosuch` suggested the `crosscheck` command (difflib over commands and presets at
    cutoff 0.5).  A command is suggested only for a near miss of one (ratio >= 0.7); otherwise the close
    presets, the preset list and how to pass one's own config.json."""
    from lm_accounting.cli import COMMAND_CUTOFF, cli

    err = run_cli(word).err
    near = [c for c in cli.commands if difflib.SequenceMatcher(None, word, c).ratio() >= COMMAND_CUTOFF]
    assert not near and "(a command)" not in err and "did you mean 'crosscheck'" not in err
    assert "a path to its Hugging Face config.json or a .toml file, e.g. ./config.json" in err


def test_a_near_miss_of_a_command_still_names_it(run_cli):
    assert "did you mean 'infer' (a command)?" in run_cli("infr").err
    assert "did you mean 'account' (a command)?" in run_cli("acount").err
