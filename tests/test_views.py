"""One result type per command, rendered by one view layer: JSON (schema id, strict, key sets pinned
by a snapshot), CSV (tidy records), terminal tables fitted to a width, and the CLI conventions
(completion, --version, did-you-mean, help lines)."""

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lm_accounting.account import account
from lm_accounting.config import load_config
from lm_accounting.views import render

SNAPSHOT = Path(__file__).parent / "snapshots" / "json_keys.json"
COMMANDS = {  # name -> CLI arguments (analytic and fast; memory and crosscheck have their own tests)
    "account": ["qwen3-0.6b", "--context", "2048"],
    "presets": ["presets"],
    "train-time": ["train-time", "gpt2-small"],
    "train-time-calibrated": ["train-time", "gpt2-small", "-S", "256", "--gpu", "h100-sxm"],
    "infer": ["infer", "llama-3-8b", "--prompt", "128", "--generate", "16"],
    "infer-vllm": ["infer", "llama-3-8b", "--prompt", "128", "--generate", "16", "--engine", "vllm"],
    "infer-sglang": [
        "infer",
        "llama-3-8b",
        "-P",
        "128",
        "-G",
        "16",
        "--engine",
        "sglang",
        "--mem-fraction-static",
        "0.85",
    ],
}


def key_paths(value, prefix=""):
    """Every key path of a JSON document; list items are merged under '[]', component keys under '{}'."""
    paths = set()
    if isinstance(value, dict):
        for k, v in value.items():
            name = "{}" if prefix.endswith(("groups", "weight_bytes", "kv_cache_bytes", "skipped_ops")) else k
            paths.add(f"{prefix}.{name}")
            paths |= key_paths(v, f"{prefix}.{name}")
    elif isinstance(value, list):
        for item in value:
            paths |= key_paths(item, f"{prefix}[]")
    return paths


def cli_json(run_cli, args):
    r = run_cli(*args, "--format", "json")
    assert r.code == 0, r.err
    return json.loads(r.out, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))


@pytest.mark.parametrize("command", COMMANDS)
def test_json_has_a_schema_and_the_pinned_key_set(run_cli, command):
    data = cli_json(run_cli, COMMANDS[command])
    assert data["schema"].startswith("lm-accounting/") and data["schema"].rsplit("/", 1)[1].isdigit()
    pinned = json.loads(SNAPSHOT.read_text())[command]
    got = sorted(key_paths(data))
    assert got == pinned, f"the JSON key set of '{command}' changed: bump its schema id and update {SNAPSHOT.name}"


