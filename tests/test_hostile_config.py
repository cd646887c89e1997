"""Hostile input to config reading (issue 25, part 9): each class gets one line and exit 2, or the right answer,
with the work bounded by counts (never by seconds).

* a number past the float range (310+ digits) in a TOML float key or a nested config.json field;
* a config.json ``layer_types`` list checked in one pass (it was quadratic: a 1 MB file took minutes);
* a folder or file name with a control character (a tab) is a good config, labelled without it;
* a local file named like a preset (``./gpt2-xl.toml``) is labelled as the file, not as the preset.
"""

import json
import sys

import pytest

from lm_accounting import hf_config
from lm_accounting.config import ConfigError, load_config
from lm_accounting.hf_config import config_from_hf

HUGE = int("1" + "0" * 400)  # 401 digits: float() raises OverflowError
SMALL_LLAMA = {
    "model_type": "llama",
    "vocab_size": 1000,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "max_position_embeddings": 128,
}
PRESET_TOML = """vocab_size = 50257
context_length = 1024
num_layers = 48
d_model = 1600
num_heads = 25
d_ff = 6400
rope_theta = 10000.0
norm_eps = 1e-5
tie_embeddings = false
"""


def one_line_exit_2(run_cli, *args, message):
    for command in ("account", "memory"):
        r = run_cli(command, *args)
        lines = r.err.strip().splitlines()
        assert r.code == 2 and len(lines) == 1 and lines[0].startswith("lm-account: error: "), (command, r.err)
        assert message in lines[0] and "Traceback" not in r.err, (command, r.err)


@pytest.mark.parametrize("key", ["rope_theta", "norm_eps"])
def test_toml_float_past_the_float_range(run_cli, tmp_path, key):
    text = PRESET_TOML.replace(f"{key} = ", f"{key} = {HUGE}\n# was ")
    path = tmp_path / "big.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"key '{key}' must be a positive finite number, got 1000…"):
        load_config(path)
    one_line_exit_2(run_cli, path, message=f"key '{key}' must be a positive finite number, got 1000…(401 digits)")


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"rope_parameters": {"rope_theta": HUGE}}, "rope_parameters.rope_theta"),
        ({"rope_parameters": {"full_attention": {"rope_theta": HUGE}}}, "rope_parameters.full_attention.rope_theta"),
        ({"rope_theta": HUGE}, "rope_theta"),
        ({"rms_norm_eps": HUGE}, "rms_norm_eps"),
        ({"rope_parameters": {"rope_theta": -HUGE}}, "rope_parameters.rope_theta"),
    ],
)
def test_config_json_numbers_past_the_float_range(run_cli, tmp_path, extra, field):
    data = {**SMALL_LLAMA, **extra}
    with pytest.raises(ConfigError, match=f"field '{field}' must be a positive finite number"):
        config_from_hf(data)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    one_line_exit_2(run_cli, path, message=f"field '{field}' must be a positive finite number")


def line_events(data: dict) -> tuple[int, object]:
    """Lines of hf_config executed while reading ``data``: the work, counted (not timed)."""
    events = 0
    source = hf_config.__file__

    def local(frame, event, arg):
        nonlocal events
        events += event == "line"
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code.co_filename == source else None

    sys.settrace(tracer)
    try:
        result = config_from_hf(data)
    except ConfigError as err:
        result = err
    finally:
        sys.settrace(None)
    return events, result


def gemma2(layer_types: list[str]) -> dict:
    return {**SMALL_LLAMA, "model_type": "gemma2", "num_hidden_layers": len(layer_types), "sliding_window": 16,
            "layer_types": layer_types}  # fmt: skip


def test_layer_types_check_is_linear():
    """The worst cases of the old check, which tried every n up to the layer count (n² steps): only the last
    layer full (n = L), and a list no n explains.  Now a few lines per layer, whatever the list."""
    for n in (1_000, 2_000):
        last_full = ["sliding_attention"] * (n - 1) + ["full_attention"]
        events, cfg = line_events(gemma2(last_full))
        assert cfg.full_attention_every == n and cfg.windowed_layers == n - 1
        assert events <= 5 * n + 1_000, (n, events)  # the quadratic check took about 4 n² lines
        broken = ["sliding_attention", "full_attention"] * (n // 2)
        broken[-1] = "sliding_attention"
        events, err = line_events(gemma2(broken))
        assert isinstance(err, ConfigError) and "'layer_types' is not understood" in str(err)
        assert events <= 5 * n + 1_000, (n, events)


def test_a_one_megabyte_layer_types_file_is_answered_in_one_line(run_cli, tmp_path):
    n = 45_000  # about 0.9 MB of layer_types
    types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(gemma2(types)))
    assert 800_000 < path.stat().st_size <= 1 << 20
    one_line_exit_2(run_cli, path, message="num_layers = 45,000 is beyond the supported 10,000")
    types[-1] = "sliding_attention"  # the last layer breaks the every-2nd rule
    path.write_text(json.dumps(gemma2(types)))
    one_line_exit_2(run_cli, path, message="field 'layer_types' is not understood")


def test_a_tab_in_a_folder_or_file_name_is_a_good_config(run_cli, tmp_path):
    folder = tmp_path / "my\tmodel"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(SMALL_LLAMA))
    toml = tmp_path / "tab\there.toml"
    toml.write_text(PRESET_TOML)
    long = tmp_path / ("x" * 250 + ".toml")  # a legal file name longer than a model name may be
    long.write_text(PRESET_TOML)
    for path, name in ((folder / "config.json", "my model"), (toml, "tab here"), (long, "x" * 200)):
        assert load_config(path).name == name
        r = run_cli("account", path, "--format", "json")
        assert r.code == 0, r.err
        assert json.loads(r.out)["config"]["name"] == name
    assert load_config(folder / "config.json").name == "my model"


def test_a_local_file_named_like_a_preset_is_labelled_as_the_file(run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpt2-xl.toml").write_text(PRESET_TOML.replace("num_layers = 48", "num_layers = 2"))
    (tmp_path / "gpt2-xl").mkdir()
    (tmp_path / "gpt2-xl" / "config.json").write_text(json.dumps(SMALL_LLAMA))
    assert load_config("gpt2-xl").name == "gpt2-xl"  # the preset itself
    assert load_config("./gpt2-xl.toml").name == "gpt2-xl.toml"
    assert load_config("gpt2-xl/config.json").name == "gpt2-xl/config.json"
    for command in ("account", "memory"):
        r = run_cli(command, "./gpt2-xl.toml")
        assert r.code == 0, r.err
        assert r.out.lstrip().startswith("gpt2-xl.toml:"), r.out[:200]
    r = run_cli("account", "./gpt2-xl.toml", "--format", "json")
    assert json.loads(r.out)["config"]["name"] == "gpt2-xl.toml" and json.loads(r.out)["config"]["num_layers"] == 2