@pytest.mark.parametrize("command", COMMANDS)
def test_csv_is_tidy_records(run_cli, command):
    r = run_cli(*COMMANDS[command], "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(r.out)))
    assert len(rows) > 3
    header = r.out.splitlines()[0].split(",")
    assert all(len(row) == len(header) and None not in row for row in rows)  # every row has every column


def test_json_never_writes_nan_or_infinity():
    from lm_accounting.config import AccountingError
    from lm_accounting.views import to_json

    assert to_json({"x": 1.5}) == '{\n  "x": 1.5\n}'
    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(ValueError):
            to_json({"x": bad})
    with pytest.raises(AccountingError):
        render(account(load_config("gpt2-small")), "xml")


def test_account_csv_sums_to_the_reference_totals(run_cli):
    rows = list(csv.DictReader(io.StringIO(run_cli("gpt2-xl", "--format", "csv").out)))
    fwd = sum(int(r["total"]) for r in rows if r["section"] == "forward_flops")
    assert fwd == 4_513_336_524_800  # the course's GPT-2 XL forward FLOPs at 1,024 tokens


@pytest.mark.parametrize("width", [60, 80, 120])
def test_terminal_tables_fit_the_width(width):
    text = render(account(load_config("llama-3-8b")), "table", width=width)
    assert max(len(line) for line in text.splitlines()) <= width
    assert "8,030,261,248" in text  # numbers never wrap


def test_piped_tables_do_not_wrap():
    text = render(account(load_config("llama-3-8b")), "table")
    line = next(line for line in text.splitlines() if line.startswith("layers.*.attn.output_proj"))
    assert line.split()[-2:] == ["536,870,912", "6.69%"]  # 32 · 4096 · 4096 and its share, on one line


def test_api_has_one_source_for_the_sequence_length():
    cfg = load_config("gpt2-xl")
    a, b = account(cfg, seq=16384).to_dict(), account(cfg.with_context(16384)).to_dict()
    assert a.pop("preset_context") == 1024 and b.pop("preset_context") == 16384
    assert a == b
    assert a["forward_flops"]["total"] == 149_522_795_724_800


def test_version_and_help_lines(run_cli):
    r = run_cli("--version")
    assert r.code == 0 and r.out.startswith("lm-account, version ")
    help_text = run_cli("--help").out
    for command in ("account", "crosscheck", "memory", "train-time", "sweep", "report", "presets"):
        line = next(line for line in help_text.splitlines() if line.strip().startswith(command + " "))
        assert len(line.split(None, 1)[1]) > 20, f"{command} has no short help"


def complete(shell_var: str, words: str, cword: str) -> str:
    env = {**os.environ, "_LM_ACCOUNT_COMPLETE": shell_var, "COMP_WORDS": words, "COMP_CWORD": cword}
    proc = subprocess.run(
        [sys.executable, "-m", "lm_accounting"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_shell_completion_scripts_and_answers(shell):
    script = complete(f"{shell}_source", "", "")
    assert "_LM_ACCOUNT_COMPLETE" in script  # the source script, not the empty-argv help page
    cword = "gpt" if shell == "fish" else "1"
    answer = complete(f"{shell}_complete", "lm-account gpt", cword)
    assert "gpt2-xl" in answer and "Usage" not in answer
    answer = complete(f"{shell}_complete", "lm-account mem", "mem" if shell == "fish" else "1")
    assert "memory" in answer


def test_list_fields_are_one_semicolon_joined_csv_cell(run_cli, tmp_path):
    """A list-valued field is one CSV cell, its items joined by ';' (items may hold commas), never a
    Python list literal; JSON keeps the list."""
    from lm_accounting.analytic.memory_report import memory_account
    from lm_accounting.catalog import PresetList
    from lm_accounting.config import ModelConfig

    rows = list(csv.DictReader(io.StringIO(run_cli("presets", "--format", "csv").out)))
    assert rows and {r["ignored_fields"] for r in rows} == {""}  # TOML presets ignore nothing: empty, not "[]"
    path = tmp_path / "config.json"
    path.write_text(
        '{"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,'
        ' "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 64,'
        ' "attention_dropout": 0.0, "bos_token_id": 1}'
    )
    listed = PresetList(((load_config(str(path)), 0, 0),))
    (row,) = csv.DictReader(io.StringIO(render(listed, "csv")))
    assert row["ignored_fields"] == "attention_dropout;bos_token_id"
    assert json.loads(render(listed, "json"))["presets"][0]["ignored_fields"] == ["attention_dropout", "bos_token_id"]
    # memory's not_modelled: two options
    cfg = ModelConfig(
        vocab_size=64, context_length=64, num_layers=2, d_model=32, num_heads=4, d_ff=64, norm="layernorm",
        mlp_bias=True,
    )  # fmt: skip
    rows = list(csv.DictReader(io.StringIO(render(memory_account(cfg, 7, 1), "csv"))))
    (cell,) = [r["predicted"] for r in rows if r["key"] == "not_modelled"]
    assert cell.split(";") == ["LayerNorm", "output or MLP biases"]


def test_each_table_keeps_its_own_notes():
    """Blocks that differ (one dense block, then two mixture-of-experts blocks) give each breakdown table
    the 'per layer' note; the table's own notes (weights, groups, the non-matmul convention) come beside
    it, never in its place.  Uniform blocks (gpt2-small) have no such note."""
    from lm_accounting.config import ModelConfig
    from lm_accounting.views import view_of

    mixed = ModelConfig(
        vocab_size=64, context_length=64, num_layers=3, d_model=32, num_heads=4, d_ff=64,
        num_experts=4, experts_per_token=2, expert_d_ff=16, dense_layers_first=1,
    )  # fmt: skip
    for cfg, differ in ((mixed, True), (load_config("gpt2-small"), False)):
        tables = view_of(account(cfg)).tables[:3]
        assert [t.title.split()[0] for t in tables] == ["Parameters", "Forward", "Non-matmul"]
        for table, own in zip(tables, ("weights:", "by group:", "convention:"), strict=True):
            assert any(n.startswith(own) for n in table.notes), table.title
            assert any(n.startswith("per layer:") for n in table.notes) is differ, table.title
    assert render(account(mixed), "table").count("per layer: the value in each block") == 3


@pytest.mark.parametrize(
    ("zero", "note"),
    [
        (0, "none: DDP, no FSDP2"),
        (1, "none: ZeRO-1, no FSDP2"),
        (2, "held forward→backward (zero 2)"),
        (3, "not held: zero 3 reshards each unit after its forward"),
    ],
)
def test_the_layout_views_unsharded_row_says_what_each_zero_stage_holds(run_cli, zero, note):
    """The 'FSDP2: every unit unsharded' row was labelled 'held forward→backward under zero 2' on every
    layout, a ZeRO-3 rank (which reshards) and DDP (no FSDP2, 0 B) included."""
    r = run_cli("memory", "llama-3-8b", "-S", "2048", "--dp", "8", "--zero", zero, "--precision", "amp-bf16")
    assert r.code == 0, r.err
    (row,) = [line for line in r.out.splitlines() if line.startswith("FSDP2: every unit unsharded")]
    assert row.endswith(note) or note in row
    assert ("held forward→backward" in row) == (zero == 2)
    if zero < 2:
        assert " 0 B " in row


def test_a_pipeline_alone_layout_does_not_call_itself_ddp(run_cli):
    """Pipeline parallel alone has one data-parallel rank: no DDP buckets and no FSDP2 units, and the
    parameters are the stage's share (the rows used to read 'none: DDP, no FSDP2' and 'TP-local')."""
    r = run_cli("memory", "gpt2-small", "--context", "128", "--pp", "2")
    assert r.code == 0, r.err
    rows = {line.split("  ")[0]: line for line in r.out.splitlines()}
    for name in ("DDP gradient buckets", "FSDP2: every unit unsharded", "FSDP2: largest unit unsharded"):
        assert rows[name].endswith("none: one data-parallel rank"), rows[name]
    assert rows["parameters"].endswith("this stage's share, whole")
